"""Threads that follow the cores actually free: a noisy neighbour costs speed, not a collapse.

The forward's OpenMP regions (torch's and our kernels') split their work between the
threads and meet at a barrier after each one, dozens of times per step. When another
process keeps one of the cores busy, the thread scheduled beside it gets a fraction of that
core and every barrier waits for it: on 2 cores with one busy process, 2 threads kept 0.2-0.35
of the quiet decode speed here, one thread 0.65-0.9 of it (on a single stream of the default
model one thread alone is 0.7x as fast as two).

``ThreadGovernor`` reads, every half second while the engine ticks, how much CPU time the
cores this process may run on spent busy (``/proc/stat``, those cores' lines) and how much
of it was this process's own (``/proc/self/stat``); the rest is other processes'. From that
share and the threads this process ran it estimates how many cores' worth of work the
others would take (``neighbours``: a busy loop beside 2 spinning threads on 2 cores gets
only 2/3 of a core, and counted as 2/3 it looked like a client), and gives up a thread for
each core so taken at least three quarters (a client on the same machine parsing a few
streams does not count), keeping at least 1 and at most the configured number; the engine
applies the change between ticks (a drop after two windows in a row, a client's burst
lasts one). The first tick after an idle stretch (no tick for
``IDLE_GAP_S``) runs on the threads the stretch's counters give, checked after a short
first window (``IDLE_GAP_S``' comment says why). Where ``/proc`` cannot be read it never
asks for a change.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

INTERVAL_S = 0.5  # how often the CPU counters are read while the engine ticks
# No tick for this long: the engine sat idle. Its next tick starts at the thread count the
# idle stretch's counters give (others' share of the cores, none of it competing with
# ours), then a short window checks it: a neighbour that kept a core busy while the engine
# waited is still there when a request arrives more often than not, and two threads
# beside it made that request's first tick take 0.25-0.65 s here (a 40-token prefill that
# takes 15 ms quiet: every OpenMP barrier waits for the preempted thread's next time
# slice). Where the neighbour has just left (a benchmark that alternates llama-bench and
# speclane), the first window finds the cores free and the engine is back at its threads
# after ``FIRST_WINDOW_S``.
IDLE_GAP_S = 1.0
FIRST_WINDOW_S = 0.1  # the first window after an idle stretch (10 scheduler ticks per core)
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


def neighbours(others: float, ours: float, threads: int, cores: int) -> float:
    """Cores' worth of work other processes would take on their own, from the shares of the
    ``cores`` they and this process got (``others``, ``ours``, in cores) while it ran
    ``threads`` threads.

    Where the cores had room to spare (busy less than ``1 - BUSY_FROM`` short of all of
    them: this process waited for work part of the window) the others' share is their work.
    Where they did not, the kernel's scheduler shares the cores between runnable threads
    alike, and this process's threads are runnable while it decodes (OpenMP's spin at each
    barrier): n busy threads of others beside ours get ``cores * n / (threads + n)``, so
    ``n = others * threads / (cores - others)``; the larger of the two is the estimate."""
    others = min(max(others, 0.0), cores)
    if others >= cores:
        return float(cores)
    if others + ours < cores - (1 - BUSY_FROM):
        return others
    return max(others, others * threads / (cores - others))


def free_threads(busy_s: float, ours_s: float, elapsed_s: float, cores: int, max_threads: int,
                 threads: int | None = None) -> int:
    """Threads for the cores other processes leave free, from ``elapsed_s`` seconds in which
    this process ran ``threads`` threads (default: ``max_threads``) and others had the busy
    time that was not its own."""
    others = max(0.0, (busy_s - ours_s) / elapsed_s)  # in cores
    ours = max(0.0, ours_s / elapsed_s)
    taken = math.floor(neighbours(others, ours, max_threads if threads is None else threads, cores) + (1 - BUSY_FROM))
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
        self._taken_before = False  # the last window while ticking saw a core taken
        self._idle_marked = False  # idle() started the window since the last tick
        self._start_window(self._last_tick)

    def _start_window(self, now: float, sample: CpuSample | None = None) -> None:
        """A fresh window from ``now``, a short first one (``FIRST_WINDOW_S``)."""
        self._last = self._read() if sample is None else sample
        self._last_at, self._window = now, min(FIRST_WINDOW_S, self._interval)

    def _switch(self, want: int) -> int | None:
        if want == self.threads:
            return None
        self.threads = want
        return want

    def idle(self) -> None:
        """The engine has nothing left to run (called once its last request finished): the
        window restarts here, so the next tick after an idle stretch reads the stretch's
        own counters. A window that also held the last ticks' decoding diluted a neighbour
        that came meanwhile below a core: two threads stayed beside a busy loop started
        1.2 s before the next request, at 0.30 of the quiet speed where one keeps ~0.6."""
        if not self._idle_marked:
            self._idle_marked = True
            self._start_window(self._clock())

    def update(self) -> int | None:
        """The thread count to switch to, when the free cores changed it; else None. Called
        every tick."""
        self._idle_marked = False
        now = self._clock()
        idle = now - self._last_tick > IDLE_GAP_S
        self._last_tick = now
        if idle:  # the idle stretch's counters decide the first tick (see IDLE_GAP_S)
            sample, last, last_at = self._read(), self._last, self._last_at
            self._start_window(now, sample)
            self._taken_before = False
            if sample is None or last is None or now <= last_at:
                return None
            return self._switch(free_threads(sample.busy_s - last.busy_s, sample.ours_s - last.ours_s,
                                             now - last_at, self.cores, self.max_threads, threads=0))
        if now - self._last_at < self._window:
            return None
        self._window = self._interval
        sample = self._read()
        last, last_at = self._last, self._last_at
        self._last, self._last_at = sample, now
        if sample is None or last is None:
            return None
        busy, ours, elapsed = sample.busy_s - last.busy_s, sample.ours_s - last.ours_s, now - last_at
        want = free_threads(busy, ours, elapsed, self.cores, self.max_threads, self.threads)
        if want > self.threads:
            # Back up only to as many threads as the others' share would leave free once
            # ours saturate the cores again (judged as at that count): a client's 0.6 of a
            # core reads as free beside one thread and as taken beside two, and without this
            # the count went 2, 1, 2, 1 every window or two.
            saturated = busy - ours + self.cores * elapsed  # others' share, ours counted as every core
            want = max(self.threads, free_threads(saturated, self.cores * elapsed, elapsed, self.cores,
                                                  self.max_threads, want))
        # A thread is given up only when two windows in a row saw its core taken: the
        # benchmark's own HTTP clients, starting 16 streams on the same 2 cores, took 0.75-0.85
        # of a core for one window at each batch's start, and one thread for the next half
        # second fell on the batch's prefill. Taking a thread back needs one window.
        if want < self.threads and not self._taken_before:
            self._taken_before = True
            return None
        self._taken_before = False
        return self._switch(want)
