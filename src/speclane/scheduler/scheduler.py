"""The scheduler: who is admitted, who prefills how much, who decodes, who speculates.

Pure policy: no torch, no I/O; time comes in as ``now`` (seconds). One rule covers
every kind of work: a request is "computed up to ``num_computed_tokens``, wants up to
``num_tokens``" and each tick lets the first catch up — a prefill chunk, a decode
step and a verified draft are all token counts in the plan.

Per tick (``schedule``):
1. the lane (``lane.py``) picks this tick's holders at the round boundary;
2. every running request that has finished its prompt decodes one step (holders
   draft and verify ``K + 1`` positions instead);
3. prompts being prefilled get chunks from what is left of the token budget;
4. waiting requests are admitted in ``KVManager.admission_key`` order (most urgent
   priority, then the tenant holding the fewest KV blocks per unit of weight, then
   arrival) while fewer than ``max_num_seqs`` run and the KV pool has their blocks
   (``kv_manager.py``), stopping at the first that does not fit; prompt tokens found in
   the prefix cache are not computed again. A request that shares its prompt with
   another (``prefill_source``: the ``n`` sequences of one request) waits until that one
   has prefilled, then reads its prompt's full blocks through the prefix cache; if the
   source has already left, it prefills on its own. Likewise a request whose prompt
   starts with full blocks a running request of its cache scope is still prefilling (a
   system prompt shared by chats that arrive together) waits until they are computed and
   reads them from the cache (``_awaits_prefill``); admission stops there for the tick, so
   it keeps its place in that order.

Before the plan each decoding request reserves the KV blocks of its fed token and its K
draft positions; a request that cannot get them preempts a request of the tenant most
over its share, never of a tenant holding less than its own (``KVManager.reserve``),
which goes back to waiting with its output kept and is recomputed when admitted again
(``_preempt``).

Per tick (``update``), from the plan and the runner's chosen tokens: each request's
computed length (committed to the KV manager, which caches the blocks it filled), its output (stopping exactly at EOS, a stop token, ``max_tokens`` or
the context), its speculative accounting and the lane's. This is the only place a
request advances and the only place speculation is counted (``counts.py``).

``--spec-mode burst`` is the baseline the benchmarks compare the lane against: a holder
runs alone, one round per tick, until it finishes, and nobody else is scheduled.
"""

from __future__ import annotations

from dataclasses import dataclass

from speclane.config import LaneConfig, SchedulerConfig
from speclane.request import Request, RequestStatus
from speclane.scheduler import draft_length
from speclane.scheduler.block_pool import KV_BLOCK_SIZE
from speclane.scheduler.counts import ScheduleCounts, TenantNames, TenantTally
from speclane.scheduler.kv_manager import KVManager
from speclane.scheduler.lane import SpecLane
from speclane.scheduler.plan import RunnerResult, ScheduledSeq, SchedulerPlan, SeqResult


def default_kv_blocks(config: SchedulerConfig, lane_config: LaneConfig, max_model_len: int) -> int:
    """Room for ``max_num_seqs`` requests of ``max_model_len`` tokens and a round's most draft
    positions (``LaneConfig.max_draft_tokens``)."""
    return config.max_num_seqs * -(-(max_model_len + lane_config.max_draft_tokens + 1) // KV_BLOCK_SIZE)


def most_blocks(num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_size: int) -> int:
    """The most KV blocks a request can hold at once: its last token is never fed, and a
    draft never reaches past ``max_tokens`` or the context (``_draft_budget``), so its
    positions stay below min(prompt + max_tokens, max_model_len) - 1."""
    positions = min(num_prompt_tokens + max_tokens, max_model_len) - 1
    return -(-positions // block_size)


def check_request_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_size: int,
                       pool_blocks: int) -> None:
    """``ValueError`` for a request no engine of this shape can ever run: a prompt that
    fills the context, or one whose most KV blocks at once exceed the whole pool (it
    would wait forever). A cluster's front checks it too, before queueing."""
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"the prompt has {num_prompt_tokens} tokens but --max-model-len is {max_model_len}: "
            "shorten the prompt (at least one token must be left for the completion)"
        )
    need = most_blocks(num_prompt_tokens, max_tokens, max_model_len, block_size)
    if need > pool_blocks:
        raise ValueError(
            f"the prompt has {num_prompt_tokens} tokens and max_tokens is {max_tokens}: "
            f"that takes up to {need} KV blocks of {block_size} positions but the KV pool holds {pool_blocks} "
            "(--kv-cache-mib): ask for fewer tokens or shorten the prompt"
        )


