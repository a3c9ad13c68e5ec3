"""Step-cost calibration: how long a forward of n rows takes on this model and machine.

The adaptive draft length (``scheduler/draft_length.py``) needs it, and it cannot be
guessed: each row through a weight-only int4 kernel on a CPU costs its share of the
FMAs (torch's kernel worked in blocks of 4 rows), dense kernels are nearly flat,
attention grows with the context. Measured once per (model shape,
quantization, dtype, threads, rows) and kept as JSON under
``~/.cache/speclane/calibration`` (``RuntimeEnv.calibration_dir``:
``SPECLANE_CALIBRATION_DIR``); a few seconds the first time for the default model, ~0.1 s
after.

Each start checks a cached table on a few widths (``stale_widths``) and measures it again
where this machine's speed now is off it by more than ``SPOT_TOLERANCE``. Start-up never
waits long for it: the sweeps stop at ``BUDGET_S`` (a machine busy with another process
made the sweeps take minutes). A table of fewer than ``MIN_SAVED_SWEEPS`` complete sweeps,
or measured while other processes kept a core busy (``threads.cores_taken``: such a table
read twice the quiet cost per row), is used for this run only (widths past the last
measured one extend its slope, ``StepCost.ms``) and is not saved, so a quieter start
measures it again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from speclane.config import runtime_env
from speclane.engine import threads
from speclane.models import kv_cache
from speclane.models import linear as linear_module
from speclane.models import llama as llama_module
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch
from speclane.scheduler.draft_length import StepCost

log = logging.getLogger(__name__)
CONTEXT = 128  # cached tokens of the measured sequence: a short chat turn


def forward_ms(model: LlamaModel, cache: KVCache, *, batch: int = 1, positions: int = 1, kv_len: int = CONTEXT) -> float:
    """Wall ms of one forward + logits: ``batch`` sequences (on consecutive blocks) with
    ``positions`` new tokens each after ``kv_len`` cached ones (whatever they hold)."""
    rb = RaggedBatch(
        input_ids=torch.randint(0, min(1000, model.config.vocab_size), (batch * positions,)),
        positions=torch.arange(kv_len, kv_len + positions).repeat(batch),
        block_tables=cache.row_tables(batch, kv_len + positions),  # type: ignore[arg-type]
        starts=[kv_len] * batch,
        num_new=[positions] * batch,
    )
    start = time.perf_counter()
    model.logits(model(rb, cache))
    return (time.perf_counter() - start) * 1000


SWEEPS = 7  # sweeps of 1..max_rows rows; the table takes each width's median ratio to one row
BUDGET_S = 20.0  # the most start-up time the sweeps take (a busy machine: fewer sweeps)
# A quiet machine's table of this many complete sweeps is saved though the budget cut the
# rest: a model whose forwards are slow (Gemma 3's 262,144-token head in float32, 4 sweeps
# in 21 s here) would otherwise measure again at every start. The spot check of the next
# start measures a table again where it is off.
MIN_SAVED_SWEEPS = 3
# A cached table is checked at every start on a few widths (the median of a few forwards,
# the table's own statistic: a fastest forward sits below it by about this tolerance at one
# row; ~0.3 s for the default model) and measured again where it is off by more than this: a
# table measured while the machine ran slow for a while (other tenants of the host, which
# no count of this machine's busy cores sees) read 7.7 ms for one row and 1.38x that for
# two, where this machine then did 4.3-6.6 ms and 1.14-1.30x, and it steered adaptive K on every
# later start.
SPOT_WIDTHS = (1, 2)
SPOT_REPEATS = 5
SPOT_TOLERANCE = 0.25


@dataclass(frozen=True)
class Calibration:
    cost: StepCost
    sweeps: int  # complete sweeps of 1..max_rows; fewer than asked: the budget ran out

    def complete(self, repeats: int = SWEEPS) -> bool:
        return self.sweeps >= repeats

    def worth_saving(self, cores_taken: int) -> bool:
        """Whether a later start may read this table back: measured while no other process
        kept a core busy (such a table read about twice the quiet cost per row), from at
        least ``MIN_SAVED_SWEEPS`` complete sweeps."""
        return cores_taken == 0 and self.complete(MIN_SAVED_SWEEPS)


def measure(model: LlamaModel, cache: KVCache, max_rows: int, repeats: int = SWEEPS, budget_s: float | None = None,
            clock: Callable[[], float] = time.perf_counter) -> Calibration:
    """``table_from_sweeps`` of ``repeats`` sweeps of 1..max_rows rows (one sequence, its
    rows as positions: the linears, which dominate, see rows, not sequences), stopping
    when ``budget_s`` (default ``BUDGET_S``) has passed: after the sweep in progress, or
    inside the first sweep (the table then ends at the last width measured)."""
    kv_len = _context(model, cache, max_rows)
    deadline = clock() + (BUDGET_S if budget_s is None else budget_s)
    forward_ms(model, cache, positions=1, kv_len=kv_len)  # warm-up
    sweeps: list[list[float]] = []
    while len(sweeps) < repeats:
        # Only the first sweep stops inside: a table needs one row's ratio for every width.
        sweeps.append(sweep(model, cache, max_rows, kv_len, stop=(lambda: clock() > deadline) if not sweeps else None))
        if clock() > deadline:
            break
    complete = sum(len(sweep) == max_rows for sweep in sweeps)
    return Calibration(StepCost.from_measurements(table_from_sweeps(sweeps)), complete)


def sweep(model: LlamaModel, cache: KVCache, max_rows: int, kv_len: int,
          stop: Callable[[], bool] | None = None) -> list[float]:
    """Ms of one forward of each of 1..max_rows rows after ``kv_len`` cached positions, in
    order, ending early after the first width at which ``stop()`` holds."""
    times: list[float] = []
    for rows in range(1, max_rows + 1):
        times.append(forward_ms(model, cache, positions=rows, kv_len=kv_len))
        if stop is not None and stop():
            break
    return times


def table_from_sweeps(sweeps: list[list[float]]) -> list[float]:
    """Ms by rows from sweeps of 1..n rows (a first sweep may be the only one, cut short):
    each width's median over the sweeps of its ratio to the same sweep's one row, times the
    median one row.

    Ratios within a sweep, because a sweep's forwards run within a fraction of a second of
    each other, while this machine's speed drifts over seconds (other tenants of the host);
    medians, because a forward's times are not one shape at every width: each width's
    fastest forward prices 2 rows at 1.30-1.55x one row in 8 calibrations of 5-9 sweeps on
    an AMD EPYC Zen 3 (2 threads), where 30 sweeps' medians give 1.02-1.14x, and every
    wider width ~1.3x too high (one row's fastest forwards are outliers the wider ones do
    not have); this estimate reads 1.05-1.14x there (``benchmarks/calibration_check.py``)."""
    if not sweeps or not sweeps[0]:
        raise ValueError("a step-cost table needs at least one forward of one row")
    one_row = statistics.median(sweep[0] for sweep in sweeps)
    widths = max(len(sweep) for sweep in sweeps)
    return [one_row * statistics.median(sweep[w] / sweep[0] for sweep in sweeps if len(sweep) > w)
            for w in range(widths)]


def _context(model: LlamaModel, cache: KVCache, max_rows: int) -> int:
    """Cached positions before the measured rows: ``CONTEXT``, or less where the cache or the
    model's positions hold fewer. The cache has room for K draft positions past the context;
    the model's positions may not (a model whose limit is the served length): stay inside both."""
    limit = min(cache.num_blocks * cache.block_size, model.config.max_position_embeddings)
    return max(0, min(CONTEXT, limit - max_rows - 1))


