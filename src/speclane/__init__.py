"""speclane: an LLM inference server whose speculative decoding lane is shared fairly."""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams", "EngineConfig", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import speclane` stays cheap (no torch) for the CLI's --help and config code;
    # the version too (importlib.metadata's import took ~45 ms of every process's start).
    if name == "__version__":
        from speclane.version import __version__

        return __version__
    if name == "LLM":
        from speclane.llm import LLM

        return LLM
    if name == "SamplingParams":
        from speclane.request import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from speclane.config import EngineConfig

        return EngineConfig
    raise AttributeError(f"module 'speclane' has no attribute {name!r}")
