"""What the dashboard shows of one engine: who holds the lane and who waits, lane rounds
and tokens per tenant over the last minute, and the lane's timeline.

``LaneRecorder`` is an ``EngineObserver``: it samples the scheduler on the engine thread
after every tick (and when the engine goes idle), which is the only thread allowed to read
the scheduler, and keeps what it saw behind its own lock. A sample costs O(holders +
tenants that ran this tick), plus O(lane members) to count waiters by tenant. ``state()``
(any thread) copies it out as JSON-ready data; ``LatencyWindow`` keeps the TTFT and
inter-token samples of the last minute for percentiles.

Times are wall-clock seconds (``time.time``), so the states of engines in several
processes (replicas) line up on one timeline.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from speclane.scheduler.counts import series_name

if TYPE_CHECKING:
    from speclane.engine.engine import LLMEngine
    from speclane.request import Request

WINDOW_S = 60.0
_MAX_SEGMENTS = 2_000
_MAX_SAMPLES = 20_000


class LaneRecorder:
    """The engine-side half of the dashboard (see the module docstring)."""

    def __init__(self, engine: LLMEngine, *, clock: Callable[[], float] = time.time,
                 window_s: float = WINDOW_S) -> None:
        self.engine = engine
        self.clock = clock
        self.window_s = window_s
        self._lock = threading.Lock()
        self._open: dict[str, dict[str, Any]] = {}  # holding segments by request id
        self._segments: deque[dict[str, Any]] = deque(maxlen=_MAX_SEGMENTS)  # closed ones
        self._seconds: deque[tuple[int, Counter[str], Counter[str]]] = deque()  # (second, rounds, tokens)
        self._last_rounds: dict[str, int] = {}
        self._last_tokens: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._running = 0
        self._queued = 0

    # -- EngineObserver (engine thread) -------------------------------------------------
    def on_tick(self, seconds: float) -> None:
        self.sample()

    def on_idle(self) -> None:
        self.sample()

    def on_first_token(self, seconds: float) -> None:
        pass

    def on_token_gap(self, seconds: float, num_tokens: int) -> None:
        pass

    def on_finish(self, request: Request) -> None:
        pass

    def sample(self) -> None:
        """Read the lane and the counters (engine thread only)."""
        scheduler = self.engine.scheduler
        lane = scheduler.lane
        # Tenants named as the per-tenant counters below name them (series_name), so that one
        # tenant is one name across the dashboard's views.
        holders = [(rid, series_name(tenant), priority) for rid, tenant, priority in lane.holder_view()]
        waiting = {series_name(tenant): n for tenant, n in lane.waiters_by_tenant().items()}
        counters = self.engine.counters
        rounds = _delta(counters.lane_rounds_by_tenant, self._last_rounds)
        tokens = _delta(counters.generated_by_tenant, self._last_tokens)
        now = self.clock()
        with self._lock:
            self._waiting, self._running, self._queued = waiting, scheduler.num_running, scheduler.num_waiting
            held = {rid for rid, _, _ in holders}
            for rid in [rid for rid in self._open if rid not in held]:
                segment = self._open.pop(rid)
                segment["end"] = now
                self._segments.append(segment)
            for rid, tenant, priority in holders:
                if rid not in self._open:
                    self._open[rid] = {"request_id": rid, "tenant": tenant, "priority": priority,
                                       "start": now, "end": None}
            if rounds or tokens:
                second = int(now)
                if not self._seconds or self._seconds[-1][0] != second:
                    self._seconds.append((second, Counter(), Counter()))
                self._seconds[-1][1].update(rounds)
                self._seconds[-1][2].update(tokens)
            while self._seconds and self._seconds[0][0] < now - self.window_s:
                self._seconds.popleft()

    # -- any thread -----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This engine's view: holders, waiters by tenant, per-tenant rounds and tokens over
        the window, and the timeline's segments that ended inside it."""
        now = self.clock()
        since = now - self.window_s
        with self._lock:
            rounds: Counter[str] = Counter()
            tokens: Counter[str] = Counter()
            for second, r, t in self._seconds:
                if second >= since:
                    rounds.update(r)
                    tokens.update(t)
            holders = [dict(s) for s in self._open.values()]
            timeline = [dict(s) for s in self._segments if s["end"] >= since] + holders
            return {"time": now, "holders": holders, "waiting": dict(self._waiting), "running": self._running,
                    "queued": self._queued, "lane_rounds": dict(rounds), "tokens": dict(tokens),
                    "timeline": timeline}


