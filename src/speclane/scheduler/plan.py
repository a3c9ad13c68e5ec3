"""The messages between the scheduler and the runner: plain dataclasses, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from speclane.request import Request


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's work in this tick's forward."""

    request: Request  # read-only for the runner (drafting context, sampling params)
    slot: int  # KV cache row
    start: int  # cached length before this tick == position of token_ids[0]
    token_ids: tuple[int, ...]  # fed this tick: a prefill chunk, or the last sampled token
    sample: bool  # sample after the last fed token (prompt complete, or decoding)
    num_draft_tokens: int = 0  # > 0: this sequence holds the lane: draft up to K, verify K + 1

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class SchedulerPlan:
    """What to compute in one tick."""

    seqs: tuple[ScheduledSeq, ...] = ()
    # --spec-mode burst: this sequence alone runs its whole generation this tick.
    burst: ScheduledSeq | None = None
    # Requests that left since the last plan: the runner drops their drafter state.
    released_request_ids: tuple[str, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) + s.num_draft_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs and self.burst is None


@dataclass
class SeqResult:
    """What the runner computed for one sequence."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)  # new tokens (empty for a mid-prompt chunk)
    num_computed_tokens: int = 0  # tokens in the KV cache after this tick
    spec_round: bool = False  # a lane round ran (even if the drafter found nothing to propose)
    num_draft_tokens: int = 0  # drafts proposed and verified
    num_accepted_tokens: int = 0
    num_rounds: int = 0  # rounds run (burst mode runs many in one tick)


@dataclass
class RunnerResult:
    seqs: list[SeqResult] = field(default_factory=list)
    elapsed_ms: float = 0.0  # wall time of the tick's execution (forward, drafting, sampling)
    draft_ms: float = 0.0  # of which the drafter's proposals (slice ticks)
    # Per proposal that adaptive K learns from: (ms drafting tokens, tokens, ms catching up).
    draft_timings: list[tuple[float, int, float]] = field(default_factory=list)
