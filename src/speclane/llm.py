"""The offline Python API: ``speclane.LLM().generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine
from speclane.request import SamplingParams, TokenLogprob


@dataclass
class Completion:
    prompt: str | list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)
    prompt_logprobs: list[TokenLogprob] | None = None  # with SamplingParams.prompt_logprobs: from the second token


class LLM:
    """Load a model once, then generate for many prompts (batched, continuously).

    Options are the engine options (docs/api.md) by field name, e.g.
    ``LLM(dtype="float32", spec_mode="off")``.
    """

    def __init__(self, model: str | None = None, config: EngineConfig | None = None, **options: Any):
        config = config or EngineConfig()
        if model is not None:
            options["model"] = model
        self.engine = LLMEngine(config.replace(**options) if options else config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def encode_prompt(self, prompt: str | list[int] | list[dict[str, str]], chat: bool = False) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt), add_special_tokens=False)  # type: ignore[arg-type]
        if isinstance(prompt, list):
            return list(prompt)  # type: ignore[arg-type]
        if chat:
            return self.encode_prompt([{"role": "user", "content": prompt}])
        return self.tokenizer.encode_prompt(prompt)

    def generate(
        self,
        prompts: str | Sequence[str | list[int] | list[dict[str, str]]],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool = False,
        **request_options: Any,
    ) -> list[Completion]:
        """Generate for every prompt, all in one continuous batch; results in prompt order.

        ``chat=True`` applies the model's chat template to plain-string prompts.
        ``request_options`` (priority, tenant, speculative, prediction_token_ids) apply to all.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        params = list(sampling) if isinstance(sampling, Sequence) else [sampling or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                rid = f"llm-{next(self._ids)}"
                self.engine.add_request(rid, self.encode_prompt(prompt, chat), sp, **request_options)
                ids.append(rid)
        except BaseException:
            self._abandon(ids)  # all or nothing: never leave earlier prompts running unseen
            raise
        texts: dict[str, list[str]] = {rid: [] for rid in ids}
        tokens: dict[str, list[int]] = {rid: [] for rid in ids}
        prompt_logprobs: dict[str, list[TokenLogprob] | None] = dict.fromkeys(ids)
        finals: dict[str, Any] = {}
        try:
            while len(finals) < len(ids):
                for out in self.engine.step():
                    if out.request_id not in texts:
                        continue
                    texts[out.request_id].append(out.text)
                    tokens[out.request_id].extend(out.token_ids)
                    if out.prompt_logprobs is not None:
                        prompt_logprobs[out.request_id] = out.prompt_logprobs
                    if out.finished:
                        finals[out.request_id] = out
        except BaseException:  # an interrupt, or the engine failed: the next call starts clean
            self._abandon([rid for rid in ids if rid not in finals])
            raise
        return [
            Completion(prompt, "".join(texts[rid]), tokens[rid], finals[rid].finish_reason, finals[rid].usage,
                       prompt_logprobs[rid])
            for prompt, rid in zip(prompts, ids, strict=True)
        ]

    def _abandon(self, request_ids: list[str]) -> None:
        """Abort ``request_ids`` and let the engine drop them (an engine that fails again
        here keeps the first error, which the caller raises)."""
        for rid in request_ids:
            self.engine.abort_request(rid)
        with contextlib.suppress(Exception):
            self.engine.run_until_done()
