"""How close the step-cost calibration comes to this machine's step costs: several
calibrations' tables (``engine/calibration.table_from_sweeps``, and each width's fastest
forward from the same sweeps) against the medians of many sweeps made after each, as
ratios to one row (what adaptive K and ``--drafter auto`` read).

    .venv/bin/python benchmarks/calibration_check.py [--widths 9] [--calibrations 4] [--reference-sweeps 30]

Prints one table per calibration: by width, the calibration's ratio, the fastest
forwards' ratio and the reference's.
"""

from __future__ import annotations

import argparse
import statistics

from speclane.bench.factory import EngineFactory
from speclane.config import EngineConfig
from speclane.engine import calibration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, default=9, help="rows of the widest forward (a verify of 8 drafts)")
    parser.add_argument("--calibrations", type=int, default=4)
    parser.add_argument("--reference-sweeps", type=int, default=30)
    args = parser.parse_args()
    engine = EngineFactory(EngineConfig.from_flat(num_threads=2)).engine(spec_mode="off")
    model, cache = engine.model, engine.cache
    kv_len = calibration._context(model, cache, args.widths)

    def sweeps(count: int) -> list[list[float]]:
        calibration.forward_ms(model, cache, positions=1, kv_len=kv_len)  # warm-up
        return [calibration.sweep(model, cache, args.widths, kv_len) for _ in range(count)]

    for number in range(1, args.calibrations + 1):
        measured = sweeps(calibration.SWEEPS)
        table = calibration.table_from_sweeps(measured)
        fastest = [min(sweep[w] for sweep in measured) for w in range(args.widths)]
        reference = sweeps(args.reference_sweeps)
        medians = [statistics.median(sweep[w] for sweep in reference) for w in range(args.widths)]
        print(f"\ncalibration {number} ({calibration.SWEEPS} sweeps), then {args.reference_sweeps} reference sweeps; "
              f"one row {table[0]:.2f} ms (reference median {medians[0]:.2f} ms)")
        print("| rows | calibration | fastest forwards | reference medians |\n|---|---|---|---|")
        for w in range(args.widths):
            print(f"| {w + 1} | {table[w] / table[0]:.2f} | {fastest[w] / fastest[0]:.2f} | {medians[w] / medians[0]:.2f} |")


if __name__ == "__main__":
    main()
