"""Batches, files and background responses through the official openai SDK, against real processes.

A gateway and a fake-engine worker run as processes on a Redis of their own (so
no other test's gateway runner claims these batches). The fake engine answers
its script greedily, so every output line's text is known exactly. The kill
tests SIGKILL a worker or a gateway mid-batch and check that every line comes
back exactly once.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from openai.types import Batch
from openai.types.responses import Response
from redis import Redis

from shared import keys
from shared.redis_server import EmbeddedRedis, free_port
from shared.settings import WorkerSettings
from shared.supervisor import Child
from tests.processes import spawn_cli, stop_all, wait_for_model

MODEL = "batch-model"
SCRIPT = WorkerSettings.model_fields["fake_script"].default
MAX_TOKENS = 8
START_TIMEOUT_S = 60.0
BATCH_TIMEOUT_S = 90.0


@dataclass
class Stack:
    redis: EmbeddedRedis
    gateways: list[tuple[Child, str]] = field(default_factory=list)
    workers: list[Child] = field(default_factory=list)

    gateway_env: dict[str, str] = field(default_factory=dict)

    def add_gateway(self) -> str:
        port = free_port()
        process = spawn_cli(
            "gateway", "--redis-url", self.redis.url, "--port", str(port), "--log-level", "WARNING",
            env=self.gateway_env,
        )  # fmt: skip
        self.gateways.append((process, f"http://127.0.0.1:{port}"))
        return f"http://127.0.0.1:{port}"

    def add_worker(self, step_delay_s: float) -> Child:
        process = spawn_cli(
            "worker", "--redis-url", self.redis.url, "--engine", "fake", "--model", MODEL,
            "--poll-delay", "0.01", "--log-level", "WARNING",
            # 32 rows (24 for the batch lane): a batch of 30-40 lines then runs in waves, long
            # enough for the tests to kill, restart or cancel something mid-batch.
            "--max-batch-size", "32",
            env={"TOKENFERRY_FAKE_STEP_DELAY_S": str(step_delay_s)},
        )  # fmt: skip
        self.workers.append(process)
        return process

    def processes(self) -> list[Child]:
        return [*self.workers, *(process for process, _ in self.gateways)]

    def wait_ready(self) -> None:
        alive = [process for process in self.processes() if process.returncode is None]
        for process, url in self.gateways:
            if process.returncode is None:
                wait_for_model(url, alive, MODEL, START_TIMEOUT_S)

    def client(self, index: int = 0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateways[index][1]}/v1", api_key="unused", max_retries=0)

    def stop(self) -> None:
        stop_all(self.processes(), timeout_s=10)


@pytest.fixture
def stack_factory() -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []
    with EmbeddedRedis(append_only=True) as redis:

        def build(
            *,
            gateways: int = 1,
            workers: int = 1,
            step_delay_s: float = 0.0,
            gateway_env: dict[str, str] | None = None,
        ) -> Stack:
            stack = Stack(redis, gateway_env=gateway_env or {})
            stacks.append(stack)
            for _ in range(gateways):
                stack.add_gateway()
            for _ in range(workers):
                stack.add_worker(step_delay_s)
            stack.wait_ready()
            return stack

        try:
            yield build
        finally:
            for stack in stacks:
                stack.stop()


def chat_line(custom_id: str, content: str = "Hi", **body: object) -> dict[str, object]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": MAX_TOKENS,
            **body,
        },
    }


def upload(client: openai.OpenAI, tmp_path: Path, lines: list[dict[str, object]] | list[str]) -> str:
    path = tmp_path / "input.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    with path.open("rb") as handle:
        return client.files.create(file=handle, purpose="batch").id


def wait_for(
    client: openai.OpenAI, batch_id: str, statuses: set[str], timeout_s: float = BATCH_TIMEOUT_S
) -> Batch:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} stayed {batch.status} ({batch.request_counts})")


def wait_for_progress(client: openai.OpenAI, batch_id: str, timeout_s: float = BATCH_TIMEOUT_S) -> Batch:
    """Waits until some lines of a running batch have finished (on a busy machine, the first take a while)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.request_counts is not None and batch.request_counts.completed > 0:
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} finished no line ({batch.request_counts})")


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, object]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def expected_text() -> str:
    return SCRIPT.encode()[:MAX_TOKENS].decode()


