"""PNG plots for ``speclane simulate`` (matplotlib, Agg backend, no display).

- ``waits``: the distribution of waits to a first grant, against the lane's bound;
- ``lane_shares``: each tenant's lane rounds over its fair share, per policy.
Both take plain data (not simulator objects), so tests can feed them synthetic values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from speclane.bench.plots import cdf, plt, save_figure

COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def waits(data: Mapping[str, Sequence[tuple[float, int]]], path: Path, title: str) -> Path:
    """``data``: policy -> [(bound in ticks, wait in ticks)]; an infinite bound = none."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for colour, (policy, samples) in zip(COLOURS, data.items(), strict=False):
        raw = [float(w) for _, w in samples]
        if raw:
            right.plot(*cdf(raw), label=policy, color=colour)
        ratios = [w / b for b, w in samples if math.isfinite(b) and b > 0]
        if ratios:
            left.plot(*cdf(ratios), label=policy, color=colour)
    left.axvline(1.0, color="black", linestyle="--", linewidth=1)
    left.set_xlabel("wait / bound ceil(W/S)·B  (promise: ≤ 1, dashed)")
    left.set_ylabel("fraction of waits")
    left.set_title("Waits against the lane's bound")
    right.set_xscale("symlog", linthresh=1)
    right.set_xlabel("wait to first grant (ticks)")
    right.set_title("Waits to a first grant")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


def lane_shares(data: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """``data``: policy -> every tenant's actual / fair lane rounds."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for colour, (policy, ratios) in zip(COLOURS, data.items(), strict=False):
        if ratios:
            ax.plot(*cdf([max(r, 1e-3) for r in ratios]), label=policy, color=colour)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("lane rounds received / fair share while backlogged (1 = fair; 0 drawn at 0.001)")
    ax.set_ylabel("fraction of tenants")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return save_figure(fig, path)
