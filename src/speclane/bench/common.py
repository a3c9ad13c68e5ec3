"""Small helpers shared by the benchmark scenarios: timing, percentiles, tables.

No torch at import time (``speclane simulate`` uses ``Table`` and ``percentile``)."""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median of the paired ratios ``numerators[i] / denominators[i]`` (two arms measured
    side by side: the same prompt, or the same pass); pairs where either side did not
    measure (not above 0, or NaN) are left out; NaN where none is left."""
    pairs = zip(numerators, denominators, strict=True)
    return median([a / b for a, b in pairs if a > 0 and b > 0])


def times(ratio: float) -> str:
    """A ratio as "1.23x", or "-" where it is NaN (nothing was measured)."""
    return f"{ratio:.2f}x" if ratio == ratio else "-"


def stream_gaps(token_times: Sequence[float]) -> list[float]:
    """Gaps between a stream's consecutive token arrivals (tokens of one tick share a time)."""
    return [b - a for a, b in zip(token_times, token_times[1:], strict=False) if b > a]


def classic_stream_gaps(timelines: Mapping[str, Any]) -> list[float]:
    """Inter-token gaps (s) of the classic streams (``speculative=False``) among driver timelines."""
    return [gap for tl in timelines.values() if not tl.job.options.get("speculative", True)
            for gap in stream_gaps(tl.token_times)]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def alternate(arms: dict[str, Callable[[], float]], repeats: int, warmup: bool = True, progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Run each arm ``repeats`` times, alternating, after a discarded warm-up of each.

    Each arm returns one measurement; noise on a shared 2-core machine hits every arm
    alike when they alternate, so their ratio is what the tables report. The first repeat
    runs the arms in the given order, each later one in an order shuffled by its number (the
    same every run), so no arm always runs right after the same one: an arm that leaves the
    machine worse off for a moment (a process's threads still spinning, caches full of
    another copy of the weights) does not always cost the same neighbour.
    """
    results: dict[str, list[float]] = {name: [] for name in arms}
    if warmup:
        for name, fn in arms.items():
            if progress:
                progress(f"warm-up {name}")
            fn()
    for i in range(repeats):
        order = list(arms)
        if i:
            random.Random(i).shuffle(order)
        for name in order:
            if progress:
                progress(f"run {i + 1}/{repeats} {name}")
            results[name].append(arms[name]())
    return results


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def markdown(self) -> str:
        def fmt(v: Any) -> str:
            if isinstance(v, float):
                return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
            return str(v)

        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.rows]
        lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    import torch  # here, not at import: the simulator uses these helpers without torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
    }


def write_report(out_dir: str | Path, name: str, tables: list[Table], extra: dict[str, Any] | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    text = f"# {name}\n\n{json.dumps(env)}\n\n" + "\n".join(t.markdown() for t in tables)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({"name": name, "env": env, "tables": [t.__dict__ for t in tables], **(extra or {})}, indent=2, default=str))
    return out / "report.md"
