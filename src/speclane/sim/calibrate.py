"""Fit the simulator's cost model and acceptance distribution from ``speclane bench`` runs.

``speclane bench`` writes a ``calibration`` block into report.json (``calibration_record``):

- ``decode``: ``{"step_ms_by_batch": {"1": ms, "4": ms, ...}}`` — one decode step
  (forward + logits) by batch size;
- ``speedup``: ``{"num_draft_tokens": K, "speedup_tasks": [{"task", "on_tok_s",
  "off_tok_s", "acceptance", "tokens_per_round"}, ...]}`` — single-stream rates with the
  lane on and off, and what the drafts achieved.

Reports written before that block existed are read from their tables (same titles and
columns). ``--calibrate`` takes one report.json or a folder holding several (a bench
``--out`` folder: ``decode/report.json``, ``speedup/report.json``).

The fit (``fit``):
- ``decode_token_ms`` and ``base_ms``: least squares of step time against batch size;
- with a speedup report, ``base_ms`` becomes the whole single-stream tick
  (1000 / off tok/s, less one token), which adds the engine's own per-tick work;
  ``verify_row_ms`` is what a lane tick costs beyond ``base + (1 + K) tokens``:
  a lane tick makes ``tokens_per_round`` tokens in ``tokens_per_round * 1000 / on tok/s``;
- acceptance: each task's draft acceptance (accepted / drafted) is turned into the
  per-position rate the simulator draws (drafts are kept up to the first rejection),
  and a Beta is fitted to those rates' mean and spread (method of moments; a
  concentration of 5 when the spread cannot be estimated).
``prefill_token_ms`` is not calibrated (no scenario measures it alone).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclane.bench.calibration_record import calibration_record
from speclane.sim.cost import CostModel


@dataclass
class Calibration:
    cost: CostModel
    acceptance_beta: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)


# -- what simulate reads ----------------------------------------------------------------
def load_calibration(path: str | Path) -> dict[str, Any]:
    """Merge the calibration of one report.json, or of every report.json under a folder."""
    path = Path(path)
    files = sorted(path.rglob("report.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ValueError(f"--calibrate {path}: no bench report.json there (run `speclane bench decode` "
                         "and `speclane bench speedup` first, then pass their --out folder)")
    merged: dict[str, Any] = {}
    for f in files:
        try:
            report = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"--calibrate: {f} is not valid JSON ({exc})") from None
        block = report.get("calibration") or calibration_record("", report.get("tables", []))
        merged.update(block)
    if "step_ms_by_batch" not in merged and "speedup_tasks" not in merged:
        raise ValueError(f"--calibrate {path}: the report(s) hold neither the decode step table nor the speedup "
                         "table; use the report of `speclane bench decode` and/or `speclane bench speedup`")
    return merged


def fit(record: dict[str, Any], base: CostModel, num_draft_tokens: int, source: str = "") -> Calibration:
    cost, notes = base, []
    k = int(record.get("num_draft_tokens", num_draft_tokens))
    steps = {int(k): float(v) for k, v in record.get("step_ms_by_batch", {}).items()}
    if len(steps) >= 2:
        intercept, slope = _least_squares(list(steps), list(steps.values()))
        cost = dataclasses.replace(cost, base_ms=max(0.0, intercept), decode_token_ms=max(0.0, slope))
        notes.append(f"decode step by batch {sorted(steps)}: {intercept:.2f} ms + {slope:.3f} ms/token")
    tasks = record.get("speedup_tasks", [])
    if tasks:
        off_tick = statistics.median(1000.0 / t["off_tok_s"] for t in tasks)
        cost = dataclasses.replace(cost, base_ms=max(0.0, off_tick - cost.decode_token_ms))
        extras = [t["tokens_per_round"] * 1000.0 / t["on_tok_s"] - cost.base_ms - cost.decode_token_ms * (1 + k)
                  for t in tasks]
        cost = dataclasses.replace(cost, verify_row_ms=max(0.0, statistics.median(extras)))
        notes.append(f"single-stream tick {off_tick:.2f} ms; verify row +{cost.verify_row_ms:.2f} ms "
                     f"(median over {len(tasks)} tasks, K={k})")
    rates = [per_position_rate(t["acceptance"], k) for t in tasks]
    beta = _beta(rates) if tasks else None
    if beta is not None:
        notes.append(f"per-position acceptance ~ Beta({beta[0]:.2f}, {beta[1]:.2f}) from the tasks' draft acceptance "
                     + ", ".join(f"{t['acceptance']:.0%}" for t in tasks) + f" (K={k})")
    cost = dataclasses.replace(cost, source=f"calibrated from {source or 'a bench report'}")
    return Calibration(cost, beta, notes)


def per_position_rate(fraction: float, k: int) -> float:
    """The per-position rate a whose leading-run acceptance gives ``fraction`` of K drafts.

    Drafts are accepted up to the first rejection, so with rate a the expected accepted
    count is a + a^2 + ... + a^K, and bench's "acceptance" is that over K."""
    target = min(max(fraction, 0.0), 1.0) * k
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _least_squares(xs: list[int], ys: list[float]) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def _beta(rates: list[float]) -> tuple[float, float] | None:
    rates = [min(0.95, max(0.05, r)) for r in rates]
    if not rates:
        return None
    m = statistics.fmean(rates)
    v = statistics.pvariance(rates) if len(rates) > 1 else 0.0
    concentration = m * (1 - m) / v - 1 if v > 0 else 5.0
    concentration = min(max(concentration, 2.0), 50.0)
    return m * concentration, (1 - m) * concentration
