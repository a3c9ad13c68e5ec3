"""How many tokens each lane holder drafts this tick. Pure policy, no torch.

A round of K drafts adds K rows to the tick's forward, and every other stream in the
tick waits for them. Whether that pays depends on three things this module keeps:

* ``StepCost``: how long a forward of n rows takes (measured once per model and
  machine by the runner, ``engine/calibration.py``). On a CPU with weight-only int4
  kernels it is far from flat: every row costs its FMAs (on a 2-core AMD EPYC Zen 3, 5
  positions ~1.8x one, 9 ~2.6x), and a full batch plus a verify costs more than the batch alone.
* ``DraftTiming``: what drafting costs per token (an MTP head pass each; n-gram ~0), per
  round (an MTP head's catch-up on the positions verified since its last round) and on a
  request's first round (its seed: an MTP head's pass over the prompt).
* ``AcceptanceEstimate``: per request, the chance a draft token is accepted, from its
  recent rounds (counts decay, so it follows the text: a copy passage, then free prose).
* ``RoundOverhead``: what a round beside other streams costs on top of those two,
  measured on the engine's own ticks (its verification). The table times a forward, not
  a round.

``choose(...)`` then picks, for each holder in turn, the K in ``0..k_max`` that
maximises the tick's expected goodput, tokens out per ms::

    (tokens of the tick so far + E[tokens of this holder | K])
        / (cost(rows so far + K) + drafting time of the tick's drafts)
    E[tokens | K] = 1 + a + a^2 + ... + a^K      (accepted drafts, then the bonus token)

(a K > 0 must beat K = 0 by ``MIN_GAIN``), so a lone stream drafts deeply when its drafts
are good, and a holder in a full batch drafts only as much as its acceptance pays for.
A holder at K = 0 decodes classically this tick, and the scheduler ends its grant
(``SpecLane.end_grant``): where its drafts do not pay, a waiter's may. With no one
waiting, where the lane would grant it straight back, or without a grant budget, it keeps
the lane.

Cheap starts: a request whose drafter has a costly state to seed (auto's or the MTP
drafter's head) and has not seeded it is priced beside other streams at that seed; where
the seed does not pay, it is offered a round drafted the cheap way instead
(``ScheduledSeq.may_seed`` False: the suffix drafter or a lookup), priced at that way's
own timing (``DraftTiming``'s cheap means). Measured beside seven speculative chat streams
(8 streams through engines alone, 5 alternated batches of 128 tokens): a verbatim-copy
stream under auto never drafted (the heads' seeds, ~1.7 ms, priced every first round),
and now drafts (210 drafts, 112 accepted) and runs 1.22x its speed with speculation off
(1.04-1.33x; 0.98x without), the batch's aggregate unchanged (1.00x against 0.98x).
With its grant kept at K = 0 instead of ended, the same copy stream waited for seven
chat streams' whole grants and first held the lane after it had copied the paragraph.

Head-of-line guard: goodput alone would let a holder with near-certain drafts make every
co-batched stream wait for a tick twice as long (total tokens per ms still rise, but they
are the holder's). When other rows share the tick, the drafts may lengthen it by at most
``MAX_SLOWDOWN`` x the tick without them; a lone stream has no such limit.

Depth: the scheduler gives a holder up to ``--lone-draft-tokens`` (8) drafts when it is the
engine's one request (no other stream decoding, nothing to prefill or admit), else up to
``--num-draft-tokens`` (4). Alone, extra rows delay no one and a copy accepted whole pays
for them. Chosen on the drafts set's tuning half: `benchmarks/compare_k.py` (the engine)
gave answers the tenant wrote before 4.1-4.3x over off at K = 8, 2.9-3.0x at K = 4, and
first answers within noise (1.31x / 1.26x against 1.34x / 1.21x);
`benchmarks/tune_drafters.py --k 4,8` (the suffix drafter's replay, its whole grid at each
K) chose K = 8 with the suffix drafter's parameters unchanged (estimated geomean over
categories 1.46x against 1.44x at K = 4). In a shared tick the head-of-line guard alone let
K = 8 put the co-batched streams' p99 at 1.30x (`bench hol`; 1.24x at K = 4) and a closed
batch of 8 streams at 0.93x of speculation off (0.97x at K = 4), so a shared tick keeps the
K its guard was measured at.

Stopping: K = 0 is the one choice that ends the evidence, so a lone holder takes it only
when drafting would not pay even at an optimistic rate: the upper end, ``STOP_CONFIDENCE``
standard errors up, of its own rounds' rate over a longer record (``STOP_DECAY``) than the
estimate's, without the prior. Otherwise it drafts the best K > 0 at the estimate. Near the break-even
rate the estimate's noise decides: the MTP head accepts ~47% of first positions on chat, a
K = 2 round pays from ~34%, and on the estimate alone a few failed rounds send a stream to
K = 0 for most of its answer (`benchmarks/mtp_draft_length_replay.py` replays both rules).
A wasted lone round costs only the holder's own tick; in a shared tick the estimate alone
decides (a longer memory for the estimate, DECAY 0.9, keeps a copy stream beside four chat
streams at K = 4 where DECAY 0.8 drafts 1, and puts their p99 at 1.4-1.9x against 1.2x,
`bench hol`).

Exploration: a holder at K = 0 learns nothing about its drafts. A holder that has never
drafted probes first: in a shared tick with ``PROBE_K`` drafts, whatever the prior says (the
prior alone never buys a round that every co-batched stream waits for); alone, with as many
as the prior pays for (at least ``PROBE_K``), since a wrong guess costs only its own tick,
once, and a right one saves a round (a copy request's first round: up to 1 +
``--lone-draft-tokens`` tokens, not 2). A holder kept at K = 0 probes again after
``PROBE_EVERY`` held ticks without drafts: a stream whose text turns predictable is found
again, at the price of one extra row now and then. A probe happens only where the rate it
learns could be used. Alone: where some K would pay if every draft were accepted. Beside
other streams: where the probe itself, accepted, repays the tick's extra time
(``RoundOverhead`` included), since every co-batched stream pays for it. In a full batch
whose step cost rises steeply with rows (16 streams here: one row more costs ~28%), a
probe only taxes the tick (16 streams through engines alone: 0.925x of speculation off with
such probes, 0.948x without). With the MTP drafter at 8 and 16 streams (the drafts set's
tuning half, open chat and multi-turn; three runs of 5-7 batches) a round beside the others
cost 1.3-2.2 ms more than the table and the head's timing said, and at 8 streams the first
probes alone (34-46 a run of 5-7 batches, ~50% accepted) cost more than they returned. With
``RoundOverhead`` counted, `bench vs-llama-cpp`'s 8 streams through engines alone drafted
+0.8% rows with the MTP drafter (47 drafted, 19 accepted) where they drafted +3.8% (229,
84), and +1.8% with auto where +3.5%. What was left were first probes: a request's first
round seeds an MTP head on its prompt (~2 ms on those 46-token prompts, beside a plain tick
of ~11 ms), which a faded mean of tick residuals priced at 0.2-0.9 ms, so each request of
each batch probed once and paid ~1.2 ms of tick for it (the MTP engine 0.97x of itself with
speculation off per request, two runs of 7 batches). Timed by the drafter instead
(``Draft.seeded``, ``DraftTiming.ms_first_round``), no first probe beside 7 streams pays:
the same runs drafted nothing and read 0.99x and 0.98x (auto 1.00x and 0.98x; the rest is
per-tick Python: the scheduler's, the head's hand-off of hidden states). The price: a
request that first holds the lane in a tick of 8 streams is found to be predictable only
where its one-draft probe pays there, at the margin on this machine (one more token of 8
against the round's costs); in a tick of 4-5 streams it is found (`bench hol`). Held ticks without drafts leave the
counts alone (letting them fade would pull a poor drafter back to an engine-wide prior that
a copy stream can hold near 1, and it would draft and fail again every few ticks).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

PRIOR_WEIGHT = 1.0  # the prior counts as this many tried positions: one failed round outweighs it
DECAY = 0.8  # per observed round: the estimate follows the text
# A lone holder stops drafting only when its rate, this many standard errors optimistic,
# says drafting does not pay either (see "Stopping" in the module docstring), judged on a
# longer record of its rounds than the estimate's: at DECAY the evidence never exceeds ~5
# rounds' worth, which cannot rule a paying rate out, and a useless drafter drafted forever.
STOP_CONFIDENCE = 1.5
STOP_DECAY = 0.95
PROBE_EVERY = 16  # held ticks at K = 0 between probes (+1 row in one tick of 17)
PROBE_K = 1  # a probe's drafts: one verified token is evidence enough, and cheap (+1 row)
# Drafts must beat plain decoding by this factor: the calibration times the forward only,
# not verification bookkeeping or the estimate's own noise, and a round that merely
# breaks even taxes every other stream in the tick for nothing.
MIN_GAIN = 1.05
# A tick shared with other streams: drafts may cost at most +30%. Below the head-of-line
# target (co-batched streams' p99 within 1.5x) because a tick's mean is not its tail: at
# 1.5 a copy stream beside four chat streams puts their p99 at ~1.6x (`bench hol`: cheap glue
# kernels make the extra rows a large share of a tick); at 1.25, ~1.05x.
MAX_SLOWDOWN = 1.3
PRIOR_RATE = 0.7  # engine-wide prior before any round has been seen
MIN_PLAIN_TICKS = 3  # plain ticks of a width before a round's residual is measured against them
FOLLOW = 0.1  # the drafting and overhead means: each sample's weight once there are ten
FADE = 0.995  # RoundOverhead per shared tick without a round: half its value in ~140 such ticks


@dataclass(frozen=True)
class StepCost:
    """Milliseconds of one forward (with logits) by its number of rows (tokens)."""

    ms_by_rows: tuple[float, ...]  # ms_by_rows[n - 1] = a forward of n rows

    def __post_init__(self) -> None:
        if not self.ms_by_rows or not all(0 < ms < math.inf for ms in self.ms_by_rows):
            raise ValueError("StepCost needs positive times for 1..n rows")

    @classmethod
    def from_measurements(cls, ms_by_rows: Iterable[float]) -> StepCost:
        """Make noisy measurements non-decreasing: more rows never cost less."""
        out: list[float] = []
        for ms in ms_by_rows:
            out.append(max(ms, out[-1]) if out else ms)
        return cls(tuple(out))

    def ms(self, rows: int) -> float:
        table = self.ms_by_rows
        if rows <= len(table):
            return table[max(rows, 1) - 1]
        # Past the table: extend with its last step per row.
        per_row = (table[-1] - table[0]) / max(len(table) - 1, 1)
        return table[-1] + per_row * (rows - len(table))


@dataclass
class AcceptanceEstimate:
    """Decayed tried/accepted draft positions per request (``observe``), shrunk toward the
    engine-wide rate."""

    counts: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (tried, accepted)
    record: dict[str, tuple[float, float]] = field(default_factory=dict)  # the same at STOP_DECAY (stopping)
    idle_ticks: dict[str, int] = field(default_factory=dict)  # id -> held ticks at K = 0 since its last round
    engine_tried: float = 0.0
    engine_accepted: float = 0.0

    def prior(self) -> float:
        if self.engine_tried < 1:
            return PRIOR_RATE
        return self.engine_accepted / self.engine_tried

    def rate(self, request_id: str) -> float:
        tried, accepted = self.counts.get(request_id, (0.0, 0.0))
        return (accepted + PRIOR_WEIGHT * self.prior()) / (tried + PRIOR_WEIGHT)

    def optimistic_rate(self, request_id: str) -> float:
        """The upper end of the request's own rate, ``STOP_CONFIDENCE`` standard errors up:
        what its own rounds (the longer record, ``STOP_DECAY``) cannot yet rule out. The
        Agresti-Coull interval, so a run of failures still leaves room until there are
        enough of them; no prior, so an engine-wide rate held high by another stream (a
        copy) cannot keep it up."""
        tried, accepted = self.record.get(request_id, (0.0, 0.0))
        z2 = STOP_CONFIDENCE**2
        n = tried + z2
        centre = (accepted + z2 / 2) / n
        return min(1.0, centre + STOP_CONFIDENCE * (centre * (1 - centre) / n) ** 0.5)

    def observe(self, request_id: str, drafted: int, accepted: int) -> None:
        """A verified round: ``accepted`` of ``drafted`` tokens.

        The rate is per *tried* position, the chance a draft is accepted given the ones
        before it were (``expected_tokens``' ``a``): a round tried its accepted drafts and
        the first rejected one; the drafts after a rejection were never judged. Counted
        per drafted token, a head accepting 37% of first positions would read as ~25% at
        K=2 (0.37 + 0.37^2 accepted of 2 drafted), and adaptive K would leave it at K=0 for
        most of a chat answer (`bench mtp`)."""
        if drafted <= 0:
            return
        tried = min(drafted, accepted + 1)
        t, a = self.counts.get(request_id, (0.0, 0.0))
        self.counts[request_id] = (t * DECAY + tried, a * DECAY + accepted)
        t, a = self.record.get(request_id, (0.0, 0.0))
        self.record[request_id] = (t * STOP_DECAY + tried, a * STOP_DECAY + accepted)
        self.idle_ticks[request_id] = 0
        self.engine_tried = self.engine_tried * 0.99 + tried
        self.engine_accepted = self.engine_accepted * 0.99 + accepted

    def evidence(self, request_id: str) -> float:
        """Decayed number of this request's tried draft positions (diagnostics and tests)."""
        return self.counts.get(request_id, (0.0, 0.0))[0]

    def has_drafted(self, request_id: str) -> bool:
        return request_id in self.counts

    def idle(self, request_id: str) -> None:
        """A held tick without drafts (counted toward the next probe)."""
        self.idle_ticks[request_id] = self.idle_ticks.get(request_id, 0) + 1

    def due_for_probe(self, request_id: str) -> bool:
        """``PROBE_EVERY`` held ticks without drafts since its last verified round.

        A probe whose drafter proposed nothing (no n-gram match) verifies nothing, so the
        probe stays due and the next tick tries again: such a tick adds no row."""
        return self.idle_ticks.get(request_id, 0) >= PROBE_EVERY

    def forget(self, request_id: str) -> None:
        self.counts.pop(request_id, None)
        self.record.pop(request_id, None)
        self.idle_ticks.pop(request_id, None)


@dataclass
class DraftTiming:
    """What drafting costs, learnt from the drafter's proposals: milliseconds per proposed
    token (an MTP head costs a pass per token; the n-gram drafter next to nothing), per
    round (an MTP head first catches up on the positions verified since its last round,
    whatever K), and per request's first round (what its seed costs: an MTP head's pass
    over the prompt, the suffix drafter's index of it; 0 where the first round drafts
    without seeding, by prompt lookup, and a head behind the lookup seeds at a later
    round, priced as a round). All are part of the round's time.

    Kept apart because they scale differently: charged per token, one catch-up makes a
    one-draft round look twice its per-token cost, adaptive K then drafts less, and every
    round catches up on more positions (`bench mtp`). A seed, once per request, is several
    later rounds' catch-up (an MTP head here: ~2 ms on a 46-token prompt against ~0.4 ms),
    so it is neither: averaged into the catch-up it made every later round look dear, left
    out it made a first probe beside other streams look cheap (``choose``). Until a first
    round is measured it is 0: the engine's first probe measures it."""

    ms_per_token: float = 0.0
    ms_per_round: float = 0.0
    ms_first_round: float = 0.0
    first_rounds: int = 0
    timed_rounds: int = 0  # rounds behind ms_per_token and ms_per_round
    # id -> (its rounds in a row drafted the cheap way, their mean ms a call) (``own_costs``)
    cheap_runs: dict[str, tuple[int, float]] = field(default_factory=dict)
    # The cheap way engine-wide: a call, and a first round that could not seed the costly
    # state (``ScheduledSeq.may_seed`` False: the suffix drafter's index of the prompt).
    ms_cheap_round: float = 0.0
    cheap_rounds: int = 0
    ms_cheap_first_round: float = 0.0
    cheap_first_rounds: int = 0

    def observe(self, draft_ms: float, tokens: int, catch_up_ms: float | None = 0.0,
                request_id: str | None = None) -> None:
        """One proposal: ``draft_ms`` drafting its ``tokens``, ``catch_up_ms`` catching up
        (None: drafted its cheap way, a lookup; ``draft_ms`` is then the whole call's)."""
        if tokens <= 0:
            return  # nothing proposed (no n-gram match): says nothing about the next round
        if catch_up_ms is not None:  # the engine-wide costs are the drafter's costly way's
            self.timed_rounds += 1
            self.ms_per_token = _running_mean(self.ms_per_token, draft_ms / tokens, self.timed_rounds)
            self.ms_per_round = _running_mean(self.ms_per_round, catch_up_ms, self.timed_rounds)
            if request_id is not None:
                self.cheap_runs.pop(request_id, None)  # drafted the costly way: priced so again
        else:
            self.cheap_rounds += 1
            self.ms_cheap_round = _running_mean(self.ms_cheap_round, draft_ms, self.cheap_rounds)
            if request_id is not None:
                rounds, call_ms = self.cheap_runs.get(request_id, (0, 0.0))
                self.cheap_runs[request_id] = (rounds + 1, _running_mean(call_ms, draft_ms, rounds + 1))

    def own_costs(self, request_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
        """(ms per token, ms per round) of each request whose last round was drafted the
        cheap way (prompt lookup, auto's suffix drafter): that way's cost, the call a
        round, until a round of the request is drafted the costly way again. ``--drafter
        auto`` times its head's rounds engine-wide, and a stream whose rounds are the
        suffix drafter's (~0.05 ms a call) priced at the head's (~0.3 ms a token and ~0.7
        ms a round here) drafted K = 5 alone where the suffix drafter drafts 8. Only a run
        of cheap rounds: the drafter picks its way after K is chosen, so when the text
        stops matching, the head drafts one round at the cheap price, and the next is the
        head's again (a mean over both ways would price it low for several rounds, past the
        head-of-line guard's reckoning)."""
        return {rid: (0.0, self.cheap_runs[rid][1]) for rid in request_ids if rid in self.cheap_runs}

    def forget(self, request_id: str) -> None:
        self.cheap_runs.pop(request_id, None)

    def observe_first_round(self, seed_ms: float, *, may_seed: bool = True) -> None:
        """A request's first round: ``seed_ms`` its drafter spent seeding (0: none);
        ``may_seed`` False: a round that could not seed the drafter's costly state (an MTP
        head's), the first of a request started the cheap way (``choose``'s ``unseeded``)."""
        if may_seed:
            self.first_rounds += 1
            self.ms_first_round = _running_mean(self.ms_first_round, seed_ms, self.first_rounds)
        else:
            self.cheap_first_rounds += 1
            self.ms_cheap_first_round = _running_mean(self.ms_cheap_first_round, seed_ms, self.cheap_first_rounds)


@dataclass
class RoundOverhead:
    """What a round beside other streams costs on top of the step cost table and
    ``DraftTiming``, measured on the engine's own ticks: milliseconds per round.

    The table times a forward of n positions of one sequence. A round in a tick of other
    streams also verifies: logits and choices for its drafts, its kept hidden states for
    an MTP head. Here, 8 and 16 streams with the MTP drafter: the table said a draft row
    beside them costs next to nothing, and a tick with a round took more than its timed
    drafting and a plain tick of as many rows. So the scheduler times every decode tick:
    a tick without drafts sets the plain time of its rows; a tick with rounds, less its
    timed drafting (seeds included), its plain rows' time and the table's step to its
    drafted rows, leaves the residual, each round its share. ``choose`` adds it to a round
    in a shared tick (a lone holder's rounds delay no one, and its K was tuned on the table
    alone).

    The mean fades while shared ticks go without rounds (``FADE`` a plain tick): once an
    overhead stops shared drafting nothing measures it, and a value that one slow stretch
    set would otherwise stop it for the engine's life; faded, probes come back and measure
    it again."""

    plain_ms: dict[int, float] = field(default_factory=dict)  # rows -> a decode tick without drafts
    plain_ticks: dict[int, int] = field(default_factory=dict)
    ms_per_round: float = 0.0
    rounds: int = 0

    def observe(self, rows: int, drafted: int, rounds: int, forward_ms: float, cost: StepCost) -> None:
        """A decode tick of ``rows`` sequences and ``drafted`` draft rows in ``rounds`` rounds;
        ``forward_ms``: its time less its drafters' timed proposals and seeds."""
        if rounds == 0:
            seen = self.plain_ticks.get(rows, 0) + 1
            self.plain_ticks[rows] = seen
            self.plain_ms[rows] = _running_mean(self.plain_ms.get(rows, 0.0), forward_ms, seen)
            if rows > 1:
                self.ms_per_round *= FADE
            return
        if rows < 2 or self.plain_ticks.get(rows, 0) < MIN_PLAIN_TICKS:
            return  # a lone holder's tick, or no plain tick of these rows to compare with yet
        residual = forward_ms - self.plain_ms[rows] - (cost.ms(rows + drafted) - cost.ms(rows))
        bound = cost.ms(rows)  # one sample moves the mean at most a plain tick's worth (a pause, a collection)
        self.rounds += 1
        self.ms_per_round = _running_mean(self.ms_per_round, min(bound, max(-bound, residual / rounds)), self.rounds)

    def shared_round_ms(self) -> float:
        """What ``choose`` adds to a round in a shared tick (the table is its floor)."""
        return max(0.0, self.ms_per_round)


def _running_mean(current: float, sample: float, seen: int, follow: float = FOLLOW) -> float:
    """The mean of the first samples (``seen`` counts this one), then a mean that follows
    the machine, each new sample weighing ``follow``."""
    return current + (sample - current) * max(follow, 1.0 / seen)


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a round of k drafts yields on average: 1 + a + ... + a^k."""
    return sum(rate**i for i in range(k + 1))


class DraftLengths(dict[str, int]):
    """``choose``'s answer: K per holder, and ``without_seed``, the holders whose round must
    not seed their drafter's costly state (``ScheduledSeq.may_seed`` False)."""

    def __init__(self, lengths: Mapping[str, int] | None = None, without_seed: Iterable[str] = ()):
        super().__init__(lengths or {})
        self.without_seed = frozenset(without_seed)


def choose(holders: list[tuple[str, int]], base_rows: int, base_tokens: float, cost: StepCost,
           acceptance: AcceptanceEstimate, draft_ms_per_token: float = 0.0,
           draft_ms_per_round: float = 0.0, shared_round_ms: float = 0.0,
           draft_ms_first_round: float | None = None, first_rounds: Container[str] | None = None,
           own_draft_ms: Mapping[str, tuple[float, float]] | None = None,
           unseeded: Container[str] | None = None, draft_ms_cheap_round: float = 0.0,
           draft_ms_cheap_first_round: float = 0.0) -> DraftLengths:
    """K for each holder (id, most drafts allowed), holders in the given order.

    ``base_rows``: rows of the tick without any drafts (every decode row, the holders' own
    included; the scheduler does not count a prompt chunk here); ``base_tokens``: tokens
    those rows produce;
    ``draft_ms_per_token`` / ``draft_ms_per_round`` / ``draft_ms_first_round``: what
    proposing one draft token, one round whatever its K, and a request's first round
    (its seed, instead of a round's catch-up) cost (``DraftTiming``; the first's
    default: a round's); ``shared_round_ms``: what a round beside other streams costs on
    top (``RoundOverhead``). ``first_rounds``: the holders whose next round is their
    drafter's first (default: those that have never drafted; the scheduler also counts a
    request whose drafter state a preemption dropped). A lone holder's first round is
    priced as any round: its seed delays no one and is paid once, whenever it first drafts.
    ``own_draft_ms``: (ms per token, ms per round) of the holders whose last rounds were
    drafted the drafter's cheap way (``DraftTiming.own_costs``), in place of the
    engine-wide two (a first round's seed is still ``draft_ms_first_round``).

    ``unseeded`` (None: every round may seed): the holders whose drafter has not yet had a
    round that could seed its costly state (an MTP head's pass over the context, the
    ``draft_ms_first_round`` these holders are priced at). Beside other streams, where that
    seed does not pay, such a holder is offered a round drafted the cheap way instead
    (``without_seed``): priced at ``draft_ms_cheap_first_round`` if it is its drafter's
    first, else its own cheap calls or ``draft_ms_cheap_round``, nothing a token. The mean
    seed of chat requests' heads (~2 ms here) kept a copy stream beside seven chat streams
    from ever drafting, where its suffix drafter's seed costs ~0.1 ms.
    """
    drafting = 0.0  # ms of the drafts chosen so far
    shared = base_rows > 1  # other streams' rows wait for this tick too
    overhead = shared_round_ms if shared else 0.0
    # A first round's drafting beside others is its seed; alone, or unmeasured, any round's.
    first_round_ms = draft_ms_first_round if shared and draft_ms_first_round is not None else draft_ms_per_round

    def tick_ms(total_rows: int, extra_drafts: int, per_token_ms: float, round_ms: float) -> float:
        return cost.ms(total_rows) + drafting + extra_drafts * per_token_ms + (round_ms if extra_drafts else 0.0)

    def decide(request_id: str, k_max: int, first: bool, per_token_ms: float, round_ms: float) -> int:
        holder_ms = functools.partial(tick_ms, per_token_ms=per_token_ms, round_ms=round_ms)
        rate = acceptance.rate(request_id)
        best = MIN_GAIN * tokens / holder_ms(rows, 0)  # what a K > 0 must beat
        if shared:
            while k_max > 0 and holder_ms(rows + k_max, k_max) > ceiling:
                k_max -= 1
        best_k = _best_k(rate, k_max, best, tokens, rows, holder_ms)
        # A lone holder stops only when an optimistic rate agrees (see Stopping); else it
        # drafts the best K > 0 at its estimate.
        stopping = best_k == 0 and not shared and k_max > 0 and not first
        if stopping and _best_k(acceptance.optimistic_rate(request_id), k_max, best, tokens, rows, holder_ms):
            best_k = _best_k(rate, k_max, 0.0, tokens, rows, holder_ms)
        periodic = not first and best_k == 0 and k_max > 0 and acceptance.due_for_probe(request_id)
        probe = min(k_max, PROBE_K)
        # A probe learns a rate; it happens only where a rate could be used: beside other
        # streams, where its own drafts, all accepted, repay the tick's extra time; alone,
        # where some K's would (a wrong guess costs only the stream's own tick).
        pays = (first or periodic) and _best_k(1.0, probe if shared else k_max, best, tokens, rows, holder_ms) > 0
        if first and shared:
            best_k = probe if pays else 0  # the prior alone never buys a round beside others
        elif first and pays:
            best_k = max(best_k, probe)
        elif periodic and pays:
            best_k = probe  # a periodic probe: has the text turned predictable?
        return best_k

    rows, tokens = base_rows, base_tokens
    chosen: dict[str, int] = {}
    without_seed: list[str] = []
    ceiling = MAX_SLOWDOWN * cost.ms(base_rows)
    own = own_draft_ms or {}
    for request_id, k_max in holders:
        first = not acceptance.has_drafted(request_id)  # never drafted: probe (see Exploration)
        drafter_first = first if first_rounds is None else request_id in first_rounds
        seeding = drafter_first if unseeded is None else request_id in unseeded
        per_token_ms, per_round_ms = own.get(request_id, (draft_ms_per_token, draft_ms_per_round))
        round_ms = (first_round_ms if seeding and (shared or drafter_first) else per_round_ms) + overhead
        k = decide(request_id, k_max, first, per_token_ms, round_ms)
        if k == 0 and shared and seeding and unseeded is not None:
            per_token_ms, cheap_ms = own.get(request_id, (0.0, draft_ms_cheap_round))
            round_ms = (draft_ms_cheap_first_round if drafter_first else cheap_ms) + overhead
            k = decide(request_id, k_max, first, per_token_ms, round_ms)
            if k:
                without_seed.append(request_id)
        chosen[request_id] = k
        rows += k
        drafting += k * per_token_ms + (round_ms if k else 0.0)
        tokens += expected_tokens(acceptance.rate(request_id), k) - 1
    return DraftLengths(chosen, without_seed)


def _best_k(rate: float, k_max: int, to_beat: float, tokens: float, rows: int, tick_ms) -> int:
    """The K in 1..k_max of the highest goodput above ``to_beat`` at ``rate``, else 0."""
    best_k = 0
    gained, power = tokens, 1.0  # tokens - 1 + expected_tokens(rate, k), a term a K
    for k in range(1, k_max + 1):
        power *= rate
        gained += power
        goodput = gained / tick_ms(rows + k, k)
        if goodput > to_beat:
            best_k, to_beat = k, goodput
    return best_k
