"""Run every benchmark scenario, then write docs/benchmarks.md from their reports.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only decode,speedup] [--out bench-out]
    .venv/bin/python benchmarks/run_all.py --from bench-out [--quick]   # rebuild the page only

Each scenario runs in its own process (``speclane bench NAME --out DIR [--quick]``), so one
scenario's memory and threads never disturb the next. Beside each scenario's report the
script writes ``run.json`` (the command, when it started, how long it took, its exit
status, the git commit and the machine). The page is then written from the out folder alone, so
``--from DIR`` rebuilds it from an earlier run without running anything. The page holds
every scenario whose report is in the out folder (``--only`` reruns some of them into it,
and the others keep their sections; into a folder of its own, the others keep the sections
of the page it replaces, named in the header): a header (how to regenerate it, the machine, torch, the date,
the commit), then per scenario its command, date, duration, commit, machine and tables. The plots a
scenario writes (``*.png``) are copied into ``img/`` beside the page and linked from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["decode", "concurrency", "speedup", "hol", "throughput", "fairness", "priority", "overhead", "mtp", "drafters", "structured", "toolcall", "prefix", "vs-llama-cpp", "gguf", "replicas"]
DEFAULT_DOCS = ROOT / "docs" / "benchmarks.md"


# -- running -------------------------------------------------------------------------------


def run_scenarios(names: list[str], out: Path, quick: bool) -> None:
    """``speclane bench NAME`` for each name, one process each; ``out/NAME/run.json`` records it."""
    speclane = ROOT / ".venv" / "bin" / "speclane"
    commit = git_commit()
    for name in names:
        args = ["bench", name, "--out", str(out)] + (["--quick"] if quick else [])
        print("$ speclane", " ".join(args), flush=True)
        started = datetime.datetime.now()
        clock = time.perf_counter()
        result = subprocess.run([str(speclane), *args], cwd=ROOT)
        record = {
            "command": " ".join(["speclane", "bench", name] + (["--quick"] if quick else [])),
            "started": started.strftime("%Y-%m-%d %H:%M"),
            "duration_s": round(time.perf_counter() - clock, 1),
            "returncode": result.returncode,
            "commit": commit,
            "machine": machine(),
        }
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "run.json").write_text(json.dumps(record, indent=2) + "\n")
        if result.returncode != 0:
            print(f"{name} failed with exit code {result.returncode}", file=sys.stderr)


# -- the page ------------------------------------------------------------------------------


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" (with uncommitted changes)" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def kernel_builds() -> str:
    """The builds of speclane's kernels this CPU runs, widest first, by the kernels' own probe."""
    from speclane.kernels import build

    runs = [isa for isa in build.ISA_CPU_FLAGS if not build.missing_cpu_flags(isa)]
    lacks = [isa for isa in build.ISA_CPU_FLAGS if isa not in runs]
    return (", ".join(runs) or "none") + (f" (not {', '.join(lacks)})" if lacks else "")


def machine() -> str:
    """This machine as a section of the page names it: a page may hold sections of another."""
    return f"{cpu_model()}, {num_cores()} cores, kernel builds {kernel_builds()}"


def num_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tables_markdown(folder: Path) -> str | None:
    """The scenario's tables, rendered as ``speclane bench`` renders them, or None."""
    report = _read_json(folder / "report.json")
    if report is not None and "tables" in report:
        from speclane.bench.common import Table

        return "\n".join(Table(**table).markdown() for table in report["tables"])
    try:
        text = (folder / "report.md").read_text()
    except OSError:
        return None
    # report.md: "# title", the environment as one JSON line, then the tables.
    return text.split("\n\n", 2)[2] if text.count("\n\n") >= 2 else text


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _section(name: str, folder: Path, quick: bool, img_dir: Path, docs_dir: Path) -> str | None:
    run = _read_json(folder / "run.json") or {}
    report = _read_json(folder / "report.json") or {}
    tables = _tables_markdown(folder)
    if tables is None and not run:
        return None
    for old in img_dir.glob(f"{name}-*.png") if img_dir.is_dir() else ():
        if _image_scenario(old, ORDER) == name:
            old.unlink()  # this scenario's plots are written again below, or are gone
    command = run.get("command") or f"speclane bench {name}" + (" --quick" if quick else "")
    date = run.get("started") or report.get("env", {}).get("date", "date not recorded")
    duration = _minutes(run["duration_s"]) if "duration_s" in run else "duration not recorded"
    lines = [f"## {name}", ""]
    description = _description(name)
    if description:
        lines += [description[0].upper() + description[1:] + ".", ""]
    measured = f", commit {run['commit']}" if run.get("commit") else ""
    measured += f", on {run['machine']}" if run.get("machine") else ""
    lines += [f"`{command}`: {date}, {duration}{measured}.", ""]
    if run.get("returncode", 0) != 0 or tables is None:
        lines += [f"The run failed (exit status {run.get('returncode', '?')}); it wrote no tables.", ""]
        return "\n".join(lines)
    lines.append(tables.strip())
    images = sorted(folder.glob("*.png"))
    if images:
        img_dir.mkdir(parents=True, exist_ok=True)
        lines.append("")
        for image in images:
            target = img_dir / f"{name}-{image.name}"
            shutil.copyfile(image, target)
            link = os.path.relpath(target, docs_dir)
            lines += [f"![{name}: {image.stem}]({link})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _description(name: str) -> str:
    try:
        from speclane.bench.cli import SCENARIOS
    except ImportError:
        return ""
    return SCENARIOS.get(name, "")


def _header(runs: list[dict[str, Any]], reports: list[dict[str, Any]], missing: list[str], quick: bool,
            commit: str | None) -> str:
    commits = sorted({r["commit"] for r in runs if r.get("commit")})
    if commit is None:
        commit = ", ".join(commits) if commits else f"{git_commit()}, the checkout that wrote this page (the run recorded none)"
    machines = sorted({r["machine"] for r in runs if r.get("machine")})
    torch_versions = sorted({r["env"]["torch"] for r in reports if r.get("env", {}).get("torch")})
    threads = sorted({str(r["env"]["threads"]) for r in reports if r.get("env", {}).get("threads")})
    dates = sorted([r["started"] for r in runs if r.get("started")]
                   + [r["env"]["date"] for r in reports if r.get("env", {}).get("date")])
    when = f"{dates[0]} to {dates[-1]}" if dates and dates[0] != dates[-1] else (dates[0] if dates else "unknown")
    quick_flag = " --quick" if quick else ""
    lines = [
        "# Benchmarks",
        "",
        "This page is written by `benchmarks/run_all.py` from one run of every `speclane bench` "
        "scenario; edit the script, not the page. Regenerate it with",
        "",
        "```sh",
        f"make install && .venv/bin/python benchmarks/run_all.py{quick_flag}        # run, then write this page",
        f".venv/bin/python benchmarks/run_all.py --from bench-out{quick_flag}     # rewrite it from an earlier run",
        "```",
        "",
        "Each scenario runs in its own process; its `report.md` / `report.json` (and plots) are in "
        "`bench-out/NAME/`. Ratios are measured side by side within one run, so they are what to "
        "read on a shared machine; absolute tok/s move with the machine's load.",
        "",
        "| | |",
        "|---|---|",
        *([f"| machine | {'; '.join(machines)} (torch threads: {', '.join(threads) or 'unknown'}) |"] if machines else [
            f"| CPU | {cpu_model()} |",
            f"| kernel builds | {kernel_builds()} |",
            f"| cores | {num_cores()} (torch threads: {', '.join(threads) or 'unknown'}) |"]),
        f"| torch | {', '.join(torch_versions) or 'unknown'} |",
        f"| date | {when} |",
        f"| commit | {commit} |",
        f"| run | {'quick (`--quick`)' if quick else 'full'} |",
    ]
    if missing:
        lines += ["", "Not in this run: " + ", ".join(f"`{m}`" for m in missing) + "."]
    return "\n".join(lines) + "\n"


def _image_scenario(image: Path, names: list[str]) -> str | None:
    """The scenario whose plot ``image`` (``img/NAME-plot.png``) is, or None."""
    return next((name for name in sorted(names, key=len, reverse=True) if image.name.startswith(f"{name}-")), None)


def _page_sections(page: str) -> dict[str, str]:
    """An earlier page's scenario sections by name: from a ``## NAME`` line (NAME a
    scenario) to the next such line; any other line belongs to the section it is in."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in page.splitlines():
        if line.startswith("## ") and line[3:].strip() in ORDER:
            current = sections[line[3:].strip()] = [line]
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).rstrip() + "\n" for name, lines in sections.items()}


def _earlier_machine(page: str) -> str | None:
    """The machine an earlier page's header names (its machine row, or its CPU and kernel
    builds rows); None where it names none."""
    header = page.split("\n## ", 1)[0]
    row = re.search(r"^\| machine \| (.*?)(?: \(torch threads: [^)]*\))? \|$", header, flags=re.MULTILINE)
    if row:
        return row.group(1)
    rows = dict(re.findall(r"^\| (CPU|kernel builds) \| (.*) \|$", header, flags=re.MULTILINE))
    return ", ".join(f"{key} {value}" if key != "CPU" else value for key, value in rows.items()) or None


def _with_machine(section: str, machine: str | None) -> str:
    """A kept section whose run line names no machine names the one its page named, so the
    machine stays with the section through later replacements."""
    lines = section.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("`speclane bench") and line.endswith(".") and ", on " not in line and machine:
            lines[i] = f"{line[:-1]}, on {machine}."
            break
    return "\n".join(lines)


def write_page(out: Path, docs: Path, quick: bool, names: list[str] = ORDER, commit: str | None = None,
               keep_earlier: bool = False) -> list[str]:
    """Write ``docs`` from the reports under ``out``; return the scenarios it covers.

    ``keep_earlier``: a scenario with no report under ``out`` keeps its section (and plots)
    from the page being replaced (each section names its own run's date, commit and machine), and
    the header names it as kept (``--only`` run into a folder of its own)."""
    docs_dir = docs.resolve().parent
    img_dir = docs_dir / "img"
    earlier = docs.read_text() if keep_earlier and docs.is_file() else ""
    kept_sections = _page_sections(earlier)
    earlier_machine = _earlier_machine(earlier)
    sections, covered, missing, kept, runs, reports = [], [], [], [], [], []
    for name in names:
        folder = out / name
        section = _section(name, folder, quick, img_dir, docs_dir) if folder.is_dir() else None
        if section is None and name in kept_sections:
            kept.append(name)
            sections.append(_with_machine(kept_sections[name], earlier_machine))
            continue
        if section is None:
            missing.append(name)
            continue
        covered.append(name)
        sections.append(section)
        runs.append(_read_json(folder / "run.json") or {})
        reports.append(_read_json(folder / "report.json") or {})
    header = _header(runs, reports, missing, quick, commit)
    if kept:
        header += ("\nKept from the page this one replaced (their own runs; each section gives its date and, "
                   "where recorded, its commit and machine): " + ", ".join(f"`{k}`" for k in kept) + ".\n")
    # A rewritten section replaced its own plots (``_section``); a scenario without one,
    # neither rewritten nor kept, leaves none behind.
    for image in img_dir.glob("*.png") if img_dir.is_dir() else ():
        if _image_scenario(image, names) in missing:
            image.unlink()
    page = header + "\n" + "\n".join(sections)
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(page)
    return covered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (with --from: the runs were short)")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    parser.add_argument("--out", default="bench-out", help="where the scenarios write their reports")
    parser.add_argument("--from", dest="from_dir", default=None,
                        help="write the page from this earlier run's out folder; run nothing")
    parser.add_argument("--docs", default=str(DEFAULT_DOCS), help="the page to write")
    parser.add_argument("--commit", default=None,
                        help="with --from: the commit the run measured, where its run.json files record none")
    args = parser.parse_args(argv)
    names = [n for n in ORDER if not args.only or n in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - set(ORDER)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; valid: {', '.join(ORDER)}")
    if args.from_dir is None:
        out = Path(args.out)
        out = out if out.is_absolute() else ROOT / out
        run_scenarios(names, out, args.quick)
    else:
        out = Path(args.from_dir)
        if not out.is_dir():
            parser.error(f"--from {out}: no such folder")
    # The page holds every scenario whose report is in ``out``, not only those --only named:
    # rerunning one scenario into a folder that holds the others' reports updates its section
    # and keeps theirs.
    # With --only, a scenario whose report is not in ``out`` (a folder of its own) keeps its
    # section of the page being replaced rather than dropping out of it.
    covered = write_page(out, Path(args.docs), args.quick, commit=args.commit, keep_earlier=bool(args.only))
    print(f"wrote {args.docs} ({', '.join(covered) or 'no scenario'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
