"""The drafter contract.

A drafter proposes up to ``k`` tokens that are likely to follow a request's tokens.
The runner verifies them against the target model in the same forward as everyone
else's decode step, so a drafter must be cheap and must never change the output:
whatever it proposes, verification keeps only what the target itself would have
produced (see ``engine/sampling.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import torch

from speclane import draft_tree
from speclane.request import Request


@dataclass
class Draft:
    token_ids: list[int]  # at most k proposed tokens; may be empty (nothing to propose)
    # [len(token_ids), vocab] the drafter's distribution q for each token, or None when
    # the drafter is deterministic (q one-hot), as n-gram lookup is.
    probs: torch.Tensor | None = None
    # Of the call's time, the ms spent catching up on positions verified since the
    # request's last round: paid once per round whatever k (n-gram: 0); in a call that
    # seeded (below), the seed's. None when the call drafted the round another way than
    # its costly one (the MTP drafter's prompt lookup), or seeded without splitting its
    # time: adaptive K leaves it out of its per-round timing.
    catch_up_ms: float | None = 0.0
    # The call (re)built the request's drafter state from its whole context (an MTP head's
    # pass over it, the suffix drafter's index): a one-off whose time says nothing about
    # the next rounds; adaptive K keeps it apart, as what a request's first round costs.
    seeded: bool = False
    # The drafter's estimate, per token, that verification keeps the draft up to and
    # including it (non-increasing); empty when it has none. ``--drafter auto`` compares
    # drafters by the sum, the expected accepted tokens.
    confidence: tuple[float, ...] = ()
    # None: the tokens are a chain. Else a draft tree (``speclane/draft_tree.py``): the
    # parent of each token among the draft's tokens (-1: it follows the request's last
    # token), a parent before its children and the likeliest branch first; ``confidence``
    # is then each node's estimate and its sum still the expected accepted tokens. Only
    # deterministic drafts (``probs`` None) are trees; the runner verifies the first chain
    # of a tree where a round needs a chain (a grammar).
    parents: tuple[int, ...] | None = None

    def cut(self, k: int) -> Draft:
        """The first ``k`` tokens (a tree's first k nodes are a tree: parents come first)."""
        if len(self.token_ids) <= k:
            return self
        return replace(self, token_ids=self.token_ids[:k], probs=None if self.probs is None else self.probs[:k],
                       confidence=self.confidence[:k], parents=None if self.parents is None else self.parents[:k])

    def chain(self) -> Draft:
        """The draft as a chain: a tree's first chain (``draft_tree.first_chain``)."""
        if self.parents is None:
            return self
        path = draft_tree.first_chain(self.parents)
        return Draft([self.token_ids[j] for j in path], catch_up_ms=self.catch_up_ms, seeded=self.seeded,
                     confidence=tuple(self.confidence[j] for j in path) if self.confidence else ())


class Drafter(Protocol):
    """Contract:

    - ``propose(request, k, may_seed=True)`` returns a ``Draft`` of at most ``k`` tokens
      continuing ``request.token_ids()``. It must not mutate the request. With
      ``may_seed`` False it builds no costly per-request state (an MTP head's pass over
      the context): it drafts another way or proposes nothing. A drafter whose state is
      cheap to build (an index, a lookup) may ignore it.
    - ``needs_hidden_states``: when True the runner also calls ``observe_tick`` (the
      ``HiddenObserver`` contract) after every forward, with every request's rows, so the
      drafter can catch up on positions decoded while the request did not hold the lane.
    - ``finish(request)``: the request finished (stopped, hit a limit, or was aborted);
      called once, before ``release``, with its final output. A drafter that learns from
      a tenant's outputs (the suffix drafter) reads them here, and must never let them
      shape another tenant's drafts; the others do nothing.
    - ``release(request_id)`` forgets any per-request state (the request finished, was
      aborted, or was preempted and will be recomputed).
    - ``cheap_starts`` (optional, default False): the drafter has a costly state to seed
      (an MTP head) and another way to draft while it has not (a lookup, the suffix
      drafter), so a round with ``may_seed`` False still drafts; adaptive K offers such
      rounds only to such a drafter.
    """

    name: str
    needs_hidden_states: bool

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft: ...

    def finish(self, request: Request) -> None: ...

    def release(self, request_id: str) -> None: ...


@runtime_checkable
class CostAware(Protocol):
    """A drafter that weighs its proposals by what verifying them costs: the engine calls
    ``use_step_cost(step_ms)`` once it has measured ``step_ms(rows)``, the milliseconds of
    a forward of that many rows (adaptive K's calibration)."""

    def use_step_cost(self, step_ms: Callable[[int], float]) -> None: ...


HiddenSpan = tuple[Request, int, int, int]  # (request, its first position, first row in the tick's hidden, rows)


class HiddenObserver(Protocol):
    """Receives the target's final hidden states of the positions kept after a forward.

    ``observe_tick(spans, hidden)``, once per forward: ``hidden`` [n, hidden_size] float32
    holds the tick's kept positions (prompt chunks, decode steps and accepted draft
    positions; rejected drafts are never shown); each span ``(request, start, row, rows)``
    says that rows ``row .. row + rows - 1`` are ``request``'s positions ``start ..
    start + rows - 1``. Nothing writes ``hidden`` again: an observer may keep views of it
    (a view keeps the whole tensor alive) or copy what it keeps.
    """

    def observe_tick(self, spans: Sequence[HiddenSpan], hidden: torch.Tensor) -> None: ...