def measure_step_cost(model: LlamaModel, cache: KVCache, max_rows: int, repeats: int = SWEEPS) -> StepCost:
    """``measure``'s table, within the default budget."""
    return measure(model, cache, max_rows, repeats).cost


def _key(model: LlamaModel, max_rows: int) -> str:
    # The forward's own source is part of the key: a kernel or attention change moves the
    # costs, and a stale table would steer K by the old ones.
    code = "".join(inspect.getsource(module) for module in (llama_module, linear_module, kv_cache))
    parts = [repr(model.config), model.quantization, str(model.dtype), str(torch.get_num_threads()),
             str(os.cpu_count()), torch.__version__, str(max_rows), hashlib.sha1(code.encode()).hexdigest(),
             f"median-ratio-of-{SWEEPS}",  # how the table is measured (table_from_sweeps)
             *model.kernels.fingerprint(model.dtype == torch.bfloat16)]  # which kernels, which versions
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:20]


def stale_widths(model: LlamaModel, cache: KVCache, cost: StepCost, max_rows: int) -> list[tuple[int, float, float]]:
    """The widths ``SPOT_WIDTHS`` (and ``max_rows``) whose median of ``SPOT_REPEATS`` forwards
    now is off ``cost`` by more than ``SPOT_TOLERANCE`` either way: (rows, table ms, now ms)."""
    kv_len = _context(model, cache, max_rows)
    forward_ms(model, cache, positions=1, kv_len=kv_len)  # warm-up
    off = []
    for rows in sorted({*(w for w in SPOT_WIDTHS if w <= max_rows), max_rows}):
        now = statistics.median(forward_ms(model, cache, positions=rows, kv_len=kv_len) for _ in range(SPOT_REPEATS))
        if abs(now / cost.ms(rows) - 1.0) > SPOT_TOLERANCE:
            off.append((rows, cost.ms(rows), now))
    return off


