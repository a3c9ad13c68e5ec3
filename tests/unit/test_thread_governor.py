"""The thread governor: threads follow the cores other processes leave free, between 1 and
the configured count, read from the kernel's CPU counters (a fake reading here, and one
real reading of /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speclane.engine.threads import (
    FIRST_WINDOW_S,
    CpuSample,
    ThreadGovernor,
    free_threads,
    neighbours,
    read_sample,
)


def test_free_threads_counts_the_cores_others_leave():
    assert free_threads(busy_s=2.0, ours_s=2.0, elapsed_s=1.0, cores=2, max_threads=2) == 2  # all busy time is ours
    assert free_threads(busy_s=2.0, ours_s=1.0, elapsed_s=1.0, cores=2, max_threads=2) == 1  # one core is another's
    assert free_threads(busy_s=2.0, ours_s=0.7, elapsed_s=1.0, cores=2, max_threads=2) == 1
    assert free_threads(busy_s=1.2, ours_s=1.0, elapsed_s=1.0, cores=2, max_threads=2) == 2  # a fifth of a core: noise
    assert free_threads(busy_s=2.4, ours_s=2.0, elapsed_s=1.0, cores=2, max_threads=2) == 2  # 0.4 of a core: a client
    assert free_threads(busy_s=4.0, ours_s=0.0, elapsed_s=1.0, cores=2, max_threads=2) == 1  # never below one
    assert free_threads(busy_s=0.0, ours_s=0.0, elapsed_s=1.0, cores=8, max_threads=4) == 4  # never above the setting


def test_a_busy_loop_sharing_the_cores_with_our_threads_counts_as_a_whole_core():
    """Beside 2 spinning threads on 2 cores a busy loop gets 2/3 of a core; on its own it
    would take a whole one. Counted as 2/3 (below three quarters) it was never seen."""
    assert neighbours(2 / 3, 4 / 3, threads=2, cores=2) == pytest.approx(1.0)
    assert free_threads(busy_s=2.0, ours_s=4 / 3, elapsed_s=1.0, cores=2, max_threads=2, threads=2) == 1
    assert neighbours(1.0, 1.0, threads=1, cores=2) == pytest.approx(1.0)  # one thread: the loop has its own core
    assert free_threads(busy_s=2.0, ours_s=1.0, elapsed_s=1.0, cores=2, max_threads=2, threads=1) == 1
    # idle (no threads of ours competing): the share is the work
    assert neighbours(2 / 3, 0.0, threads=0, cores=2) == pytest.approx(2 / 3)
    assert free_threads(busy_s=2 / 3, ours_s=0.0, elapsed_s=1.0, cores=2, max_threads=2, threads=0) == 2
    # cores with room to spare: a client's burst while the engine waited part of the window
    assert neighbours(0.6, 0.5, threads=2, cores=2) == pytest.approx(0.6)
    assert free_threads(busy_s=1.1, ours_s=0.5, elapsed_s=1.0, cores=2, max_threads=2, threads=2) == 2
    assert neighbours(0.3, 1.7, threads=2, cores=2) == pytest.approx(0.3 * 2 / 1.7)  # a client beside our spin
    assert neighbours(2.0, 0.0, threads=2, cores=2) == 2.0  # every core: capped


class _Machine:
    """Fake counters: ``others`` cores of other processes' work and ``ours`` of ours per second."""

    def __init__(self) -> None:
        self.now, self.busy, self.ours = 0.0, 0.0, 0.0
        self.others_rate, self.ours_rate = 0.0, 2.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.busy += (self.others_rate + self.ours_rate) * seconds
        self.ours += self.ours_rate * seconds

    def read(self) -> CpuSample:
        return CpuSample(self.busy, self.ours)


def _ticks(machine: _Machine, governor: ThreadGovernor, seconds: float) -> int | None:
    """The engine ticks every 10 ms for ``seconds``; the last answer that was not None."""
    answer = None
    for _ in range(round(seconds / 0.01)):
        machine.advance(0.01)
        answer = governor.update() or answer
    return answer


