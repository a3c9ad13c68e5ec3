"""benchmarks/compare_builds.py reads each scenario's key ratio from both builds' reports."""

from __future__ import annotations

from pathlib import Path

import benchmark_scripts

from speclane.bench.common import Table, write_report


def _compare_builds():
    return benchmark_scripts.load("compare_builds")


def _hol_report(out: Path, slice_p99: str) -> None:
    table = Table("Head-of-line: classic streams' inter-token latency beside one speculative stream",
                  ["mode", "classic ITL p99 ms", "p99 vs no spec stream"])
    table.add("no speculative stream", 10.0, "1.00x")
    table.add("slice", 12.0, slice_p99)
    write_report(out / "hol", "speclane bench hol", [table])


def test_each_pass_of_each_build_gives_its_value_and_a_missing_run_reads_as_a_dash(tmp_path):
    cb = _compare_builds()
    _hol_report(tmp_path / "pass1-before", "1.20x")
    _hol_report(tmp_path / "pass2-before", "1.25x")
    _hol_report(tmp_path / "pass1-after", "1.10x")  # pass 2 of this build did not run
    table = cb.comparison_table(tmp_path, "abc1234", 2, ["hol"])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert rows["hol: classic p99, slice vs alone"] == "| hol: classic p99, slice vs alone | 1.20x / 1.25x | 1.10x / - |"
    assert rows["hol: classic p99, burst vs alone"] == "| hol: classic p99, burst vs alone | - / - | - / - |"
    assert all("decode" not in line for line in table.splitlines())  # only the scenarios asked for
