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
         "returncode": 0, "commit": "abc1234", "machine": "Some CPU, 2 cores, kernel builds avx2"}))
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
    assert ("`speclane bench throughput --quick`: 2026-12-02 10:00, 1.6 min, commit abc1234, "
            "on Some CPU, 2 cores, kernel builds avx2." in page)
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


def test_a_rerun_into_a_folder_of_its_own_keeps_the_pages_other_sections_and_their_plots(tmp_path, monkeypatch):
    """``--only gguf --out NEW``: the page's other sections (and plots) stay, named in the
    header as kept from the page it replaced, with that page's commit."""
    run_all = _run_all()
    first = tmp_path / "first"
    for name in ("vs-llama-cpp", "gguf"):
        write_report(first / name, f"speclane bench {name}", [Table(f"{name} table", ["arm", "x"], [["old", 1.0]])])
        (first / name / "run.json").write_text(json.dumps({"command": f"speclane bench {name}", "commit": "old1234"}))
    (first / "vs-llama-cpp" / "rates.png").write_bytes(b"vs plot")
    docs = tmp_path / "docs" / "benchmarks.md"
    run_all.write_page(first, docs, quick=False)
    assert (docs.parent / "img" / "vs-llama-cpp-rates.png").exists()
    rerun = tmp_path / "rerun"
    write_report(rerun / "gguf", "speclane bench gguf", [Table("gguf table", ["arm", "x"], [["new", 2.0]])])
    monkeypatch.setattr(run_all, "run_scenarios", lambda names, folder, quick: None)
    assert run_all.main(["--only", "gguf", "--out", str(rerun), "--docs", str(docs)]) == 0
    page = docs.read_text()
    assert "| new | 2 |" in page and "| old | 1 |" not in page.split("## gguf")[1]
    assert "## vs-llama-cpp" in page and "![vs-llama-cpp: rates](img/vs-llama-cpp-rates.png)" in page
    assert (docs.parent / "img" / "vs-llama-cpp-rates.png").read_bytes() == b"vs plot"
    assert "Kept from the page this one replaced" in page and "`vs-llama-cpp`" in page
    vs_section = page.split("## vs-llama-cpp")[1].split("## gguf")[0]
    assert "duration not recorded, commit old1234, on " in vs_section  # the kept section names its own run
    assert page.index("## vs-llama-cpp") < page.index("## gguf")


def test_a_kept_section_keeps_the_machine_its_page_named_through_later_replacements(tmp_path, monkeypatch):
    """A section kept from a page measured on another machine names that machine (from the
    page's header), and keeps naming it when the page is replaced again on a third."""
    run_all = _run_all()
    monkeypatch.setattr(run_all, "run_scenarios", lambda names, folder, quick: None)
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir(parents=True)
    docs.write_text("# Benchmarks\n\n| | |\n|---|---|\n| CPU | Old CPU |\n| kernel builds | avx512, avx2 |\n\n"
                    "## gguf\n\n`speclane bench gguf`: 2026-12-01 10:00, 1.0 min, commit old1234.\n\n| old table |\n\n"
                    "## decode\n\n`speclane bench decode`: 2026-12-01 10:00, 1.0 min, commit old1234.\n\n| CPU | Not a header |\n")
    for number, name in enumerate(("decode", "prefix")):
        out = tmp_path / f"rerun{number}"
        write_report(out / name, f"speclane bench {name}", [Table(f"{name} table", ["arm", "x"], [["new", 2.0]])])
        (out / name / "run.json").write_text(json.dumps({"command": f"speclane bench {name}", "commit": f"new{number}",
                                                         "machine": f"New CPU {number}, 2 cores, kernel builds avx2"}))
        assert run_all.main(["--only", name, "--out", str(out), "--docs", str(docs)]) == 0
        page = docs.read_text()
        gguf = page.split("## gguf")[1].split("## ")[0]
        assert "commit old1234, on Old CPU, kernel builds avx512, avx2." in gguf
        assert f"| machine | New CPU {number}, 2 cores, kernel builds avx2 (torch threads: " in page
    decode = page.split("## decode")[1].split("## ")[0]
    assert "commit new0, on New CPU 0, 2 cores, kernel builds avx2." in decode, "kept from the second page, with its own machine"