class QueueFullError(RuntimeError):
    """The waiting queue holds ``--max-queue`` requests; the client should retry later."""


@dataclass
class TokenEvent:
    """New tokens of one request after a tick, and whether it finished."""

    request: Request
    new_token_ids: list[int]
    finished: bool


class Scheduler:
    def __init__(self, config: SchedulerConfig, lane_config: LaneConfig, max_model_len: int, *,
                 num_kv_blocks: int | None = None, step_cost: draft_length.StepCost | None = None,
                 record_lane_events: bool = True, cheap_starts: bool = False):
        """``num_kv_blocks``: the KV pool's blocks (None: ``default_kv_blocks``);
        ``cheap_starts``: the drafter has a costly state to seed and drafts without it where
        a round may not seed (``Drafter.cheap_starts``): adaptive K then offers such rounds."""
        self.config = config
        self.lane_config = lane_config
        self.max_model_len = max_model_len
        blocks = num_kv_blocks if num_kv_blocks is not None else default_kv_blocks(config, lane_config, max_model_len)
        self.kv = KVManager(blocks, enable_prefix_cache=config.prefix_cache)
        # The tenants the per-tenant tallies name, shared by the lane's, the counts' and the engine's.
        self.tenant_names = TenantNames()
        self.lane = SpecLane(lane_config, record_events=record_lane_events, tenant_names=self.tenant_names)
        self.waiting: dict[str, Request] = {}
        self.running: dict[str, Request] = {}  # admission order
        self._released: list[str] = []
        self._preempted: list[str] = []
        self._in_lane: set[str] = set()
        # Adaptive K (draft_length.py): the runner's measured step cost (the engine
        # calibrates it); None = every holder drafts its full budget.
        self.step_cost = step_cost
        self.counts = ScheduleCounts(rounds_by_tenant=TenantTally(names=self.tenant_names))
        # This tick's rounds, per request: (output length before it, drafted, accepted), for
        # a stop string the engine finds in the tokens the round appended (``stop_at``).
        self._last_round: dict[str, tuple[int, int, int]] = {}
        self._burst_holder: str | None = None  # --spec-mode burst: the holder running alone
        self._burst_ms = 0.0  # the wall time of its rounds so far
        self.acceptance = draft_length.AcceptanceEstimate()
        self.draft_timing = draft_length.DraftTiming()
        self.round_overhead = draft_length.RoundOverhead()
        # Requests whose drafter state has had its first round (seeded or drafted) since it
        # was made: a round of any other is priced as a first round (DraftTiming.ms_first_round).
        self._drafter_started: set[str] = set()
        # Of those, the ones that have had a round that could seed their drafter's costly
        # state (``ScheduledSeq.may_seed``); the others started the cheap way (``choose``'s
        # ``unseeded``) and are priced at the costly seed until they have.
        self._seed_offered: set[str] = set()
        self.cheap_starts = cheap_starts
        self._held_without_drafts: set[str] = set()  # holders given K = 0 in the current tick

    # -- requests in and out ------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Request | None:
        return self.running.get(request_id) or self.waiting.get(request_id)

    def add_request(self, request: Request, now: float) -> None:
        if request.request_id in self.waiting or request.request_id in self.running:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        check_request_fits(request.num_prompt_tokens, request.sampling.max_tokens, self.max_model_len,
                           self.kv.block_size, self.kv.pool.num_blocks)
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFullError(f"the queue is full ({self.config.max_queue} requests waiting); retry later")
        request.status = RequestStatus.WAITING
        self.waiting[request.request_id] = request

    def abort_request(self, request_id: str, now: float, status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> Request | None:
        """Stop a request wherever it is; its KV blocks are free for the next tick. A
        waiting request may have run before (preempted: the runner kept its sampling stream,
        grammar state and token history to resume it), so it is released like a finished one."""
        request = self.waiting.pop(request_id, None)
        if request is not None:
            request.status = status
            self._released.append(request_id)
            self.acceptance.forget(request_id)
            self.draft_timing.forget(request_id)
            return request
        if request_id in self.running:
            return self._finish(self.running[request_id], status, now)
        return None

    def stop_at(self, request: Request, num_output_tokens: int, now: float) -> None:
        """A stop string ends ``request`` after ``num_output_tokens`` tokens (the detokenizer
        found it, in the tokens of this tick's ``update``): keep those, count its speculation
        only up to them, and finish it with ``FINISHED_STOPPED`` (also when it already
        finished this tick for another reason). As for a round that ends at EOS, the tick's
        round counts as drafting and accepting the tokens it kept, when it kept fewer than
        it appended (its later drafts lie past the stop)."""
        last = self._last_round.pop(request.request_id, None)
        if last is not None:
            start, drafted, accepted = last
            kept = max(0, num_output_tokens - start)
            if kept < request.num_output_tokens - start:
                # kept <= accepted: the kept tokens of the round are its first drafts.
                request.spec.draft_tokens -= drafted - kept
                request.spec.accepted_tokens -= accepted - kept
                self.counts.recount_round(drafted=drafted, accepted=accepted, kept=kept)
        del request.output_token_ids[num_output_tokens:]
        if request.request_id in self.running:
            self._finish(request, RequestStatus.FINISHED_STOPPED, now)
        else:
            request.status = RequestStatus.FINISHED_STOPPED

    def _finish(self, request: Request, status: RequestStatus, now: float) -> Request:
        request.status = status
        rid = request.request_id
        del self.running[rid]
        self.kv.free(rid)
        self._leave_lane(rid, now)
        self._released.append(rid)
        self.acceptance.forget(rid)
        self.draft_timing.forget(rid)
        self._drafter_started.discard(rid)
        self._seed_offered.discard(rid)
        return request

    def _preempt(self, request_id: str, now: float) -> None:
        """``request_id`` lost its KV blocks (``KVManager.reserve`` freed them): back to
        waiting with its output kept, recomputed from position 0 when admitted again."""
        request = self.running.pop(request_id)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        self._leave_lane(request_id, now)
        self._preempted.append(request_id)
        self._drafter_started.discard(request_id)  # the runner drops its drafter state: it seeds again
        self._seed_offered.discard(request_id)
        self.waiting[request_id] = request

    def _leave_lane(self, rid: str, now: float) -> None:
        if rid in self._in_lane:
            if self._burst_holder == rid:  # a whole burst is one round of its grant
                self.lane.round_done(rid, elapsed_ms=self._burst_ms, now=now)
            self._in_lane.discard(rid)
            self.lane.remove(rid, now)
        if self._burst_holder == rid:
            self._burst_holder, self._burst_ms = None, 0.0

    # -- one tick -----------------------------------------------------------------------
    def _lane_active(self) -> bool:
        return self.lane_config.speculation_enabled

    def _draft_budget(self, request: Request, most: int) -> int:
        """Draft tokens worth proposing, at most ``most``: never past max_tokens or the context."""
        left = min(
            request.sampling.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )
        return max(0, min(most, left - 1))

    @property
    def _adaptive_k(self) -> bool:
        """Adaptive K is on and has a step cost to decide by."""
        return self.step_cost is not None and self.lane_config.spec_adaptive_k

    def _draft_lengths(self, decoding: list[Request], holders: set[str]) -> draft_length.DraftLengths:
        """K of each holder decoding this tick: its budget, or with a step cost (adaptive K)
        the K that maximises the tick's expected goodput (``draft_length.choose``), up to
        ``lone_draft_tokens`` for the one request the engine has (nothing to prefill or admit
        beside it: its extra rows delay no one), ``num_draft_tokens`` otherwise (draft_length's
        "Depth")."""
        adaptive = self._adaptive_k
        # A waiter that no slot can take this tick (max_num_seqs 1) shares nothing with it.
        alone = len(self.running) == 1 and (not self.waiting or self.config.max_num_seqs == 1)
        most = self.lane_config.max_draft_tokens if adaptive and alone else self.lane_config.num_draft_tokens
        caps = [(r.request_id, self._draft_budget(r, most)) for r in decoding if r.request_id in holders]
        if not adaptive:
            return draft_length.DraftLengths(dict(caps))
        timing = self.draft_timing
        return draft_length.choose(caps, base_rows=len(decoding), base_tokens=len(decoding), cost=self.step_cost,
                                   acceptance=self.acceptance, draft_ms_per_token=timing.ms_per_token,
                                   draft_ms_per_round=timing.ms_per_round, draft_ms_first_round=timing.ms_first_round,
                                   first_rounds={rid for rid, _ in caps if rid not in self._drafter_started},
                                   own_draft_ms=timing.own_costs(rid for rid, _ in caps),
                                   shared_round_ms=self.round_overhead.shared_round_ms(),
                                   unseeded={rid for rid, _ in caps if rid not in self._seed_offered}
                                   if self.cheap_starts else None,
                                   draft_ms_cheap_round=timing.ms_cheap_round,
                                   draft_ms_cheap_first_round=timing.ms_cheap_first_round)

    def take_released(self) -> tuple[str, ...]:
        """Requests that left since the last call (their drafter state can go)."""
        released, self._released = tuple(self._released), []
        return released

    def _take_preempted(self) -> tuple[str, ...]:
        preempted, self._preempted = tuple(self._preempted), []
        return preempted

    def schedule(self, now: float) -> SchedulerPlan:
        released = self.take_released()
        if self.lane_config.spec_mode == "burst":
            burst = self._burst_seq(now)
            if burst is not None:
                return SchedulerPlan(seqs=(burst,), released_request_ids=released,
                                     preempted_request_ids=self._take_preempted())
        holders = set(self.lane.schedule(now)) if self._lane_active() and self.lane_config.spec_mode == "slice" else set()

        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        decoding = [r for r in self.running.values() if r.caught_up]
        draft_lengths = self._draft_lengths(decoding, holders)
        self._held_without_drafts = {rid for rid, k in draft_lengths.items() if k == 0}
        for request in decoding:
            k = draft_lengths.get(request.request_id, 0)
            if request.request_id in self.running and self._reserve(request, request.num_tokens + k, now):
                seqs.append(self._decode_seq(request, k, may_seed=request.request_id not in draft_lengths.without_seed))
        seqs = [seq for seq in seqs if seq.request_id in self.running]  # not preempted by a later one
        budget -= sum(len(seq.token_ids) + seq.num_draft_tokens for seq in seqs)
        for request in list(self.running.values()):
            if not request.caught_up and (budget > 0 or not seqs):
                seq = self._prefill_seq(request, budget)
                seqs.append(seq)
                budget -= len(seq.token_ids)
        copies: list[tuple[int, int, int]] = []
        while self.waiting and len(self.running) < self.config.max_num_seqs and (budget > 0 or not seqs):
            ready = [r for r in self.waiting.values() if self._may_admit(r)]
            if not ready:
                break  # only requests waiting for their prompt's source to prefill
            request = min(ready, key=lambda r: self.kv.admission_key(r.priority, r.tenant, r.tenant_weight, r.arrival_s))
            if self._awaits_prefill(request):
                break  # it keeps its place: nobody behind it takes the slot, the blocks or the budget first
            if not self.config.enable_chunked_prefill and seqs and request.num_tokens > budget:
                break  # the whole prompt must fit in one tick; wait for a lighter one
            admission = self.kv.admit(request.request_id, request, tenant=request.tenant, weight=request.tenant_weight,
                                      priority=request.priority, global_scope=request.global_cache_scope,
                                      read_cache=not request.needs_prompt_logprobs)
            if admission is None:
                break  # the pool is full of live requests: wait until one leaves
            if admission.copy is not None:
                copies.append(admission.copy)
            del self.waiting[request.request_id]
            request.status = RequestStatus.RUNNING
            self.running[request.request_id] = request
            request.num_computed_tokens = admission.num_cached_tokens
            if request.num_cached_tokens is None:  # counted from the first admission
                request.num_cached_tokens = admission.num_cached_tokens
            seq = self._prefill_seq(request, budget)
            seqs.append(seq)
            budget -= len(seq.token_ids)
        return SchedulerPlan(seqs=tuple(seqs), released_request_ids=released, preempted_request_ids=self._take_preempted(),
                             kv_copies=tuple(copies))

    def _reserve(self, request: Request, upto: int, now: float) -> bool:
        """KV blocks for ``request``'s positions below ``upto``, preempting by the KV rules
        where the pool is full; False when it was preempted itself."""
        reservation = self.kv.reserve(request.request_id, upto)
        for victim in reservation.preempted:
            self._preempt(victim, now)
        return reservation.ok

    def _may_admit(self, request: Request) -> bool:
        """False while the request's prompt source is still to prefill its prompt."""
        if request.prefill_source is None:
            return True
        source = self.running.get(request.prefill_source)
        if source is not None and request.num_prompt_tokens > 1:
            return source.prefill_done
        if source is None and request.prefill_source in self.waiting:
            return False
        request.prefill_source = None  # the source left (or never came): prefill alone
        return True

    def _awaits_prefill(self, request: Request) -> bool:
        """True while a running request of the same cache scope is still prefilling the
        prefix this one's prompt starts with (``KVManager.awaits_shared_prefix``): several
        chats with one system prompt, arriving together, compute it once, and the first of
        them gets its first token sooner than if all were prefilled side by side."""
        return (not request.needs_prompt_logprobs
                and self.kv.awaits_shared_prefix(request, tenant=request.tenant, global_scope=request.global_cache_scope))

    def _burst_seq(self, now: float) -> ScheduledSeq | None:
        """The burst holder's next round, granting the lane first if nobody holds a burst.
        The lane is not consulted again until the holder finishes: it runs to completion."""
        if self._burst_holder is None and self._lane_active():
            holders = self.lane.schedule(now)
            if holders:
                self._burst_holder = min(holders, key=list(self.running).index)
        if self._burst_holder is None:
            return None
        request = self.running[self._burst_holder]
        k = self._draft_budget(request, self.lane_config.num_draft_tokens)  # K every round, alone
        if not self._reserve(request, request.num_tokens + k, now):
            return None  # preempted (its burst ended with it)
        return self._decode_seq(request, k)

    def _decode_seq(self, request: Request, num_draft_tokens: int, may_seed: bool = True) -> ScheduledSeq:
        start = request.num_computed_tokens
        return ScheduledSeq(
            request=request,
            block_table=self.kv.block_table(request.request_id),
            start=start,
            token_ids=tuple(request.tokens_between(start, request.num_tokens)),
            sample=True,
            num_draft_tokens=num_draft_tokens,
            may_seed=may_seed,
        )

    def _prefill_seq(self, request: Request, budget: int) -> ScheduledSeq:
        """The next chunk of the prompt, or for a preempted request of every token it has
        (its output too); it samples after the last known token."""
        start = request.num_computed_tokens
        remaining = request.num_tokens - start
        chunk = min(remaining, max(budget, 1)) if self.config.enable_chunked_prefill else remaining
        return ScheduledSeq(
            request=request,
            block_table=self.kv.block_table(request.request_id),
            start=start,
            token_ids=tuple(request.tokens_between(start, start + chunk)),
            sample=start + chunk == request.num_tokens,
        )

    def _time_tick(self, plan: SchedulerPlan, result: RunnerResult) -> None:
        """A decode tick's time for ``RoundOverhead``. Left out: ticks with a prompt chunk
        or a KV copy (rows without logits, other work), and ticks with a constrained or
        logprobs request (masking and log-softmax rows that other requests' rounds do not
        pay), and a tick whose planned rounds all proposed nothing (neither plain nor a round)."""
        seqs = plan.seqs
        if plan.kv_copies or not all(seq.sample and len(seq.token_ids) == 1 and seq.start >= seq.request.num_prompt_tokens
                                     and seq.request.grammar is None and seq.request.sampling.logprobs is None for seq in seqs):
            return
        rounds = drafted = 0
        for res in result.seqs:
            if res.num_draft_tokens:
                rounds += 1
                drafted += res.num_draft_tokens
        if rounds == 0 and any(seq.is_round for seq in seqs):
            return
        drafting_ms = (sum(ms + (catch_up_ms or 0.0) for _, ms, _, catch_up_ms in result.draft_timings)
                       + sum(call_ms for _, _, call_ms in result.seed_timings))
        self.round_overhead.observe(len(seqs), drafted, rounds, result.elapsed_ms - drafting_ms, self.step_cost)

    def _time_first_rounds(self, plan: SchedulerPlan, result: RunnerResult) -> None:
        """What a request's first round costs its drafter (``DraftTiming``), once per drafter
        state: the seed's time where the round seeded, 0 where it drafted without seeding (a
        prompt lookup's); a round that did neither is not one (the next round tries again).
        Timed apart: a first round that could not seed the costly state (``may_seed``
        False), and the first that could. A request that started the cheap way has had its
        first round: its first round that may seed is timed only if it seeded (one in which
        auto left its head out, its suffix drafter's draft being worth more, says nothing of
        a seed's cost: counted at 0 it made the head's seed look cheap beside other
        streams). Either way the seed has been offered: its later rounds are priced as
        rounds (a head seeded later, when auto first runs it, goes unpriced, once).
        A request preempted loses its drafter state and seeds again; one that waited past an
        MTP head's window (256 positions) re-seeds unpriced, rarely. Whether the drafter
        proposed is read from its own timings: a constrained request's verified drafts
        include the tokens its grammar forced, which no drafter proposed or paid for."""
        seeds = {rid: seed_ms for rid, seed_ms, _ in result.seed_timings}
        proposed = {rid for rid, _, tokens, _ in result.draft_timings if tokens}
        for seq in plan.seqs:
            rid = seq.request_id
            if not seq.is_round or not (rid in seeds or rid in proposed):
                continue
            started = rid in self._drafter_started
            if not seq.may_seed:
                if not started:
                    self.draft_timing.observe_first_round(seeds.get(rid, 0.0), may_seed=False)
            elif rid not in self._seed_offered:
                if not started or rid in seeds:
                    self.draft_timing.observe_first_round(seeds.get(rid, 0.0))
                self._seed_offered.add(rid)
            self._drafter_started.add(rid)

    def update(self, plan: SchedulerPlan, result: RunnerResult, now: float) -> list[TokenEvent]:
        """Advance requests by what the runner chose for ``plan``; account the lane and
        speculation; finish what ended."""
        if len(result.seqs) != len(plan.seqs):
            raise ValueError(f"the runner answered {len(result.seqs)} sequences of a plan of {len(plan.seqs)}")
        events: list[TokenEvent] = []
        self._last_round.clear()
        for rid, drafting_ms, tokens, catch_up_ms in result.draft_timings:
            self.draft_timing.observe(drafting_ms, tokens, catch_up_ms, request_id=rid)
        if self._adaptive_k:
            self._time_tick(plan, result)
            self._time_first_rounds(plan, result)
        for seq, res in zip(plan.seqs, result.seqs, strict=True):
            if res.request_id != seq.request_id:
                raise ValueError(f"the runner answered {res.request_id!r} for {seq.request_id!r}")
            rid = seq.request_id
            if seq.start < seq.request.num_prompt_tokens:
                self.counts.prefill_tokens += len(seq.token_ids)
            request = self.running.get(rid)
            if request is None:  # aborted while the tick ran
                continue
            if res.prompt_logprobs:  # a chunk recomputed after a preemption brings entries already kept
                request.prompt_logprobs.extend(res.prompt_logprobs[len(request.prompt_logprobs) + 1
                                                                   - res.prompt_logprobs_from:])
            # The fed tokens and the accepted drafts stay in the cache; rejected drafts do not.
            request.num_computed_tokens = seq.start + len(seq.token_ids) + res.num_accepted_tokens
            appended, status = self._append(request, res.token_ids)
            if res.error is not None:
                status, request.error = RequestStatus.FINISHED_ERROR, res.error
            # A request that finishes here commits too, so its prompt's blocks are cached for
            # the next request (one of max_tokens=1, or one waiting for them: _awaits_prefill);
            # only positions whose tokens it kept (a stop among accepted drafts cuts the rest).
            self.kv.commit(rid, request.num_computed_tokens if status is None
                           else min(request.num_computed_tokens, request.num_tokens), request)
            if res.token_ids and request.first_token_s is None:
                request.first_token_s = now
            held = rid in self._held_without_drafts
            burst = rid == self._burst_holder  # each of its ticks is a round, even at K = 0
            if seq.is_round or burst:
                drafted, accepted = self._account_round(request, res, appended, burst=burst)
                self.acceptance.observe(rid, drafted, accepted)
            elif held:
                self.acceptance.idle(rid)
            if burst:
                self._burst_ms += result.elapsed_ms  # charged to its grant when it ends (_finish)
            elif (seq.is_round or held) and rid in self._in_lane:
                # A holder that drafted nothing this tick (adaptive K gave it none, or its
                # drafter found none) spent a tick of its grant, and ends it: its drafts do
                # not pay here, or there are none, and a waiter's may (``SpecLane.end_grant``).
                self.lane.round_done(rid, elapsed_ms=result.elapsed_ms, now=now)
                if res.num_draft_tokens == 0:
                    self.lane.end_grant(rid)
            if status is not None:
                self._finish(request, status, now)
            elif (request.caught_up and request.speculative and self._lane_active()
                  and rid not in self._in_lane):
                self._in_lane.add(rid)
                self.lane.add(rid, tenant=request.tenant, priority=request.priority, now=now,
                              stats=request.spec, weight=request.tenant_weight)
            if appended or status is not None:
                events.append(TokenEvent(request, appended, status is not None))
        return events

    def _append(self, request: Request, token_ids: tuple[int, ...]) -> tuple[list[int], RequestStatus | None]:
        """Append tokens one by one, stopping exactly at EOS, a stop token, max_tokens or the context."""
        sp = request.sampling
        appended: list[int] = []
        for token in token_ids:
            request.output_token_ids.append(token)
            appended.append(token)
            if (token in request.eos_token_ids and not sp.ignore_eos) or token in sp.stop_token_ids:
                return appended, RequestStatus.FINISHED_STOPPED
            if request.num_output_tokens >= sp.max_tokens or request.num_tokens >= self.max_model_len:
                return appended, RequestStatus.FINISHED_LENGTH
        return appended, None

    def _account_round(self, request: Request, res: SeqResult, appended: list[int], *, burst: bool) -> tuple[int, int]:
        """Count one round for the request and the totals; returns (drafted, accepted)."""
        if len(appended) < len(res.token_ids):
            # Finished inside the round: nothing past the stop point is counted, and every
            # draft before it was accepted.
            drafted = accepted = len(appended)
        else:
            drafted, accepted = res.num_draft_tokens, res.num_accepted_tokens
        stats = request.spec
        stats.rounds += 1
        stats.draft_tokens += drafted
        stats.accepted_tokens += accepted
        self.counts.record_round(request.tenant, burst=burst, drafted=drafted, accepted=accepted)
        self._last_round[request.request_id] = (request.num_output_tokens - len(appended), drafted, accepted)
        return drafted, accepted
