"""config.runtime_env: the SPECLANE_* settings without a flag (cache folders, the
shutdown grace), with the defaults the code that reads them has always had."""

from __future__ import annotations

import pytest

from speclane.config import runtime_env


def test_defaults_live_under_the_home_cache():
    env = runtime_env({})
    assert env.weight_cache_dir is not None and env.weight_cache_dir.parts[-2:] == ("speclane", "weights")
    assert env.calibration_dir.parts[-2:] == ("speclane", "calibration")
    assert env.shutdown_grace_s(30.0) == 30.0


def test_variables_move_the_folders_and_set_the_grace(tmp_path):
    env = runtime_env({"SPECLANE_CACHE_DIR": str(tmp_path / "w"), "SPECLANE_CALIBRATION_DIR": str(tmp_path / "c"),
                       "SPECLANE_SHUTDOWN_GRACE_S": "2.5"})
    assert (env.weight_cache_dir, env.calibration_dir) == (tmp_path / "w", tmp_path / "c")
    assert env.shutdown_grace_s(30.0) == 2.5


@pytest.mark.parametrize(("value", "off"), [("1", True), ("true", True), ("yes", True), ("0", False), ("", False)])
def test_no_weight_cache_turns_the_weight_cache_off(value, off):
    assert (runtime_env({"SPECLANE_NO_WEIGHT_CACHE": value}).weight_cache_dir is None) == off


def test_a_bad_grace_is_an_error_where_a_server_stops_only():
    env = runtime_env({"SPECLANE_SHUTDOWN_GRACE_S": "soon"})  # reading it is no error
    with pytest.raises(ValueError, match="SPECLANE_SHUTDOWN_GRACE_S must be a number of seconds"):
        env.shutdown_grace_s(30.0)


def test_the_process_environment_is_read_at_the_call(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLANE_CALIBRATION_DIR", str(tmp_path))
    assert runtime_env().calibration_dir == tmp_path