def test_the_governor_drops_to_the_free_cores_and_comes_back():
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    machine.advance(0.5)
    assert governor.update() is None, "not before the interval"
    assert _ticks(machine, governor, 0.6) is None, "quiet: two threads stay"
    machine.others_rate, machine.ours_rate = 1.0, 1.0  # a busy process beside us
    assert _ticks(machine, governor, 2.1) == 1 and governor.threads == 1  # a whole window of it
    assert _ticks(machine, governor, 1.0) is None, "no change: nothing to do"
    machine.others_rate = 0.0
    assert _ticks(machine, governor, 2.0) == 2


def test_after_an_idle_stretch_beside_a_neighbour_that_has_left_the_threads_come_back_within_the_first_window():
    """The engine idles 10 s while llama-bench takes both cores, then decodes on a quiet
    machine: its first tick runs on one thread, and the short first window brings back two."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    machine.others_rate, machine.ours_rate = 2.0, 0.0  # llama-bench runs, speclane idles
    machine.advance(10.0)
    machine.others_rate, machine.ours_rate = 0.0, 1.0
    assert governor.update() == 1  # the idle stretch's counters
    assert _ticks(machine, governor, FIRST_WINDOW_S + 0.02) == 2 and governor.threads == 2
    machine.others_rate, machine.ours_rate = 2 / 3, 4 / 3  # now a busy loop beside our two threads
    assert _ticks(machine, governor, 1.05) == 1  # two windows in a row
    machine.others_rate, machine.ours_rate = 1.0, 1.0  # on one thread the loop has a core of its own
    assert _ticks(machine, governor, 1.1) is None and governor.threads == 1


def test_a_neighbour_already_there_when_decoding_starts_sets_the_first_tick_s_threads():
    """A busy loop that ran while the engine waited is still there when a request comes:
    the first tick runs on the free core (two threads beside it made a 15 ms prefill take
    0.25-0.65 s), and the first window confirms it."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    machine.others_rate, machine.ours_rate = 1.0, 0.0  # a busy loop starts; speclane idles
    machine.advance(1.5)
    machine.ours_rate = 1.0
    assert governor.update() == 1  # before the first tick
    assert _ticks(machine, governor, 1.0) is None and governor.threads == 1


def test_a_neighbour_that_came_while_the_engine_idled_is_judged_on_the_idle_stretch_alone():
    """A request decodes quietly and ends 0.45 s into a window; a busy loop starts and runs
    1.2 s before the next request. Judged over the whole window (our decoding included) the
    loop read as 0.73 of a core and both threads stayed beside it; from the end of the
    last request, it is the whole core it is."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    assert _ticks(machine, governor, 1.05) is None  # windows at 0.1 s and 0.6 s
    governor.idle()  # the request finished
    machine.others_rate, machine.ours_rate = 1.0, 0.0
    machine.advance(1.2)
    machine.ours_rate = 1.0
    assert governor.update() == 1 and governor.threads == 1


def test_one_window_of_a_client_s_burst_keeps_every_thread():
    """Clients on the same machine starting their next requests take most of a core for
    half a second: one window of it is not a neighbour."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    assert _ticks(machine, governor, 0.6) is None
    machine.others_rate, machine.ours_rate = 0.8, 1.2
    assert _ticks(machine, governor, 0.5) is None
    machine.others_rate, machine.ours_rate = 0.1, 1.9
    assert _ticks(machine, governor, 1.0) is None and governor.threads == 2


