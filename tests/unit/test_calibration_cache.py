"""The step-cost calibration is cached per model and machine (engine/calibration.py): a
cached table must never be reused where the costs differ."""

from __future__ import annotations

import json

import torch

from speclane.engine import calibration
from speclane.models.kv_cache import KVCache
from speclane.models.toy import toy_config, toy_model


def test_step_cost_is_cached_per_model_and_row_count(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    cfg = toy_config()
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 4, 200, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    eager = calibration.step_cost(model, cache, max_rows=3)
    assert len(list(tmp_path.glob("step-cost-*.json"))) == 1
    def measured_again(*args, **kwargs):
        raise AssertionError("the cached table should have been read back")

    monkeypatch.setattr(calibration, "measure_step_cost", measured_again)
    assert calibration.step_cost(model, cache, max_rows=3) == eager
    # The folder passed in is the one read (the environment's by default).
    assert calibration.step_cost(model, cache, max_rows=3, directory=tmp_path) == eager
    # A different row count is a different table.
    assert calibration._key(model, 4) != calibration._key(model, 3)
    saved = json.loads(next(tmp_path.glob("step-cost-*.json")).read_text())
    assert len(saved["ms_by_rows"]) == 3



def test_calibration_stays_inside_the_models_positions():
    # The cache holds K draft positions past the served length; a model whose position
    # limit is that length must still calibrate (it raised "position beyond the model's").
    cfg = toy_config(max_positions=24)
    model = toy_model(cfg)
    cache = KVCache(cfg.num_layers, 2, 24 + 4 + 1, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    cost = calibration.measure_step_cost(model, cache, max_rows=5, repeats=1)
    assert cost.ms(1) > 0
