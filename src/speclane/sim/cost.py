"""The simulator's cost model: how long a tick takes, from what the plan asks for.

First order, as docs/design.md ("One tick") describes a tick: one batched forward whose cost is a fixed
part (weights read once, Python dispatch, sampling) plus a part per token passed
through the model, plus an extra per lane verify row (drafting, the wider verify
logits, the acceptance test). Prefill tokens may cost differently from decode tokens
(compute-bound rather than memory-bound), so they have their own rate.

    tick_ms = base_ms + decode_token_ms * decode tokens (incl. K verify positions)
                      + prefill_token_ms * prefill tokens + verify_row_ms * verify rows

The defaults are rough figures for the default model on this project's 2-core machine
(docs/design.md, "Speed facts"); ``calibrate.py`` fits them from a ``speclane bench`` run.
"""

from __future__ import annotations

from dataclasses import dataclass

from speclane.scheduler.plan import SchedulerPlan


@dataclass(frozen=True)
class CostModel:
    base_ms: float = 12.0
    decode_token_ms: float = 0.8
    prefill_token_ms: float = 1.0
    verify_row_ms: float = 4.0
    source: str = "defaults (docs/design.md speed facts, not calibrated)"

    def __post_init__(self) -> None:
        for name in ("base_ms", "decode_token_ms", "prefill_token_ms", "verify_row_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"cost model {name} must be >= 0; got {getattr(self, name)}")
        if self.base_ms + self.decode_token_ms <= 0:
            raise ValueError("a decode step must cost something: base_ms + decode_token_ms must be > 0")

    def step_ms(self, *, decode_tokens: int, prefill_tokens: int = 0, verify_rows: int = 0) -> float:
        return (self.base_ms + self.decode_token_ms * decode_tokens + self.prefill_token_ms * prefill_tokens
                + self.verify_row_ms * verify_rows)

    def tick_ms(self, plan: SchedulerPlan) -> float:
        """Cost of one tick's plan."""
        decode = prefill = rows = 0
        for seq in plan.seqs:
            if seq.start < seq.request.num_prompt_tokens:
                prefill += len(seq.token_ids)
            else:
                decode += len(seq.token_ids) + seq.num_draft_tokens
                rows += seq.num_draft_tokens > 0
        return self.step_ms(decode_tokens=decode, prefill_tokens=prefill, verify_rows=rows)

    def describe(self) -> str:
        return (f"tick = {self.base_ms:.2f} ms + {self.decode_token_ms:.3f} ms/decode token + "
                f"{self.prefill_token_ms:.3f} ms/prefill token + {self.verify_row_ms:.2f} ms/verify row "
                f"({self.source})")