def step_cost(model: LlamaModel, cache: KVCache, max_rows: int, directory: Path | None = None) -> StepCost:
    """The cached calibration for this model and machine, measured (and saved) if missing,
    in ``directory`` (default: ``RuntimeEnv.calibration_dir``, read now)."""
    directory = runtime_env().calibration_dir if directory is None else directory
    path = directory / f"step-cost-{_key(model, max_rows)}.json"
    try:
        cached = StepCost(tuple(json.loads(path.read_text())["ms_by_rows"]))
    except (OSError, ValueError, KeyError, TypeError):
        log.info("measuring the step cost of 1..%d rows for adaptive K (once per model and machine, at most %.0f s)",
                 max_rows, BUDGET_S)
    else:
        off = stale_widths(model, cache, cached, max_rows)
        if not off:
            return cached
        log.info("the cached step cost is off on this machine now (%s): measuring it again",
                 ", ".join(f"{rows} rows {table:.1f} ms, now {now:.1f} ms" for rows, table, now in off))
    started, before = time.perf_counter(), threads.read_sample()
    calibration = measure(model, cache, max_rows)
    cost = calibration.cost
    elapsed = time.perf_counter() - started
    taken = threads.cores_taken(before, threads.read_sample(), elapsed, len(os.sched_getaffinity(0)))
    if not calibration.worth_saving(taken):
        reason = (f"the machine is busy (other processes kept {taken} core(s) busy)" if taken else
                  f"the sweeps ran past the {BUDGET_S:.0f} s budget")
        log.warning("%s: the step cost came from %d of %d sweeps (%d of %d widths) in %.1f s; used for this run, not "
                    "saved, measured again at the next start", reason, calibration.sweeps, SWEEPS,
                    len(cost.ms_by_rows), max_rows, elapsed)
        return cost
    log.info("step cost calibrated for 1..%d rows in %.1f s (%d of %d sweeps)", max_rows, elapsed,
             calibration.sweeps, SWEEPS)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"ms_by_rows": list(cost.ms_by_rows)}))
        tmp.replace(path)
    except OSError as exc:  # a read-only home still serves, it just measures every start
        log.warning("could not save the step-cost calibration to %s: %s", path, exc)
    return cost
