"""benchmarks/run_all.py writes docs/benchmarks.md from a bench-out folder alone (``--from``)."""

from __future__ import annotations

import json

import benchmark_scripts

from speclane.bench.common import Table, write_report


def _run_all():
    return benchmark_scripts.load("run_all")


def test_the_page_has_a_header_and_one_section_per_scenario_that_ran(tmp_path):
    out = tmp_path / "bench-out"
    table = Table("Aggregate throughput, 8 greedy streams x 32 tokens", ["arm", "tok/s", "ratio"])
    table.add("off", 500.0, 1.0)
    table.add("slice", 505.0, 1.01)
    write_report(out / "throughput", "speclane bench throughput", [table])
    (out / "throughput" / "run.json").write_text(json.dumps(
        {"command": "speclane bench throughput --quick", "started": "2026-12-02 10:00", "duration_s": 95.0,
         "returncode": 0, "commit": "abc1234"}))
    write_report(out / "hol", "speclane bench hol", [Table("Head-of-line", ["mode", "p99"], [["slice", 1.2]])])
    (out / "hol" / "itl-cdf.png").write_bytes(b"\x89PNG fake")
    (out / "mtp").mkdir()
    (out / "mtp" / "run.json").write_text(json.dumps({"command": "speclane bench mtp", "returncode": 1}))
    docs = tmp_path / "docs" / "benchmarks.md"
    (docs.parent / "img").mkdir(parents=True)
    (docs.parent / "img" / "hol-old.png").write_bytes(b"old")  # a stale image of a scenario: replaced
    (docs.parent / "img" / "diagram.png").write_bytes(b"keep")  # not a scenario's: kept

    covered = _run_all().write_page(out, docs, quick=True)

    page = docs.read_text()
    assert covered == ["hol", "throughput", "mtp"]
    assert page.startswith("# Benchmarks\n") and "benchmarks/run_all.py --from bench-out" in page
    assert "| commit | abc1234 |" in page
    assert "`speclane bench throughput --quick`: 2026-12-02 10:00, 1.6 min." in page
    assert "| slice | 505 | 1.01 |" in page
    assert "`speclane bench hol --quick`" in page and "duration not recorded" in page
    assert "![hol: itl-cdf](img/hol-itl-cdf.png)" in page
    assert (docs.parent / "img" / "hol-itl-cdf.png").read_bytes() == b"\x89PNG fake"
    assert not (docs.parent / "img" / "hol-old.png").exists()
    assert (docs.parent / "img" / "diagram.png").exists()
    assert "The run failed (exit status 1)" in page
    assert "Not in this run: `decode`, `concurrency`, `speedup`, `fairness`, `priority`, `overhead`, `drafters`, `structured`, `toolcall`, `prefix`, `vs-llama-cpp`, `gguf`, `replicas`." in page
    assert page.index("## hol") < page.index("## throughput") < page.index("## mtp")


def test_a_rerun_of_one_scenario_keeps_the_others_sections(tmp_path, monkeypatch):
    """``--only gguf --out F``: the page is written from every report in F, so the sections of
    the scenarios that did not rerun stay (a page of the rerun scenario alone dropped them)."""
    run_all = _run_all()
    out = tmp_path / "bench-out"
    for name in ("decode", "gguf"):
        write_report(out / name, f"speclane bench {name}", [Table(f"{name} table", ["arm", "x"], [["a", 1.0]])])
    ran = []
    monkeypatch.setattr(run_all, "run_scenarios", lambda names, folder, quick: ran.extend(names))
    docs = tmp_path / "docs" / "benchmarks.md"
    assert run_all.main(["--only", "gguf", "--out", str(out), "--docs", str(docs)]) == 0
    page = docs.read_text()
    assert ran == ["gguf"]
    assert "## decode" in page and "## gguf" in page
