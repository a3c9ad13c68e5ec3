"""transformers' tokenizer and model read from a GGUF file (``gguf_file=``): the independent
reference the integration tests hold speclane's reader, tokenizer and forward against.

transformers parses a GGUF's metadata once for the config, once for the weights and once
for the tokenizer, and rebuilds the same tensor-name map ~400 times; for Gemma 3's
262,144-token vocabulary a parse takes ~25 s here. ``parsed_once`` caches both (pure
functions of their arguments) for the loads inside it, and a tokenizer, once built, is
kept for every test module that asks for the same file.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch


@contextlib.contextmanager
def parsed_once() -> Iterator[None]:
    """transformers' loads inside read each GGUF file's metadata once."""
    gguf = pytest.importorskip("gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        yield


@functools.cache
def tokenizer(path: Path) -> Any:
    """transformers' tokenizer of the GGUF at ``path`` (built once, then shared by every test module that reads it)."""
    transformers = pytest.importorskip("transformers")
    with parsed_once():
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def model(path: Path) -> Any:
    """transformers' float32 model of the GGUF at ``path``, in eval mode."""
    transformers = pytest.importorskip("transformers")
    with parsed_once():
        return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                 dtype=torch.float32).eval()


def model_and_tokenizer(path: Path) -> tuple[Any, Any]:
    """``model`` and ``tokenizer`` of the GGUF at ``path``, its metadata parsed once for both."""
    with parsed_once():
        return model(path), tokenizer(path)