class LatencyWindow:
    """TTFT and inter-token gaps of the last minute (an ``EngineObserver``'s latency hooks,
    or the cluster front's), for percentiles."""

    def __init__(self, *, clock: Callable[[], float] = time.time, window_s: float = WINDOW_S) -> None:
        self.clock = clock
        self.window_s = window_s
        self._lock = threading.Lock()
        self._ttft: deque[tuple[float, float]] = deque(maxlen=_MAX_SAMPLES)
        self._gaps: deque[tuple[float, float]] = deque(maxlen=_MAX_SAMPLES)

    def on_tick(self, seconds: float) -> None:
        pass

    def on_idle(self) -> None:
        pass

    def on_first_token(self, seconds: float) -> None:
        with self._lock:
            self._ttft.append((self.clock(), seconds))

    def on_token_gap(self, seconds: float, num_tokens: int) -> None:
        with self._lock:
            self._gaps.append((self.clock(), seconds))  # one sample per tick and request

    def on_finish(self, request: Request) -> None:
        pass

    def percentiles(self) -> dict[str, dict[str, float | int]]:
        """``{"ttft_ms": {"p50", "p90", "p99", "count"}, "itl_ms": {...}}`` over the window."""
        since = self.clock() - self.window_s
        with self._lock:
            ttft = [v for t, v in self._ttft if t >= since]
            gaps = [v for t, v in self._gaps if t >= since]
        return {"ttft_ms": _percentiles(ttft), "itl_ms": _percentiles(gaps)}


def merge_states(states: Iterable[tuple[str, str, dict[str, Any] | None]], *, queued_front: int = 0,
                 latency: dict[str, Any], window_s: float = WINDOW_S) -> dict[str, Any]:
    """The dashboard's JSON (``GET /dashboard/state``, docs/api.md) from each replica's
    ``(name, health, LaneRecorder.state() or None)`` and the front's own numbers."""
    rounds: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    replicas = []
    timeline = []
    queue_depth = queued_front
    for name, health, state in states:
        entry: dict[str, Any] = {"name": name, "health": health, "holders": [], "waiting": {}, "running": 0,
                                 "queued": 0}
        if state is not None:
            entry.update({k: state[k] for k in ("holders", "waiting", "running", "queued")})
            rounds.update(state["lane_rounds"])
            tokens.update(state["tokens"])
            timeline.extend({**segment, "replica": name} for segment in state["timeline"])
            queue_depth += state["queued"]
        replicas.append(entry)
    total_rounds, total_tokens = sum(rounds.values()), sum(tokens.values())
    tenants = [{"tenant": t, "lane_rounds": rounds[t], "lane_share": rounds[t] / total_rounds if total_rounds else 0.0,
                "tokens": tokens[t], "token_share": tokens[t] / total_tokens if total_tokens else 0.0}
               for t in sorted(set(rounds) | set(tokens))]
    timeline.sort(key=lambda s: s["start"])
    return {"time": time.time(), "window_s": window_s, "replicas": replicas, "queue_depth": queue_depth,
            "tenants": tenants, "latency": latency, "timeline": timeline}


def _delta(totals: dict[str, int], last: dict[str, int]) -> dict[str, int]:
    """What grew in ``totals`` since ``last`` (and remember ``totals``)."""
    out = {}
    for tenant, value in totals.items():
        grown = value - last.get(tenant, 0)
        if grown > 0:
            out[tenant] = grown
            last[tenant] = value
        elif grown < 0:  # the counters were reset
            last[tenant] = value
    return out


def _percentiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "count": 0}
    ordered = sorted(values)
    n = len(ordered)

    def at(q: float) -> float:
        return round(ordered[min(n - 1, int(q * n))] * 1000.0, 3)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "count": n}