def test_a_client_taking_part_of_a_core_does_not_flip_the_count_back_and_forth():
    """0.6 of a core reads as taken beside two spinning threads and as free beside one:
    once down, the count comes back only where the others' share would leave a core free
    beside the threads it comes back to."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    machine.others_rate, machine.ours_rate = 0.6, 1.4
    assert _ticks(machine, governor, 1.1) == 1
    machine.ours_rate = 1.0  # one thread: the client has room
    assert _ticks(machine, governor, 3.0) is None and governor.threads == 1
    machine.others_rate = 0.1  # the client stops
    assert _ticks(machine, governor, 0.6) == 2


def test_a_window_that_saw_a_core_taken_before_an_idle_stretch_is_forgotten():
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    assert _ticks(machine, governor, 0.6) is None
    machine.others_rate, machine.ours_rate = 0.8, 1.2  # one window of a burst, then the engine idles
    assert _ticks(machine, governor, 0.55) is None and governor._taken_before
    machine.others_rate, machine.ours_rate = 0.1, 0.0
    machine.advance(2.0)
    machine.ours_rate = 2.0
    assert governor.update() is None
    machine.others_rate, machine.ours_rate = 0.8, 1.2  # another burst's first window: still one window
    assert _ticks(machine, governor, 0.15) is None and governor.threads == 2


def test_a_quiet_idle_stretch_keeps_every_thread():
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    machine.others_rate, machine.ours_rate = 0.3, 0.0  # a client's work while speclane waits
    machine.advance(3.0)
    machine.others_rate, machine.ours_rate = 0.0, 2.0
    assert governor.update() is None and governor.threads == 2
    assert _ticks(machine, governor, 1.0) is None


def test_a_short_pause_is_part_of_the_window():
    """Under ``IDLE_GAP_S`` between ticks the window goes on: a 0.5 s pause beside a
    client's burst of work is averaged with the decoding around it."""
    machine = _Machine()
    governor = ThreadGovernor(2, cores=2, read=machine.read, clock=lambda: machine.now)
    assert _ticks(machine, governor, 0.6) is None  # speclane decodes
    machine.others_rate, machine.ours_rate = 0.8, 0.0  # clients start their next requests
    machine.advance(0.3)
    machine.others_rate, machine.ours_rate = 0.1, 2.0
    assert _ticks(machine, governor, 1.5) is None and governor.threads == 2


def test_the_governor_asks_nothing_without_counters():
    governor = ThreadGovernor(2, cores=2, read=lambda: None, clock=iter(range(0, 100, 2)).__next__)
    assert all(governor.update() is None for _ in range(5))


def test_read_sample_parses_the_allowed_cores_and_this_process(tmp_path: Path):
    proc = tmp_path
    (proc / "self").mkdir()
    # user nice system idle iowait irq softirq steal guest guest_nice
    (proc / "stat").write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 50 1000 5 1 2 3 0 0\n"
                               "cpu1 10 0 5 500 0 0 0 0 0 0\ncpu2 7 0 0 0 0 0 0 0 0 0\nintr 1 2\n")
    fields = ["S"] + ["0"] * 10 + ["40", "2"] + ["0"] * 30  # state, then fields 4..: utime 40, stime 2
    (proc / "self" / "stat").write_text("123 (a name) with space) " + " ".join(fields))
    tick = os.sysconf("SC_CLK_TCK")
    sample = read_sample(cores={0, 1}, proc=proc)
    assert sample == CpuSample((100 + 50 + 1 + 2 + 3 + 10 + 5) / tick, 42 / tick)
    assert read_sample(cores={0}, proc=tmp_path / "absent") is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc here")
def test_a_real_busy_process_shows_as_another_processs_core():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to free")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before, start = read_sample(), time.monotonic()
        time.sleep(1.0)
        after, end = read_sample(), time.monotonic()
    finally:
        hog.kill()
        hog.wait()
    others = (after.busy_s - before.busy_s - (after.ours_s - before.ours_s)) / (end - start)
    assert others > 0.6, f"the busy process used {others:.2f} of a core"
    assert free_threads(after.busy_s - before.busy_s, after.ours_s - before.ours_s, end - start, len(cores),
                        len(cores)) <= len(cores) - 1 + (others < 0.75)
