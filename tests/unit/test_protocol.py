"""The wire contract: jobs and events round-trip as JSON, and unknown versions are refused."""

from __future__ import annotations

import json

import pytest

from shared.codec import (
    CodecError,
    decode_event,
    decode_job,
    deserialize_arq_job,
    encode_event,
    encode_job,
    serialize_arq_job,
)
from shared.errors import ContextLengthExceeded, ErrorInfo, ModelNotFound, error_from_info
from shared.protocol import (
    Accepted,
    ChatMessage,
    ChatPrompt,
    Delta,
    Failed,
    Finished,
    FinishReason,
    GenerationJob,
    SamplingSpec,
    TokenPrompt,
    Usage,
)


def _job() -> GenerationJob:
    return GenerationJob(
        request_id="abc",
        model="m",
        prompt=ChatPrompt(messages=[ChatMessage(role="user", content="Hi ☕")]),
        sampling=SamplingSpec(temperature=0.5, stop=["x"]),
        created_at=1.0,
    )


def test_job_round_trips_through_arq_serializer_as_json() -> None:
    raw = serialize_arq_job({"t": 1, "f": "generate", "a": [encode_job(_job())], "k": {}, "et": 5})
    assert json.loads(raw)["a"][0]["prompt"]["kind"] == "chat"  # plain JSON, never pickle
    assert decode_job(deserialize_arq_job(raw)["a"][0]) == _job()


def test_token_prompt_round_trips() -> None:
    job = _job().model_copy(update={"prompt": TokenPrompt(token_ids=[1, 2])})
    assert decode_job(encode_job(job)).prompt == TokenPrompt(token_ids=[1, 2])


@pytest.mark.parametrize(
    "event",
    [
        Accepted(prompt_tokens=3, worker_id="w"),
        Delta(text="é", token_ids=[195, 169]),
        Finished(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=1, completion_tokens=2)),
        Failed(error=ContextLengthExceeded("too long", param="messages").to_info()),
    ],
)
def test_events_round_trip(event: object) -> None:
    assert decode_event(encode_event(event)) == event  # type: ignore[arg-type]


def test_a_newer_protocol_version_is_refused_clearly() -> None:
    payload = encode_job(_job()) | {"v": 99}
    with pytest.raises(CodecError, match="protocol version 99"):
        decode_job(payload)


def test_unknown_fields_in_jobs_are_refused() -> None:
    with pytest.raises(CodecError):
        decode_job(encode_job(_job()) | {"surprise": 1})


def test_arq_payload_must_be_an_object() -> None:
    with pytest.raises(CodecError):
        deserialize_arq_job(b"[1]")


def test_error_info_round_trips_to_the_same_error_class() -> None:
    error = error_from_info(ContextLengthExceeded("too long", param="messages").to_info())
    assert isinstance(error, ContextLengthExceeded)
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
    assert isinstance(error_from_info(ModelNotFound("m").to_info()), ModelNotFound)


def test_unknown_error_info_keeps_its_status_and_code() -> None:
    error = error_from_info(ErrorInfo(message="m", type="new_type", code="new_code", status=418))
    assert (error.status, error.type, error.code) == (418, "new_type", "new_code")


def test_arq_job_start_line_does_not_log_prompt_text() -> None:
    import logging

    from worker.queue.jobs import RedactJobArguments

    record = logging.LogRecord(
        "arq.worker",
        logging.INFO,
        "",
        0,
        "%6.2fs → %s(%s)%s",
        (0.01, "abc:generate", "{'prompt': 'secret'}", ""),
        None,
    )
    RedactJobArguments().filter(record)
    assert "secret" not in record.getMessage()
    assert "abc:generate" in record.getMessage()
