"""The drafters' evaluation set (``data/drafts.jsonl``): categories, a tuning half, a held-out half.

Written by ``benchmarks/make_drafts_set.py`` (its docstring says how the prompts are made
and split). Drafter parameters are tuned on ``tune`` only (``benchmarks/tune_drafters.py``);
``speclane bench drafters`` reports on ``heldout`` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speclane.models.tokenizer import Tokenizer

PATH = Path(__file__).resolve().parent / "data" / "drafts.jsonl"
CATEGORIES = ("verbatim-copy", "copy-edits", "code-edit-prediction", "code-edit", "multi-turn", "tool-call", "open-chat")
SPLITS = ("tune", "heldout")


@dataclass(frozen=True)
class DraftPrompt:
    id: str
    category: str
    split: str
    messages: tuple[dict[str, str], ...]
    prediction: str = ""

    def token_ids(self, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
        """The prompt as the model sees it (its chat template, ready for the answer) and the
        prediction ([] where there is none), as token ids."""
        prompt = tokenizer.encode(tokenizer.apply_chat_template(list(self.messages)))
        return prompt, tokenizer.encode(self.prediction) if self.prediction else []


def load(split: str | None = None, path: Path = PATH) -> list[DraftPrompt]:
    """The set's prompts in file order; of one split when ``split`` is given."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    prompts = []
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        prompt = DraftPrompt(raw["id"], raw["category"], raw["split"], tuple(raw["messages"]), raw.get("prediction", ""))
        if split is None or prompt.split == split:
            prompts.append(prompt)
    return prompts


def by_category(prompts: list[DraftPrompt]) -> dict[str, list[DraftPrompt]]:
    """``prompts`` grouped by category, in ``CATEGORIES`` order."""
    return {c: [p for p in prompts if p.category == c] for c in CATEGORIES if any(p.category == c for p in prompts)}
