"""Several served names (``--served-model-name primary alias``): the model answers to each.

vLLM's behaviour: ``/v1/models`` lists every name, a request may name any of them and
its response echoes that name; the first name is canonical, so the job still runs on
the model's one queue.
"""

from __future__ import annotations

from tests.helpers import chat_body, parse_sse, running_stack
from tests.integration.test_batch_isolation import chat_line, create_batch, output_lines, wait_for

NAMES = ["primary", "alias"]


async def test_every_served_name_is_listed_and_answers(redis_url: str) -> None:
    async with running_stack(redis_url, served_model_name=NAMES) as client:
        listing = await client.get("/v1/models")
        card = await client.get("/v1/models/alias")
        answers = [await client.post("/v1/chat/completions", json=chat_body(model=name)) for name in NAMES]
        streamed = await client.post("/v1/chat/completions", json=chat_body(model="alias", stream=True))
        tokenized = await client.post("/tokenize", json={"model": "alias", "prompt": "Hi"})

    assert [model["id"] for model in listing.json()["data"]] == ["alias", "primary"]
    assert (card.status_code, card.json()["id"]) == (200, "alias")
    assert [(answer.status_code, answer.json()["model"]) for answer in answers] == [
        (200, "primary"), (200, "alias")
    ]  # fmt: skip
    chunks = [chunk for chunk in parse_sse(streamed.text) if chunk != "[DONE]"]
    assert chunks and {chunk["model"] for chunk in chunks} == {"alias"}
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 0
    # The worker takes jobs from the canonical name's queue alone: an answer to `alias` means
    # the gateway enqueued it there.


async def test_a_misspelt_name_is_404_listing_every_served_name(redis_url: str) -> None:
    async with running_stack(redis_url, served_model_name=NAMES) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(model="primray"))

    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        "The model `primray` does not exist or is not served here. Served models: alias, primary."
    )


async def test_a_batch_naming_an_alias_runs_on_the_model_and_its_lines_echo_the_alias(redis_url: str) -> None:
    async with running_stack(redis_url, served_model_name=NAMES) as client:
        lines_in = [chat_line(f"line-{index}", model="alias") for index in range(3)]
        batch_id = await create_batch(client, lines_in)
        batch = await wait_for(client, batch_id, {"completed", "failed"})
        lines = await output_lines(client, batch["output_file_id"])

    assert (batch["status"], batch["model"]) == ("completed", "primary")  # the canonical name, as OpenAI's
    assert [line["response"]["body"]["model"] for line in lines] == ["alias"] * 3
