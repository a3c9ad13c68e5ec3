"""Compare two builds scenario by scenario: a git revision against this checkout.

    .venv/bin/python benchmarks/compare_builds.py REV [--quick] [--passes 2] [--only hol,mtp] [--out DIR]

For a change that must leave the numbers alone (a refactor), or one that should move one
of them. The revision is checked out into a temporary git worktree and runs on this
checkout's .venv with its own sources first on ``PYTHONPATH``. For each pass and each
scenario the two builds run back to back (``speclane bench NAME``, one process each),
alternating which goes first, so the machine's drift hits both alike. The key ratio of
each scenario is printed as a table with one value per pass (reports in ``DIR/passN-*``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ["decode", "concurrency", "speedup", "hol", "throughput", "fairness", "priority", "overhead", "mtp"]

# (scenario, table title prefix, key column, key, value column, label)
KEY_RATIOS = [
    ("decode", "Single-stream greedy decode", "engine", "speclane", "vs transformers", "decode: speclane vs transformers"),
    ("concurrency", "Aggregate greedy decode", "streams", "4", "ratio", "concurrency: 4 streams vs transformers"),
    ("speedup", "Single-stream speed-up", "task", "copy-heavy", "on/off", "speedup: copy, on/off"),
    ("speedup", "Single-stream speed-up", "task", "code-edit+prediction", "on/off", "speedup: code edit + prediction, on/off"),
    ("speedup", "Single-stream speed-up", "task", "chat", "on/off", "speedup: chat, on/off"),
    ("speedup", "Copy-heavy task by draft depth", "K", "K=8", "vs off", "speedup: copy at K=8 vs off"),
    ("hol", "Head-of-line", "mode", "slice", "p99 vs no spec stream", "hol: classic p99, slice vs alone"),
    ("hol", "Head-of-line", "mode", "burst", "p99 vs no spec stream", "hol: classic p99, burst vs alone"),
    ("throughput", "Aggregate throughput", "mode", "lane on, adaptive K", "vs off (median of paired runs)",
     "throughput: closed batch vs off"),
    ("throughput", "Sustained throughput", "mode", "lane on, adaptive K", "vs off (median of paired runs)",
     "throughput: sustained vs off"),
    ("fairness", "Fairness", "policy", "fair lane (--fairness tenant)", "Jain (lane share)", "fairness: Jain, fair lane"),
    ("priority", "Priority", "preemption", "on", "ticks from eligible to holding", "priority: ticks, preemption on"),
    ("priority", "Priority", "preemption", "off (--no-spec-preempt)", "ticks from eligible to holding",
     "priority: ticks, preemption off"),
    ("overhead", "Lane decision cost", "waiters", "10000", "µs per decision (median of rounds)", "overhead: µs per decision, 10k waiters"),
    ("mtp", "Chat outside the head", "drafter", "mtp", "vs off", "mtp: chat vs off"),
    ("mtp", "Chat outside the head", "drafter", "ngram", "vs off", "mtp: n-gram vs off"),
]


def run_scenario(tree: Path, name: str, out: Path, quick: bool) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [str(ROOT / ".venv" / "bin" / "speclane"), "bench", name, "--out", str(out)] + (["--quick"] if quick else [])
    with open(out.with_suffix(".log"), "a") as log:
        return subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def key_value(out: Path, scenario: str, title: str, key_column: str, key: str, column: str) -> str | None:
    report = out / scenario / "report.json"
    if not report.is_file():
        return None
    tables: list[dict[str, Any]] = json.loads(report.read_text()).get("tables", [])
    for table in tables:
        if not str(table.get("title", "")).startswith(title):
            continue
        columns = table["columns"]
        for row in table["rows"]:
            if str(row[columns.index(key_column)]) == key:
                return str(row[columns.index(column)])
    return None


def comparison_table(out: Path, rev: str, passes: int, names: list[str]) -> str:
    lines = [f"| measurement | {rev} | this checkout |", "|---|---|---|"]
    for scenario, title, key_column, key, column, label in KEY_RATIOS:
        if scenario not in names:
            continue
        cells = []
        for side in ("before", "after"):
            values = [key_value(out / f"pass{p}-{side}", scenario, title, key_column, key, column) for p in range(1, passes + 1)]
            cells.append(" / ".join(v if v is not None else "-" for v in values))
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision to compare this checkout with")
    parser.add_argument("--quick", action="store_true", help="the scenarios' short runs")
    parser.add_argument("--passes", type=int, default=2, help="runs of every scenario on each build")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    parser.add_argument("--out", default="bench-compare", help="where the reports go")
    args = parser.parse_args(argv)
    names = [n for n in SCENARIOS if not args.only or n in args.only.split(",")]
    if args.only and set(args.only.split(",")) - set(SCENARIOS):
        parser.error(f"unknown scenario(s); valid: {', '.join(SCENARIOS)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="speclane-rev-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), args.rev], cwd=ROOT, check=True)
        try:
            for p in range(1, args.passes + 1):
                for i, name in enumerate(names):
                    order = [("before", tree), ("after", ROOT)]
                    if (p + i) % 2:
                        order.reverse()
                    for side, source in order:
                        print(f"pass {p}: {name} on {side}", flush=True)
                        rc = run_scenario(source, name, out / f"pass{p}-{side}", args.quick)
                        if rc != 0:
                            print(f"  failed with exit code {rc} (log: {out / f'pass{p}-{side}.log'})", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    table = comparison_table(out, args.rev, args.passes, names)
    (out / "comparison.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