def test_batch_runs_every_line_and_writes_openai_output_lines(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = stack_factory()
    client = stack.client()
    file_id = upload(
        client, tmp_path, [chat_line(f"line-{index}", f"Question {index}") for index in range(20)]
    )
    assert client.files.retrieve(file_id).purpose == "batch"
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "one"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "one"}

    done = wait_for(client, batch.id, {"completed", "failed"})

    assert done.status == "completed", done.errors
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        20,
        20,
        0,
    )
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
    lines = output_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"line-{index}" for index in range(20))
    for line in lines:
        assert line["error"] is None and str(line["id"]).startswith("batch_req_")
        response = line["response"]
        assert isinstance(response, dict) and response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["message"]["content"] == expected_text()
        assert body["usage"]["completion_tokens"] == MAX_TOKENS
    assert done.id in [item.id for item in client.batches.list(limit=10).data]


def test_completions_batch_and_a_line_that_fails_goes_to_the_error_file(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = stack_factory()
    client = stack.client()
    good = {
        "custom_id": "ok",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": "Hello", "max_tokens": 4},
    }
    # Longer than the worker's context window: only the worker can tell, so the line fails, not the file.
    too_long = {
        **good,
        "custom_id": "too-long",
        "body": {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 4},
    }
    file_id = upload(client, tmp_path, [good, too_long])
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")

    done = wait_for(client, batch.id, {"completed", "failed"})

    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    [ok] = output_lines(client, done.output_file_id)
    assert (
        ok["custom_id"] == "ok"
        and ok["response"]["body"]["choices"][0]["text"] == SCRIPT.encode()[:4].decode()
    )  # type: ignore[index]
    [failed] = output_lines(client, done.error_file_id)
    assert failed["custom_id"] == "too-long"
    assert failed["response"]["status_code"] == 400  # type: ignore[index]
    assert failed["response"]["body"]["error"]["code"] == "context_length_exceeded"  # type: ignore[index]


def test_malformed_file_fails_the_batch_naming_each_bad_line(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    client = stack_factory().client()
    lines = [
        json.dumps(chat_line("a")),
        "{not json",
        json.dumps(chat_line("a")),  # duplicate custom_id
        json.dumps({**chat_line("b"), "method": "GET"}),
        json.dumps({**chat_line("c"), "url": "/v1/embeddings"}),
        json.dumps(chat_line("d", temperature=7)),
    ]
    file_id = upload(client, tmp_path, lines)
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    failed = wait_for(client, batch.id, {"failed", "completed"})

    assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
    assert failed.errors is not None and failed.errors.data is not None
    by_line = {error.line: error for error in failed.errors.data}
    assert sorted(by_line) == [2, 3, 4, 5, 6]
    assert "custom_id" in (by_line[3].message or "")
    assert by_line[6].param == "body.temperature"


def test_unknown_file_and_other_tenants_ids_are_404(stack_factory: Callable[..., Stack]) -> None:
    client = stack_factory().client()
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")


def test_cancel_mid_batch_keeps_finished_lines_and_stops_the_rest(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = stack_factory(step_delay_s=0.05)
    client = stack.client()
    lines = [chat_line(f"line-{index}", max_tokens=40, ignore_eos=True) for index in range(30)]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id, {"in_progress"})
    time.sleep(1.0)

    cancelling = client.batches.cancel(batch.id)
    cancelled = wait_for(client, batch.id, {"cancelled"})

    assert cancelling.status in ("cancelling", "cancelled")
    assert cancelled.cancelling_at and cancelled.cancelled_at
    finished = output_lines(client, cancelled.output_file_id)
    assert len(finished) == cancelled.request_counts.completed < 30
    assert all(line["response"]["status_code"] == 200 for line in finished)  # type: ignore[index]


def test_worker_and_gateway_killed_mid_batch_lose_and_duplicate_no_line(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    LINES = 60  # ~6 s of work: enough to kill processes half-way
    stack = stack_factory(workers=2, step_delay_s=0.03)
    client = stack.client(0)
    lines = [chat_line(f"line-{index}", max_tokens=60, ignore_eos=True) for index in range(LINES)]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id, {"in_progress"})
    stack.add_gateway()  # started after the first gateway's runner claimed the batch
    stack.wait_ready()
    half_way = wait_for_progress(client, batch.id)
    assert half_way.status == "in_progress" and half_way.request_counts.completed < LINES  # type: ignore[union-attr]

    stack.workers[0].send_signal(signal.SIGKILL)
    stack.gateways[0][0].send_signal(signal.SIGKILL)  # the runner's gateway: the other must take over
    survivor = stack.client(1)
    done = wait_for(survivor, batch.id, {"completed", "failed"}, timeout_s=120)

    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    custom_ids = [line["custom_id"] for line in output_lines(survivor, done.output_file_id)]
    assert sorted(custom_ids) == sorted(f"line-{index}" for index in range(LINES))


def test_redis_restarted_mid_batch_loses_no_line_and_no_file(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    LINES = 40
    stack = stack_factory(step_delay_s=0.03)
    # Retries ride out the seconds Redis is down (the gateway answers 503 meanwhile).
    client = stack.client().with_options(max_retries=10)
    input_file_id = upload(
        client, tmp_path, [chat_line(f"line-{index}", max_tokens=30) for index in range(LINES)]
    )
    batch = client.batches.create(
        input_file_id=input_file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    half_way = wait_for_progress(client, batch.id)
    assert half_way.request_counts.completed < LINES  # type: ignore[union-attr]

    stack.redis.restart()  # append-only file on, as deploy/ runs it
    done = wait_for(client, batch.id, {"completed", "failed"}, timeout_s=120)

    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)  # type: ignore[union-attr]
    custom_ids = [line["custom_id"] for line in output_lines(client, done.output_file_id)]
    assert sorted(custom_ids) == sorted(f"line-{index}" for index in range(LINES))
    assert client.files.retrieve(input_file_id).filename == "input.jsonl"
    assert input_file_id in {file.id for file in client.files.list()}


def test_a_batch_past_its_completion_window_expires_keeping_what_finished(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    LINES = 30
    stack = stack_factory(step_delay_s=0.05)
    client = stack.client()
    lines = [chat_line(f"line-{index}", max_tokens=40, ignore_eos=True) for index in range(LINES)]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for_progress(client, batch.id)

    # As if the 24 hours had passed: the window's end is in the batch's record.
    redis = Redis.from_url(stack.redis.url)
    spec = json.loads(redis.hget(keys.batch(batch.id), "spec"))  # type: ignore[arg-type]
    redis.hset(keys.batch(batch.id), "spec", json.dumps({**spec, "expires_at": int(time.time()) - 1}))
    expired = wait_for(client, batch.id, {"expired"})

    assert expired.expired_at is not None
    counts = expired.request_counts
    assert counts is not None and counts.total == LINES and counts.completed + counts.failed == LINES
    finished = output_lines(client, expired.output_file_id)
    assert len(finished) == counts.completed < LINES
    assert all(line["response"]["status_code"] == 200 for line in finished)  # type: ignore[index]
    unfinished = output_lines(client, expired.error_file_id)
    assert len(unfinished) == counts.failed
    assert {line["error"]["code"] for line in unfinished} == {"batch_expired"}  # type: ignore[index]
    custom_ids = [line["custom_id"] for line in finished + unfinished]
    assert sorted(custom_ids) == sorted(f"line-{index}" for index in range(LINES))


def test_finished_batches_their_files_and_responses_expire_after_the_retention_time(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    RETENTION_S = 8
    stack = stack_factory(gateway_env={"TOKENFERRY_RESULT_RETENTION_S": str(RETENTION_S)})
    client = stack.client()
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, [chat_line("only")]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    response = client.responses.create(model=MODEL, input="Hi", max_output_tokens=MAX_TOKENS, background=True)
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    while client.responses.retrieve(response.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)  # kept at first
    done = wait_for(client, batch.id, {"completed"})
    assert done.output_file_id is not None and output_lines(client, done.output_file_id)  # kept at first
    output_file_id = done.output_file_id

    def gone() -> list[bool]:
        fetches = [
            lambda: client.batches.retrieve(batch.id),
            lambda: client.files.retrieve(output_file_id),
            lambda: client.responses.retrieve(response.id),
        ]
        found = []
        for fetch in fetches:
            try:
                fetch()
                found.append(False)
            except openai.NotFoundError:
                found.append(True)
        return found

    deadline = time.monotonic() + RETENTION_S + 30
    while not all(gone()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert gone() == [True, True, True]  # the batch, its output file, the response


def test_background_response_is_queued_then_polled_to_completion(stack_factory: Callable[..., Stack]) -> None:
    client = stack_factory(step_delay_s=0.02).client()
    created = client.responses.create(
        model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=MAX_TOKENS, background=True
    )
    assert created.status == "queued" and created.background

    deadline = time.monotonic() + 30
    response = client.responses.retrieve(created.id)
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        response = client.responses.retrieve(created.id)

    assert response.status == "incomplete"  # max_output_tokens ended it, as OpenAI reports
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )
    assert response.output_text == expected_text()
    assert response.usage is not None and response.usage.output_tokens == MAX_TOKENS


def polled_to_the_end(client: openai.OpenAI, response_id: str) -> Response:
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    response = client.responses.retrieve(response_id)
    while response.status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"response {response_id} stayed {response.status}"
        time.sleep(0.1)
        response = client.responses.retrieve(response_id)
    return response


def test_a_background_response_streams_as_it_runs_and_leaving_the_stream_does_not_stop_it(
    stack_factory: Callable[..., Stack],
) -> None:
    client = stack_factory(step_delay_s=0.05).client()
    streamed = list(
        client.responses.create(
            model=MODEL, input="Hi", max_output_tokens=MAX_TOKENS, background=True, stream=True
        )
    )
    types = [event.type for event in streamed]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"  # max_output_tokens
    response_id = streamed[0].response.id  # type: ignore[union-attr]
    text = "".join(event.delta for event in streamed if event.type == "response.output_text.delta")
    assert text == expected_text()
    assert polled_to_the_end(client, response_id).output_text == text  # the runner stored it too

    left = client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=40, background=True, stream=True
    )
    first = next(iter(left))
    left.close()  # the client goes away after the first event, 40 steps (2 s) before the end
    assert first.type == "response.created"
    finished = polled_to_the_end(client, first.response.id)  # type: ignore[union-attr]
    assert finished.status == "incomplete" and finished.usage is not None
    assert finished.usage.output_tokens == 40  # it ran on to max_output_tokens without its client


def test_a_background_stream_is_picked_up_again_after_the_last_event_seen(
    stack_factory: Callable[..., Stack],
) -> None:
    client = stack_factory(step_delay_s=0.05).client()
    seen = []
    with client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=MAX_TOKENS, background=True, stream=True
    ) as first_part:
        for event in first_part:
            seen.append(event)
            if sum(event.type == "response.output_text.delta" for event in seen) == 2:
                break  # the connection drops here
    response_id = seen[0].response.id  # type: ignore[union-attr]

    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=seen[-1].sequence_number))

    numbers = [event.sequence_number for event in seen + rest]
    assert numbers == list(range(len(numbers)))  # nothing missed, nothing twice
    text = "".join(event.delta for event in seen + rest if event.type == "response.output_text.delta")
    assert text == expected_text() and rest[-1].type == "response.incomplete"
    replayed = list(client.responses.retrieve(response_id, stream=True))  # from the start
    assert [event.type for event in replayed] == [event.type for event in seen + rest]


def test_responses_answer_whole_and_streamed(stack_factory: Callable[..., Stack]) -> None:
    client = stack_factory().client()
    whole = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": "Hi"}], max_output_tokens=200
    )
    assert whole.status == "completed" and whole.output_text == SCRIPT
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=MAX_TOKENS, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == expected_text()


