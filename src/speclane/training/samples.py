"""A training sample of the MTP head: the target's own text and its hidden states."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sample:
    token_ids: list[int]  # prompt + generated tokens
    num_prompt_tokens: int
    hidden: torch.Tensor  # [len(token_ids) - 1, hidden] bfloat16: positions 0 .. n-2 (the last token is never fed)

    def to_dict(self) -> dict[str, object]:
        return {"token_ids": self.token_ids, "num_prompt_tokens": self.num_prompt_tokens, "hidden": self.hidden}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Sample:
        return cls(list(d["token_ids"]), int(d["num_prompt_tokens"]), d["hidden"])  # type: ignore[arg-type]
