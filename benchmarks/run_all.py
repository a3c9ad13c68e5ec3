"""Run every benchmark scenario in sequence and collect the tables into docs/benchmarks.md.

    .venv/bin/python benchmarks/run_all.py [--quick] [--only decode,speedup]

Each scenario runs in its own process (`speclane bench NAME --out bench-out`), so one
scenario's memory and threads never disturb the next; the tables of each report.md are
pasted into docs/benchmarks.md under the command that produced them and the date.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["decode", "concurrency", "speedup", "hol", "throughput", "fairness", "priority", "overhead", "mtp"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()
    names = [n for n in ORDER if not args.only or n in args.only.split(",")]
    sections = {}
    for name in names:
        cmd = [str(ROOT / ".venv/bin/speclane"), "bench", name, "--out", args.out] + (["--quick"] if args.quick else [])
        print("$", " ".join(cmd[1:]), flush=True)
        started = datetime.datetime.now()
        result = subprocess.run(cmd, cwd=ROOT)
        if result.returncode != 0:
            print(f"{name} failed with exit code {result.returncode}", file=sys.stderr)
            continue
        report = (ROOT / args.out / name / "report.md").read_text()
        tables = report.split("\n\n", 2)[2] if report.count("\n\n") >= 2 else report
        minutes = (datetime.datetime.now() - started).total_seconds() / 60
        sections[name] = (f"`speclane bench {name}{' --quick' if args.quick else ''}` — {started:%Y-%m-%d %H:%M}, {minutes:.1f} min\n\n" + tables)
    out = ROOT / "docs" / "benchmarks-latest.md"
    out.write_text("\n".join(f"## {n}\n\n{s}" for n, s in sections.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
