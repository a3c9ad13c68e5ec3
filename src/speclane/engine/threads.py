"""Threads that follow the cores actually free: a noisy neighbour costs speed, not a collapse.

The forward's OpenMP regions (torch's and our kernels') split their work between the
threads and meet at a barrier after each one, dozens of times per step. When another
process keeps one of the cores busy, the thread scheduled beside it gets a fraction of that
core and every barrier waits for it: on 2 cores with one busy process, 2 threads kept about
a third of the quiet decode speed, one thread about 0.8 of it (one thread alone is nearly
as fast as two on a single stream of the default model).

``ThreadGovernor`` reads, about once a second, how much CPU time the cores this process may
run on spent busy (``/proc/stat``, those cores' lines) and how much of it was this
process's own (``/proc/self/stat``); the rest is other processes'. It gives up a thread
for each core another process keeps at least three quarters busy (a client on the same
machine parsing a few streams does not count), keeping at least 1 and at most the
configured number; the engine applies the change between ticks. A window that spans
an idle stretch of the engine (no tick for ``IDLE_GAP_S``) only starts a fresh one. Where
``/proc`` cannot be read it never asks for a change.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

INTERVAL_S = 1.0  # how often the CPU counters are read
# No tick for this long: the engine sat idle, and what other processes did meanwhile says
# nothing about now, so the window starts afresh. A benchmark that alternates llama-bench
# (~2 s) and speclane saw llama-bench's run in its first window and decoded most of its 128
# tokens on one thread (a limit of 3 s on the window's length missed runs that short).
IDLE_GAP_S = 1.0
# The first window after such a gap is this short: a busy neighbour that is there when the
# engine starts decoding costs a quarter second of a slow start, not a whole interval (a
# 128-token run beside a busy loop kept 0.58 of its quiet speed with a full interval first).
FIRST_WINDOW_S = 0.25
BUSY_FROM = 0.75  # of a core, what other processes must use for it to count as taken


@dataclass(frozen=True)
class CpuSample:
    busy_s: float  # CPU seconds the allowed cores spent busy, all processes, since boot
    ours_s: float  # of every core, this process's CPU seconds since it started


def read_sample(cores: Collection[int] | None = None, proc: Path = Path("/proc")) -> CpuSample | None:
    """The counters now, or None where ``/proc`` does not have them."""
    cores = set(os.sched_getaffinity(0)) if cores is None else set(cores)
    tick = os.sysconf("SC_CLK_TCK")
    try:
        busy = 0
        for line in (proc / "stat").read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                values = [int(v) for v in fields]
                busy += sum(values[:8]) - values[3] - values[4]  # all but idle and iowait
        stat = (proc / "self" / "stat").read_text()
        after_name = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces
        ours = int(after_name[11]) + int(after_name[12])  # utime, stime (fields 14 and 15)
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(busy / tick, ours / tick)


def free_threads(busy_s: float, ours_s: float, elapsed_s: float, cores: int, max_threads: int) -> int:
    """Threads for the cores other processes left free over ``elapsed_s`` seconds."""
    others = max(0.0, (busy_s - ours_s) / elapsed_s)  # in cores
    taken = math.floor(others + (1 - BUSY_FROM))
    return max(1, min(max_threads, cores - taken))


def cores_taken(before: CpuSample | None, after: CpuSample | None, elapsed_s: float, cores: int) -> int:
    """Cores other processes kept busy between two samples (0 where either is missing)."""
    if before is None or after is None or elapsed_s <= 0:
        return 0
    return cores - free_threads(after.busy_s - before.busy_s, after.ours_s - before.ours_s, elapsed_s, cores, cores)


class ThreadGovernor:
    def __init__(self, max_threads: int, cores: int | None = None, *,
                 read: Callable[[], CpuSample | None] = read_sample, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = INTERVAL_S) -> None:
        self.max_threads = max_threads
        self.cores = len(os.sched_getaffinity(0)) if cores is None else cores
        self.threads = max_threads
        self._read, self._clock, self._interval = read, clock, interval_s
        self._last_tick = clock()
        self._start_window(self._last_tick)

    def _start_window(self, now: float) -> None:
        """A fresh window from ``now``, a short first one (``FIRST_WINDOW_S``)."""
        self._last, self._last_at, self._window = self._read(), now, min(FIRST_WINDOW_S, self._interval)

    def update(self) -> int | None:
        """The thread count to switch to, when the free cores changed it; else None. Called
        every tick."""
        now = self._clock()
        idle = now - self._last_tick > IDLE_GAP_S
        self._last_tick = now
        if idle:
            self._start_window(now)
            return None
        if now - self._last_at < self._window:
            return None
        self._window = self._interval
        sample = self._read()
        last, last_at = self._last, self._last_at
        self._last, self._last_at = sample, now
        if sample is None or last is None:
            return None
        want = free_threads(sample.busy_s - last.busy_s, sample.ours_s - last.ours_s, now - last_at, self.cores,
                            self.max_threads)
        if want == self.threads:
            return None
        self.threads = want
        return want
