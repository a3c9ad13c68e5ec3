"""Drive an engine in-process with a timed workload and record every token's time.

The engine is ticked in this thread; requests join when their arrival offset has
passed. Each request's timeline (arrival, token times, lane events) is what the
scenarios turn into latency percentiles, throughput and lane shares.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speclane.engine.engine import LLMEngine
from speclane.request import SamplingParams


@dataclass
class Job:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_s: float = 0.0  # offset from the start of the run
    options: dict[str, Any] = field(default_factory=dict)  # priority, tenant, speculative, prediction_token_ids


@dataclass
class Timeline:
    job: Job
    added_s: float = 0.0
    added_clock: float = 0.0  # the engine's clock at add time (lane events use that clock)
    token_times: list[float] = field(default_factory=list)  # one entry per token (a round's tokens share a time)
    finished_s: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.added_s if self.token_times else float("nan")

    @property
    def decode_rate(self) -> float:
        """Tokens per second after the first one (1 / time per output token): the decode
        phase alone, without the prompt's prefill."""
        times = self.token_times
        if len(times) < 2 or times[-1] <= times[0]:
            return float("nan")
        return (len(times) - 1) / (times[-1] - times[0])

    def gaps_s(self) -> list[float]:
        """Inter-token gaps; tokens of one round share its time, so the gap is spread over them."""
        gaps = []
        times = self.token_times
        i = 1
        while i < len(times):
            j = i
            while j < len(times) and times[j] == times[i]:
                j += 1
            gap = (times[i] - times[i - 1]) / (j - i + 1) if j - i > 0 else times[i] - times[i - 1]
            gaps.extend([gap] * (j - i))
            i = j
        return gaps

    def tok_per_s(self) -> float:
        if len(self.token_times) < 2:
            return float("nan")
        return (len(self.token_times) - 1) / (self.token_times[-1] - self.token_times[0])


_runs = itertools.count()


def run_tenant() -> str:
    """A tenant no earlier run used. Scenarios send the same prompts run after run; under one
    tenant the suffix drafter would draft each answer from the same answer of an earlier run
    (a tenant's recent outputs are its drafts' source) and the prefix cache would hold every
    prompt, so each run is a new application's traffic."""
    return f"run-{next(_runs)}"


def drive(engine: LLMEngine, jobs: list[Job], *, on_tick: Callable[[float], None] | None = None,
          stop_when: Callable[[dict[str, Timeline]], bool] | None = None) -> tuple[dict[str, Timeline], float]:
    """Run ``jobs`` to completion; returns timelines and the run's wall time. Jobs that name
    no tenant are one tenant of this run's own (``run_tenant``)."""
    tenant = run_tenant()
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    timelines: dict[str, Timeline] = {}
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0].arrival_s <= now:
            job = pending.pop(0)
            engine.add_request(job.request_id, job.prompt_token_ids, job.sampling, **{"tenant": tenant, **job.options})
            timelines[job.request_id] = Timeline(job, added_s=now, added_clock=engine.clock())
        if not engine.has_unfinished():
            time.sleep(max(0.0, min(0.01, pending[0].arrival_s - now)))
            continue
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            tl = timelines[out.request_id]
            tl.token_times.extend([now] * len(out.token_ids))
            tl.token_ids.extend(out.token_ids)
            tl.text += out.text
            if out.finished:
                tl.finished_s, tl.finish_reason, tl.usage = now, out.finish_reason, out.usage
        if on_tick is not None:
            on_tick(now)
        if stop_when is not None and stop_when(timelines):
            for rid, tl in timelines.items():
                if tl.finished_s is None:
                    engine.abort_request(rid)
            engine.run_until_done()
            break
    return timelines, time.perf_counter() - start


def batch_tokens(timelines: dict[str, Timeline]) -> int:
    """Every request's tokens in a run (``drive``'s timelines)."""
    return sum(len(t.token_times) for t in timelines.values())


def batch_rate(timelines: dict[str, Timeline], wall_s: float) -> float:
    """Every request's tokens over a run's wall time (``drive``'s two results): a batch's tok/s."""
    return batch_tokens(timelines) / wall_s


@dataclass
class Busy:
    """An engine's part of an interleaved run: the tokens its ticks gave and the seconds
    those ticks took (its own ticks only, not the other engines' between them)."""

    tokens: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def _tick(engine: LLMEngine, busy: Busy) -> list[Any]:
    start = time.perf_counter()
    outputs = engine.step()
    busy.seconds += time.perf_counter() - start
    busy.tokens += sum(len(out.token_ids) for out in outputs)
    return outputs


def _turns(names: list[str], order: random.Random) -> list[str]:
    """The engines' order in one round, shuffled: a rotation would keep each engine right
    after the same other one every round (a fixed neighbour's leftovers in the caches)."""
    turns = list(names)
    order.shuffle(turns)
    return turns


def drive_interleaved(engines: dict[str, LLMEngine], jobs: dict[str, list[Job]]) -> dict[str, Busy]:
    """Each engine's ``jobs`` (all sent at once, one tenant of their own per engine) run to
    completion with the engines' ticks interleaved: one tick of each engine in turn, each
    tick timed on its own. A machine whose speed drifts within seconds (other tenants of
    its host, its clock) then slows every engine alike, where runs one after another each
    meet their own stretch of it; each engine's rate is its tokens over its own ticks'
    seconds, so the engines' ratios compare the work each did, tick for tick."""
    for name, engine in engines.items():
        tenant = run_tenant()
        for job in jobs[name]:
            engine.add_request(job.request_id, job.prompt_token_ids, job.sampling, **{"tenant": tenant, **job.options})
    busy = {name: Busy() for name in engines}
    order = random.Random(0)
    while running := [name for name in _turns(list(engines), order) if engines[name].has_unfinished()]:
        for name in running:
            _tick(engines[name], busy[name])
    return busy


def drive_clients_interleaved(engines: dict[str, LLMEngine], prompts: list[list[int]], sampling: SamplingParams,
                              seconds: float) -> dict[str, Busy]:
    """Closed-loop clients on every engine at once, their ticks interleaved as in
    ``drive_interleaved``: per engine, ``len(prompts)`` clients, each sending
    its prompt again (a new tenant) as soon as its answer has finished, until the engine's
    own ticks have taken ``seconds``; then what is still running is aborted. Per engine,
    the tokens its clients received and its ticks' seconds."""
    run = next(_runs)
    client_of: dict[str, dict[str, int]] = {name: {} for name in engines}
    sent = {name: [0] * len(prompts) for name in engines}

    def send(name: str, client: int) -> None:
        rid = f"c{client}-{sent[name][client]}-{run}"
        sent[name][client] += 1
        client_of[name][rid] = client
        engines[name].add_request(rid, prompts[client], sampling, tenant=f"{name}-{rid}")

    for name in engines:
        for client in range(len(prompts)):
            send(name, client)
    busy = {name: Busy() for name in engines}
    order = random.Random(0)
    while running := [name for name in _turns(list(engines), order) if busy[name].seconds < seconds]:
        for name in running:
            for out in _tick(engines[name], busy[name]):
                if out.finished:
                    send(name, client_of[name].pop(out.request_id))
    for name, engine in engines.items():
        for rid in client_of[name]:
            engine.abort_request(rid)
        engine.run_until_done()
    return busy


def progress(message: str) -> None:
    print(f"  .. {message}", flush=True)