def test_background_response_cancel(stack_factory: Callable[..., Stack]) -> None:
    client = stack_factory(step_delay_s=0.05).client()
    created = client.responses.create(model=MODEL, input="Hi", max_output_tokens=200, background=True)
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"


def test_cli_submit_waits_with_progress_and_writes_the_output(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    stack = stack_factory(step_delay_s=0.01)
    base_url = f"{stack.gateways[0][1]}/v1"
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(chat_line(f"q{index}")) + "\n" for index in range(25)))

    submit = spawn_cli("batch", "submit", str(path), "--wait", "--poll", "0.2", "--base-url", base_url)
    output, _ = submit.communicate(timeout=BATCH_TIMEOUT_S)

    text = output.decode()
    assert submit.returncode == 0, text
    assert "25/25 lines" in text and "lines/s" in text and "ETA" in text
    written = [json.loads(line) for line in (tmp_path / "prompts.output.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in written) == sorted(f"q{index}" for index in range(25))
    batch_id = text.splitlines()[0].strip()
    status = spawn_cli("batch", "status", batch_id, "--base-url", base_url)
    status_text = status.communicate(timeout=30)[0].decode()
    assert f"{batch_id}  completed  25 completed, 0 failed of 25" in status_text
    listing = spawn_cli("batch", "list", "--base-url", base_url)
    assert batch_id in listing.communicate(timeout=30)[0].decode()


def test_cli_cancel_stops_a_submitted_batch(stack_factory: Callable[..., Stack], tmp_path: Path) -> None:
    stack = stack_factory(step_delay_s=0.05)
    base_url = f"{stack.gateways[0][1]}/v1"
    path = tmp_path / "long.jsonl"
    lines = [chat_line(f"q{index}", max_tokens=40, ignore_eos=True) for index in range(30)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    submit = spawn_cli("batch", "submit", str(path), "--base-url", base_url)
    batch_id = submit.communicate(timeout=60)[0].decode().strip()
    assert submit.returncode == 0 and batch_id.startswith("batch_")
    wait_for_progress(stack.client(), batch_id)

    cancel = spawn_cli("batch", "cancel", batch_id, "--base-url", base_url)
    cancel_text = cancel.communicate(timeout=30)[0].decode()

    assert cancel.returncode == 0, cancel_text
    assert cancel_text.startswith(batch_id) and ("cancelling" in cancel_text or "cancelled" in cancel_text)
    cancelled = wait_for(stack.client(), batch_id, {"cancelled"})
    assert cancelled.request_counts is not None and cancelled.request_counts.completed < 30


def test_a_gateway_dying_while_a_batch_finalizes_leaves_it_to_another_that_writes_its_files(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    LINES = 10
    stack = stack_factory()
    client = stack.client()
    lines = [chat_line(f"line-{index}") for index in range(LINES)]
    batch = client.batches.create(
        input_file_id=upload(client, tmp_path, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id, {"completed"})
    stack.gateways[0][0].send_signal(signal.SIGKILL)
    stack.gateways[0][0].wait(timeout=10)
    # What a gateway killed inside finalizing leaves: every line done, no files written yet.
    redis = Redis.from_url(stack.redis.url)
    redis.hset(keys.batch(batch.id), "status", "finalizing")
    redis.hdel(keys.batch(batch.id), "output_file_id", "error_file_id", "completed_at")
    redis.sadd(keys.active("batch"), batch.id)

    stack.add_gateway()
    stack.wait_ready()
    survivor = stack.client(1)
    done = wait_for(survivor, batch.id, {"completed", "failed"})

    assert done.status == "completed" and done.output_file_id is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)  # type: ignore[union-attr]
    custom_ids = [line["custom_id"] for line in output_lines(survivor, done.output_file_id)]
    assert sorted(custom_ids) == sorted(f"line-{index}" for index in range(LINES))
