"""Build the model once per model config and hand out engines with different lane options."""

from __future__ import annotations

from typing import Any

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine, load_tokenizer
from speclane.models.build import build_model
from speclane.models.loader import read_weights


class EngineFactory:
    def __init__(self, base: EngineConfig):
        self.base = base
        self._weights = read_weights(base.model.model)
        self.tokenizer = load_tokenizer(self._weights.tokenizer_source)
        self._models: dict[Any, Any] = {}

    def engine(self, **options: Any) -> LLMEngine:
        config = self.base.replace(**options)
        key = config.model
        if key not in self._models:
            self._models[key] = build_model(self._weights, config.model)
        return LLMEngine.from_parts(config, self._models[key], self.tokenizer)

    def chat_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.apply_chat_template([{"role": "user", "content": text}]))
