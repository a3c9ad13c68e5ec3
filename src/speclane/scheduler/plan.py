"""The tick's contract: what the scheduler asks for and what the runner hands back.

Plain frozen dataclasses, no torch. The scheduler's ``SchedulerPlan`` says, per
sequence, which tokens to feed and how many drafts to verify; the runner's
``RunnerResult`` says, per sequence, which tokens it chose and how many drafts it
verified. Everything else (how far a request's cache reaches, what was accepted, what
a round counts for) the scheduler derives from the two, in one place
(``Scheduler.update``), so no other module advances a request or counts speculation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speclane.request import Request, TokenLogprob


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's work in this tick's forward."""

    request: Request  # read-only for the runner (drafting context, sampling params)
    block_table: tuple[int, ...]  # KV blocks: position p at offset p % block size of block_table[p // block size]
    start: int  # cached length before this tick == position of token_ids[0]
    token_ids: tuple[int, ...]  # fed this tick: a prefill chunk, or the last sampled token
    sample: bool  # sample after the last fed token (prompt complete, or decoding)
    num_draft_tokens: int = 0  # > 0: this sequence holds the lane: draft up to K, verify K + 1
    # False: the round must not seed the drafter's costly state (an MTP head's pass over the
    # whole context): it drafts the cheap way (the suffix drafter, a lookup) or not at all.
    may_seed: bool = True

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_round(self) -> bool:
        """A speculative round runs for this sequence (even if the drafter proposes nothing)."""
        return self.num_draft_tokens > 0


@dataclass(frozen=True)
class SchedulerPlan:
    """What to compute in one tick."""

    seqs: tuple[ScheduledSeq, ...] = ()
    # Requests that left since the last plan: the runner drops their per-request state.
    released_request_ids: tuple[str, ...] = ()
    # Requests preempted since the last plan (recomputed later): the runner drops their
    # drafter state and keeps their sampling stream and grammar state.
    preempted_request_ids: tuple[str, ...] = ()
    # (source block, target block, j): before the forward, copy the K/V of the first j
    # positions of the source into the target (an admitted prompt's positions read from
    # part of a cached block: kv_manager.Admission.copy).
    kv_copies: tuple[tuple[int, int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) + s.num_draft_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(frozen=True)
class SeqResult:
    """What the runner chose for one sequence of the plan.

    ``token_ids``: for a sampling sequence, the accepted drafts followed by the target's
    own next token (so ``len(token_ids) - 1`` drafts were accepted); empty for a chunk in
    the middle of a prompt. ``num_draft_tokens``: drafts proposed and verified, at most
    the plan's ``num_draft_tokens`` (a drafter may find fewer). The rejected drafts'
    positions lie past the verified length: no later forward reads them.
    """

    request_id: str
    token_ids: tuple[int, ...] = ()
    num_draft_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token_ids entry when the request asks for them
    # With prompt_logprobs, for a prompt chunk: the entries of the prompt tokens this chunk's
    # rows predict, the first at prompt position ``prompt_logprobs_from``.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs_from: int = 0
    # The request cannot go on, and why (its client's to fix: a grammar the parser gave
    # up on); the scheduler ends it with FINISHED_ERROR after this tick's tokens.
    error: str | None = None

    @property
    def num_accepted_tokens(self) -> int:
        return max(0, len(self.token_ids) - 1)


@dataclass(frozen=True)
class RunnerResult:
    seqs: tuple[SeqResult, ...] = ()  # one per plan sequence, in the plan's order
    elapsed_ms: float = 0.0  # wall time of the tick's execution (forward, drafting, sampling)
    # Per proposal that did not seed: (request id, ms drafting its tokens, tokens, ms
    # catching up; None where the drafter drafted the round its cheap way, a lookup or
    # the suffix drafter under auto, whose whole call is then the ms drafting, a head
    # pass that proposed nothing included).
    draft_timings: tuple[tuple[str, float, int, float | None], ...] = field(default_factory=tuple)
    # Per proposal that seeded its request's drafter state (``Draft.seeded``): (request id,
    # ms seeding, ms of the whole call).
    seed_timings: tuple[tuple[str, float, float], ...] = field(default_factory=tuple)
