"""Our GGUF tokenizers against llama.cpp's own vocabulary test files (``models/ggml-vocab-*``
of the llama.cpp source that the benchmarks' llama.cpp build unpacks under
~/.cache/speclane-anchors, ``bench/llama_cpp.py``): every test string tokenizes to llama.cpp's
ids. Skipped where that source is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from speclane.models.tokenizer import Tokenizer

ANCHORS = Path.home() / ".cache" / "speclane-anchors"
VOCABS = ("llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "starcoder", "command-r", "refact", "mpt")


def vocab_folder() -> Path | None:
    found = sorted(ANCHORS.glob("llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"))
    return found[-1].parent if found else None


@pytest.mark.parametrize("name", VOCABS)
def test_every_test_string_gives_llama_cpps_ids(name: str) -> None:
    folder = vocab_folder()
    if folder is None:
        pytest.skip("llama.cpp's source is not under ~/.cache/speclane-anchors (the benchmarks' llama.cpp build)")
    tok = Tokenizer.from_gguf(folder / f"ggml-vocab-{name}.gguf")
    texts = (folder / f"ggml-vocab-{name}.gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    expected = (folder / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    wrong = [(text, tok.encode(text)) for text, ids in zip(texts, expected, strict=False)
             if tok.encode(text) != [int(i) for i in ids.split()]]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, e.g. {wrong[:3]}"
