"""``--drafter auto``: per round, the proposal worth the most: expected accepted tokens per
millisecond of the round where the engine has measured its step cost, else expected tokens.

Up to three drafters compete each round: the suffix drafter (``suffix.py``: the request's
own text, its prediction and its tenant's recent outputs), prompt lookup (``ngram.py``,
which also searches the prediction) where one is given, and the MTP head where the model
has one (``mtp.py``, run without its own lookup). ``--drafter auto`` (the registry) gives
no prompt lookup: the suffix drafter searches the same text, and on the drafts set's
tuning half (``benchmarks/compare_auto.py``) auto with lookup took it in most rounds and
was slower than without on 5 of 7 categories. Each proposal gets an expected number of
accepted tokens:

- suffix: the sum of its per-token probabilities (``Draft.confidence``), times how its
  estimates have held up (accepted over predicted, so far);
- prompt lookup: ``a + a^2 + ... + a^n`` for a draft of n tokens, where ``a`` is lookup's
  measured acceptance (accepted over tried positions: a position is tried when every
  draft before it was accepted);
- the MTP head: the same with the head's rate and ``n = k``, known before it runs, so the
  head (the only drafter whose call costs a model pass) runs when it is expected to beat
  the best cheap proposal (two exceptions, below: a probe, and a seed that waits).

Where the engine has measured its step cost (``use_step_cost``: adaptive K's calibration),
"beat" is counted in tokens per millisecond rather than in tokens: a proposal of n tokens
expected to keep E is worth ``(1 + E) / (step(n + 1) + cost)``, where ``step(r)`` is a
forward of r rows and ``cost`` the head's own measured time a round (its passes and
catch-up; the cheap drafters' proposals are made every round anyway). A head draft that
keeps a token more than suffix's but verifies twice the rows and pays its passes is not
worth it on a CPU, where every verified row costs its multiply-adds.

The rates are decayed counts (recent rounds weigh more), per request with the engine-wide
rate as a prior worth ``PRIOR_WEIGHT`` tried positions, so a request's own record takes
over after a few rounds (a copy's lookup is worth more than a chat's); the engine-wide
rate keeps a long memory (``ENGINE_DECAY``). A round's outcome
is read at the request's next round (or when it finishes): the tokens that followed the
round's start, compared with what was drafted. A rate is learnt only from the rounds its
drafter wins, so a head priced out would never run to show it was priced wrong: after
``HEAD_PROBE_ROUNDS`` rounds since the head last ran in which the cheap drafters found
nothing, the head runs once anyway (a probe, scored as any round). A head round that
(re)seeds runs the head over the request's context, a cost the head's per-round time leaves
out: a head that needs its seed runs only after ``HEAD_SEED_AFTER`` such rounds (an answer
the suffix drafter copies seldom repays a seed). Both count only rounds in which the head
could run: a round that may not seed does not count for a head still to be seeded.

The head's hidden-state catch-up is the MTP drafter's: ``observe_tick`` goes to it every forward,
and a round that the head skips leaves its positions pending for the next head round.
Adaptive K times only head rounds (the others report ``catch_up_ms=None``), as the MTP
drafter does for its lookup rounds; a call in which the suffix drafter or the head seeded
reports itself seeded (``Draft.seeded``), its time a request's first round's. Every
proposal is deterministic, so the output is unchanged whichever drafter a round takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from speclane import draft_tree
from speclane.drafters.base import Draft, HiddenSpan
from speclane.drafters.mtp import MTPDrafter
from speclane.drafters.ngram import NgramDrafter
from speclane.drafters.suffix import SuffixDrafter
from speclane.request import Request

PRIOR_WEIGHT = 4.0  # tried positions the engine-wide rate is worth in a request's estimate
DECAY = 0.9  # per round, on the counts behind a request's rate: it follows the text
# Per round, on the engine-wide counts, the prior every new request starts from: a long
# run's rate. At DECAY it held ~10 rounds, and a few misses in a row (a chat's stretch
# the head did not know) set the head's prior to ~0.2 where it keeps ~0.45 of first
# positions: its proposals then never beat an empty one, so it never ran again to say so.
ENGINE_DECAY = 0.99
# The head's rate is only learnt from the rounds it runs, so a low estimate (a stretch of
# text the head did not know, or a category where copying won) would keep it from ever
# running again to correct it: on the held-out half, two early misses in verbatim copy set
# its prior to 0.2 and it drafted none of open chat's rounds, where alone it kept 0.45.
# So a request whose cheap drafters found nothing in this many rounds since the head last
# ran runs the head once (a probe); its outcome is scored as any round's.
# Tuning half, 8 prompts a category (benchmarks/compare_auto.py --probe-rounds 0,4,8,16):
# all prompts' median over off 1.09x (no probe), 1.10x, 1.11x, 1.14x, within a run's noise
# of each other in a run where the head was not trapped; 16 spends fewest rounds on probes.
HEAD_PROBE_ROUNDS = 16
# A head round that (re)seeds runs the head over the context (up to the head's 256-position
# window: ~5 ms for 120 positions here, a token's time or more), which the head's per-round
# time leaves out. Where the suffix drafter copies most of an answer the head rarely pays
# that back, so it is seeded only once this many of the request's rounds found no cheap
# draft. Tuning half, all 105 prompts, 2 passes (benchmarks/compare_auto.py --seed-after
# 1,2,4,8): auto against the category's best single drafter, paired per prompt, median
# 0.945x / 0.964x / 0.975x / 0.973x; open chat 1.01x / 1.00x / 0.98x / 1.00x of the head alone.
HEAD_SEED_AFTER = 4
SOURCES = ("suffix", "lookup", "mtp")
# Before any round is seen: per-position acceptance of lookup and the head, and the
# suffix drafter's accepted over predicted.
INITIAL = {"suffix": 1.0, "lookup": 0.5, "mtp": 0.5}


@dataclass
class _Rate:
    hits: float = 0.0
    tries: float = 0.0
    decay: float = DECAY

    def add(self, hits: float, tries: float) -> None:
        self.hits = self.hits * self.decay + hits
        self.tries = self.tries * self.decay + tries


@dataclass
class _Round:
    source: str
    start: int  # the request's length when drafted
    tokens: list[int]
    predicted: float  # the suffix drafter's sum of confidences
    parents: tuple[int, ...] | None = None  # a draft tree's (draft_tree.py)


@dataclass
class _RequestState:
    rates: dict[str, _Rate] = field(default_factory=lambda: {s: _Rate() for s in SOURCES})
    last: _Round | None = None
    # Rounds since the head last ran in which it could have run and the cheap drafters proposed nothing.
    idle_rounds: int = 0


def geometric(rate: float, n: int) -> float:
    """Expected accepted tokens of an n-token draft whose positions each pass with ``rate``."""
    return sum(rate**j for j in range(1, n + 1))


class AutoDrafter:
    name = "auto"

    def __init__(self, suffix: SuffixDrafter, lookup: NgramDrafter | None = None, head: MTPDrafter | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.suffix = suffix
        self.lookup = lookup
        self.head = head
        self.clock = clock
        self.step_ms: Callable[[int], float] | None = None  # ms of a forward of n rows (use_step_cost)
        self.head_ms: float | None = None  # decayed mean wall ms of a head proposal, seeds left out (None: none yet)
        self.needs_hidden_states = head is not None
        self.cheap_starts = head is not None  # a round that may not seed the head drafts from the others
        self.rates = {s: _Rate(INITIAL[s] * PRIOR_WEIGHT, PRIOR_WEIGHT, ENGINE_DECAY) for s in SOURCES}
        self.states: dict[str, _RequestState] = {}
        self.chosen = dict.fromkeys(SOURCES, 0)  # rounds each drafter won (for benchmarks)
        self.probes = 0  # head rounds run as probes (for benchmarks)
        self.probe_rounds = HEAD_PROBE_ROUNDS
        self.seed_after = HEAD_SEED_AFTER

    def observe_tick(self, spans: Sequence[HiddenSpan], hidden: torch.Tensor) -> None:
        if self.head is not None:
            self.head.observe_tick(spans, hidden)

    def use_step_cost(self, step_ms: Callable[[int], float]) -> None:
        """Score proposals per millisecond: ``step_ms(rows)`` is a forward of that many rows."""
        self.step_ms = step_ms

    def _worth(self, expected: float, rows: int, extra_ms: float = 0.0) -> float:
        """A proposal's worth: expected tokens, or per millisecond where the step cost is known."""
        if self.step_ms is None:
            return expected
        return (1.0 + expected) / (self.step_ms(rows + 1) + extra_ms)

    def rate(self, state: _RequestState, source: str) -> float:
        own, engine = state.rates[source], self.rates[source]
        return (own.hits + PRIOR_WEIGHT * engine.hits / engine.tries) / (own.tries + PRIOR_WEIGHT)

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        state = self.states.setdefault(request.request_id, _RequestState())
        self._score_last(request, state)
        if k <= 0:
            return Draft([])
        suffix = self.suffix.propose(request, k)
        found = self.lookup.propose(request, k) if self.lookup is not None else Draft([])
        options = [
            (self._worth(self.rate(state, "suffix") * sum(suffix.confidence), len(suffix.token_ids)), "suffix", suffix),
            (self._worth(geometric(self.rate(state, "lookup"), len(found.token_ids)), len(found.token_ids)), "lookup", found),
        ]
        # An empty proposal never wins over one that drafts: whether a round drafts at all
        # is adaptive K's to decide (k), not this comparison's.
        worth, source, draft = max(options, key=lambda option: (bool(option[2].token_ids), option[0]))
        head = Draft([])
        if self.head is not None:
            seeds = self.head.needs_seed(request.request_id)
            # A round that may not seed leaves a head without its seed alone (the scheduler
            # priced the round without it).
            if may_seed or not seeds:
                head_worth = self._worth(geometric(self.rate(state, "mtp"), k), k, self.head_ms or 0.0)
                idle = state.idle_rounds + 1  # counting this round
                probe = not draft.token_ids and idle >= self.probe_rounds
                waits = seeds and idle < self.seed_after  # its seed waits for text the others cannot draft
                wins = head_worth > worth and not waits
                if wins or probe:
                    self.probes += not wins
                    head = self._run_head(request, k)
                    state.idle_rounds = 0
                elif not draft.token_ids:
                    state.idle_rounds = idle
            if head.token_ids:
                source, draft = "mtp", head
            else:  # adaptive K times head rounds only
                draft = replace(draft, catch_up_ms=None)
        if (suffix.seeded or head.seeded) and not (draft is head and head.seeded):
            draft = replace(draft, catch_up_ms=None, seeded=True)  # the call's time is a seed's, unsplit
        if draft.token_ids:
            self.chosen[source] += 1
            predicted = sum(suffix.confidence) if source == "suffix" else 0.0
            state.last = _Round(source, request.num_tokens, list(draft.token_ids), predicted, draft.parents)
        return draft

    def _run_head(self, request: Request, k: int) -> Draft:
        start = self.clock()
        head = self.head.propose(request, k)
        ms = (self.clock() - start) * 1000.0
        # A seeding round runs the head over the request's whole context, once: timed into
        # head_ms, that one cost made the head look too dear to run again, and a head that
        # never runs never corrects it.
        if not head.seeded and head.catch_up_ms is not None:
            self.head_ms = ms if self.head_ms is None else DECAY * self.head_ms + (1 - DECAY) * ms
        return head

    def _score_last(self, request: Request, state: _RequestState) -> None:
        """Count how the request's previous round went, once tokens follow its start."""
        last = state.last
        if last is None or request.num_tokens <= last.start:
            return
        state.last = None
        followed = request.tokens_between(last.start, min(request.num_tokens, last.start + len(last.tokens)))
        path, _ = draft_tree.accept(last.tokens, last.parents, lambda row, depth: followed[depth] if depth < len(followed) else -1)
        accepted = len(path)
        if last.source == "suffix":
            hits, tries = accepted, last.predicted  # the suffix drafter's calibration
        else:
            hits, tries = accepted, min(accepted + 1, len(last.tokens))
        state.rates[last.source].add(hits, tries)
        self.rates[last.source].add(hits, tries)

    def finish(self, request: Request) -> None:
        self.suffix.finish(request)

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        self.suffix.release(request_id)
        if self.head is not None:
            self.head.release(request_id)
