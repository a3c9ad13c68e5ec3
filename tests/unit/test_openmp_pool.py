"""A thread's idle OpenMP workers are freed before the engine ticks on another thread:
libgomp counts every pool's workers, and once they outnumber the CPUs each barrier of a
forward sleeps instead of spinning (``kernels/build.py``, ``release_thread_pool``)."""

from __future__ import annotations

import os

import pytest
import torch

from speclane.engine.async_engine import AsyncEngine
from speclane.kernels import build

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not os.path.isdir("/proc/self/task"),
                                reason="needs 2 CPUs and Linux's /proc")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _run_a_parallel_region() -> None:
    torch.set_num_threads(2)
    torch.ones(1 << 22).mul_(2).sum()  # large enough for torch's OpenMP to use both threads


def test_releasing_the_pool_ends_this_threads_workers():
    _run_a_parallel_region()
    with_pool = _threads()
    assert build.release_thread_pool()
    assert _threads() < with_pool
    _run_a_parallel_region()  # the next region builds the pool again
    assert _threads() == with_pool


class _Idle:
    def has_unfinished(self) -> bool:
        return False


def test_the_async_engine_frees_the_workers_of_the_thread_that_built_it():
    _run_a_parallel_region()
    before = _threads()
    front = AsyncEngine(_Idle())  # type: ignore[arg-type]
    try:
        assert _threads() < before + 1  # its own thread came, this thread's workers went
    finally:
        front.shutdown()
