"""The step-cost calibration is cached per model and machine (engine/calibration.py): a
cached table must never be reused where the costs differ."""

from __future__ import annotations

import json

import pytest
import torch

from speclane.engine import calibration, threads
from speclane.models.kv_cache import KVCache
from speclane.models.toy import toy_config, toy_model


def test_step_cost_is_cached_per_model_and_row_count(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setattr(threads, "read_sample", lambda: None)  # no word on other processes: a quiet machine
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    eager = calibration.step_cost(model, cache, max_rows=3)
    assert len(list(tmp_path.glob("step-cost-*.json"))) == 1
    def measured_again(*args, **kwargs):
        raise AssertionError("the cached table should have been read back")

    monkeypatch.setattr(calibration, "measure", measured_again)
    monkeypatch.setattr(calibration, "stale_widths", lambda *args: [])  # the machine as fast as the table says
    assert calibration.step_cost(model, cache, max_rows=3) == eager
    # The folder passed in is the one read (the environment's by default).
    assert calibration.step_cost(model, cache, max_rows=3, directory=tmp_path) == eager
    # A different row count is a different table.
    assert calibration._key(model, 4) != calibration._key(model, 3)
    saved = json.loads(next(tmp_path.glob("step-cost-*.json")).read_text())
    assert len(saved["ms_by_rows"]) == 3



def test_a_cached_table_the_machine_no_longer_matches_is_measured_again(tmp_path, monkeypatch):
    """A table saved while the machine ran slow steered adaptive K on every later start: each
    start checks a few widths and measures again where the table is off by more than
    SPOT_TOLERANCE."""
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setattr(threads, "read_sample", lambda: None)
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    per_row = {"ms": 10.0}
    widths: list[int] = []

    def fake_forward(model, cache, *, positions, kv_len, batch=1):
        widths.append(positions)
        return per_row["ms"] * positions

    monkeypatch.setattr(calibration, "forward_ms", fake_forward)
    assert calibration.step_cost(model, cache, max_rows=4).ms_by_rows == (10.0, 20.0, 30.0, 40.0)
    path = next(tmp_path.glob("step-cost-*.json"))
    widths.clear()
    per_row["ms"] = 11.0  # 10% slower: within the tolerance, the cached table stands
    assert calibration.step_cost(model, cache, max_rows=4).ms_by_rows == (10.0, 20.0, 30.0, 40.0)
    assert set(widths) == {1, 2, 4} and len(widths) == 1 + 3 * calibration.SPOT_REPEATS, \
        "a warm-up, then SPOT_REPEATS forwards of each width checked"
    per_row["ms"] = 6.0  # the table was measured on a slow machine: measured again and saved
    assert calibration.step_cost(model, cache, max_rows=4).ms_by_rows == (6.0, 12.0, 18.0, 24.0)
    assert json.loads(path.read_text())["ms_by_rows"] == [6.0, 12.0, 18.0, 24.0]
    assert calibration.stale_widths(model, cache, calibration.StepCost((6.0, 12.0, 30.0, 24.0)), 4) == [], \
        "width 3 is not checked"
    assert calibration.stale_widths(model, cache, calibration.StepCost((6.0, 20.0, 24.0, 24.0)), 4) == [(2, 20.0, 12.0)]


def test_calibration_stays_inside_the_models_positions():
    # The cache holds K draft positions past the served length; a model whose position
    # limit is that length must still calibrate (it raised "position beyond the model's").
    cfg = toy_config(max_positions=24)
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 2, 24 + 4 + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    cost = calibration.measure_step_cost(model, cache, max_rows=5, repeats=1)
    assert cost.ms(1) > 0


class _Clock:
    """A clock that advances ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_busy_machine_stops_the_sweeps_at_the_budget(monkeypatch):
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    widths: list[int] = []

    def fake_forward(model, cache, *, positions, kv_len, batch=1):
        widths.append(positions)
        return 2.0 + positions

    monkeypatch.setattr(calibration, "forward_ms", fake_forward)
    # The clock advances 1 s per read (the deadline's, then one per forward): a 4.5 s budget
    # ends the first sweep after width 5.
    cut = calibration.measure(model, cache, max_rows=8, budget_s=4.5, clock=_Clock(1.0))
    assert cut.sweeps == 0 and not cut.complete()
    assert cut.cost.ms_by_rows == pytest.approx((3.0, 4.0, 5.0, 6.0, 7.0))
    assert cut.cost.ms(8) == pytest.approx(10.0), "widths past the last measured one extend its slope"
    widths.clear()
    # After the first sweep the clock is read once a sweep: a 5.5 s budget passes during the
    # second, which finishes; the rest are skipped.
    two = calibration.measure(model, cache, max_rows=4, budget_s=5.5, clock=_Clock(1.0))
    assert two.sweeps == 2 and not two.complete() and widths == [1] + [1, 2, 3, 4] * 2
    full = calibration.measure(model, cache, max_rows=4, budget_s=1000, clock=_Clock(1.0))
    assert full.sweeps == calibration.SWEEPS and full.complete()


def test_a_calibration_cut_short_is_not_saved(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    monkeypatch.setattr(calibration, "BUDGET_S", 0.0)
    cost = calibration.step_cost(model, cache, max_rows=3)
    assert len(cost.ms_by_rows) == 1 and cost.ms(3) > 0
    assert not list(tmp_path.glob("step-cost-*.json")), "a table from a busy machine is measured again next time"


@pytest.mark.parametrize("sweeps", [calibration.MIN_SAVED_SWEEPS - 1, calibration.MIN_SAVED_SWEEPS])
def test_a_quiet_machines_table_cut_by_the_budget_is_saved_from_enough_sweeps(tmp_path, monkeypatch, caplog, sweeps):
    """A model whose forwards are slow (Gemma 3's head in float32: 4 of 7 sweeps in the
    budget) measured again at every start, under a warning that the machine was busy."""
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    monkeypatch.setattr(threads, "read_sample", lambda: None)  # a quiet machine
    table = calibration.StepCost((5.0, 6.0, 7.0))
    monkeypatch.setattr(calibration, "measure", lambda *args, **kwargs: calibration.Calibration(table, sweeps))
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    assert calibration.step_cost(model, cache, max_rows=3) == table
    saved = list(tmp_path.glob("step-cost-*.json"))
    if sweeps >= calibration.MIN_SAVED_SWEEPS:
        assert len(saved) == 1 and json.loads(saved[0].read_text())["ms_by_rows"] == [5.0, 6.0, 7.0]
    else:
        assert not saved
        assert "ran past the" in caplog.text and "busy" not in caplog.text


def test_a_calibration_beside_a_busy_process_is_not_saved(tmp_path, monkeypatch):
    """Another process kept a core busy through the sweeps: its table read about twice the
    quiet cost per row, and saved it would steer adaptive K on every later start."""
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    samples = iter([threads.CpuSample(busy_s=0.0, ours_s=0.0), threads.CpuSample(busy_s=1e6, ours_s=0.0)])
    monkeypatch.setattr(threads, "read_sample", lambda: next(samples))
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    assert calibration.step_cost(model, cache, max_rows=3).ms(1) > 0
    assert not list(tmp_path.glob("step-cost-*.json"))


def test_cores_taken_counts_other_processes_cores():
    before = threads.CpuSample(busy_s=10.0, ours_s=4.0)
    assert threads.cores_taken(before, threads.CpuSample(busy_s=13.0, ours_s=6.0), 1.0, 2) == 1  # 1 core of others
    assert threads.cores_taken(before, threads.CpuSample(busy_s=12.2, ours_s=6.0), 1.0, 2) == 0  # a client's 0.2
    assert threads.cores_taken(None, before, 1.0, 2) == 0


def test_the_table_is_each_widths_median_ratio_to_one_row_within_its_sweep():
    """A sweep whose one row ran fast (or whose second half ran slow, the machine busy for a
    moment) does not move the table: each width is its median ratio to the same sweep's one
    row, times the median one row (each width's fastest forward would price 2 rows at 2x here)."""
    sweeps = [[10.0, 11.0, 13.0], [10.0, 11.0, 13.0], [5.5, 11.0, 13.0], [10.0, 22.0, 26.0], [20.0, 22.0, 26.0]]
    assert calibration.table_from_sweeps(sweeps) == pytest.approx([10.0, 11.0, 13.0])


def test_the_ratios_are_taken_within_each_sweep():
    """The machine's speed drifting between sweeps (each sweep 1.1x one row for two): a
    width's own median (30) or its fastest forward (22 over 10) would not say so."""
    assert calibration.table_from_sweeps([[10.0, 30.0], [20.0, 22.0], [30.0, 33.0]]) == pytest.approx([20.0, 22.0])


def test_a_spot_check_is_not_fooled_by_one_fast_forward(monkeypatch):
    """The check takes the median of its forwards, as the table does: one fast outlier among
    them leaves a table that fits alone."""
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    times = iter([10.0] + [6.0, 10.0, 10.0, 10.0, 10.0] + [11.0] * calibration.SPOT_REPEATS)  # warm-up, 1 row, 2 rows

    monkeypatch.setattr(calibration, "forward_ms", lambda model, cache, *, positions, kv_len, batch=1: next(times))
    assert calibration.stale_widths(model, cache, calibration.StepCost((10.0, 11.0)), 2) == []


def test_a_first_sweep_cut_short_gives_the_widths_it_measured():
    assert calibration.table_from_sweeps([[4.0, 6.0]]) == pytest.approx([4.0, 6.0])
    with pytest.raises(ValueError):
        calibration.table_from_sweeps([])
