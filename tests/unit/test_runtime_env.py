"""config.runtime_env: the SPECLANE_* settings without a flag (cache folders, the
shutdown grace), with the defaults the code that reads them has always had."""

from __future__ import annotations

import pytest

from speclane.config import runtime_env


def test_defaults_live_under_the_home_cache():
    env = runtime_env({})
    assert env.weight_cache_dir is not None and env.weight_cache_dir.parts[-2:] == ("speclane", "weights")
    assert env.calibration_dir.parts[-2:] == ("speclane", "calibration")
    assert env.kernel_dir.parts[-2:] == ("speclane", "kernels")
    assert env.shutdown_grace_s(30.0) == 30.0


def test_variables_move_the_folders_and_set_the_grace(tmp_path):
    env = runtime_env({"SPECLANE_CACHE_DIR": str(tmp_path / "w"), "SPECLANE_CALIBRATION_DIR": str(tmp_path / "c"),
                       "SPECLANE_KERNEL_DIR": str(tmp_path / "k"), "SPECLANE_SHUTDOWN_GRACE_S": "2.5"})
    assert (env.weight_cache_dir, env.calibration_dir, env.kernel_dir) == (tmp_path / "w", tmp_path / "c", tmp_path / "k")
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


def test_kernels_are_built_where_the_variable_says(monkeypatch, tmp_path):
    """Read at the call: a folder that cannot be made is a KernelUnavailable (the model then
    runs on torch's ops), and a writable one receives the build."""
    from speclane.kernels import build, norm_cpu

    source = norm_cpu.SOURCE
    try:
        isa = build.pick_isa(norm_cpu.ISAS)
    except build.KernelUnavailable:
        pytest.skip("no vector build runs on this CPU")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECLANE_KERNEL_DIR", str(blocker / "kernels"))
    with pytest.raises(build.KernelUnavailable, match="Not a directory"):
        build.load_build(source, isa, lambda lib: None)
    monkeypatch.setenv("SPECLANE_KERNEL_DIR", str(tmp_path / "kernels"))
    kernel = build.load_build(source, isa, lambda lib: None)
    assert kernel.isa == isa and [p.suffix for p in (tmp_path / "kernels").iterdir()] == [".so"]
