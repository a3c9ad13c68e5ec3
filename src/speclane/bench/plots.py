"""PNG plots for the benchmark reports (matplotlib, no display needed).

- ``lane_timeline``: who held the lane when, per request, with yields and preemptions;
- ``lane_share_over_time``: each tenant's cumulative lane rounds;
- ``itl_cdf``: inter-token latency CDFs of classic streams, one line per mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TENANT_COLOURS = {"A": "tab:red", "B": "tab:blue", "C": "tab:green"}


def save_figure(fig, path: Path) -> Path:
    """Lay out, write the PNG, free the figure (every plot here and in ``sim/plots.py``)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their empirical cumulative fractions."""
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def lane_timeline(data: dict, path: Path, title: str) -> Path:
    """One row per request (grouped by tenant): bars while it held the lane, marks for yields/preemptions."""
    timelines, events, clock0 = data["timelines"], data["events"], data["clock0"]
    rows = sorted(timelines, key=lambda r: (timelines[r].job.options.get("tenant", ""), timelines[r].added_s))
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    open_grant: dict[str, float] = {}
    bars: dict[str, list[tuple[float, float]]] = {r: [] for r in rows}
    marks: list[tuple[float, str, str]] = []
    for ev in events:
        t = ev.time_s - clock0
        if ev.kind == "grant":
            open_grant[ev.request_id] = t
        elif ev.kind in ("yield", "preempt", "finish") and ev.request_id in open_grant:
            bars.setdefault(ev.request_id, []).append((open_grant.pop(ev.request_id), t))
            if ev.kind != "finish":
                marks.append((t, ev.request_id, ev.kind))
    end = max((tl.finished_s or 0) for tl in timelines.values())
    for rid, start in open_grant.items():
        bars.setdefault(rid, []).append((start, end))
    for y, rid in enumerate(rows):
        tl = timelines[rid]
        tenant = tl.job.options.get("tenant", "?")
        colour = TENANT_COLOURS.get(tenant, "tab:gray")
        ax.plot([tl.added_s, tl.finished_s or end], [y, y], color=colour, alpha=0.25, linewidth=1)
        ax.broken_barh([(s, max(e - s, 0.01)) for s, e in bars.get(rid, [])], (y - 0.35, 0.7), color=colour)
    for t, rid, kind in marks:
        if rid in rows:
            ax.plot(t, rows.index(rid), marker="v" if kind == "yield" else "x", color="black", markersize=5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{timelines[r].job.options.get('tenant', '?')}:{r}" for r in rows])
    ax.set_xlabel("time (s)")
    ax.set_title(f"Lane timeline — {title}\n(bars: holding the lane; thin line: request alive; v yield, x preemption)")
    return save_figure(fig, path)


def lane_share_over_time(data: dict, path: Path, title: str) -> Path:
    samples = data["samples"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if samples:
        tenants = sorted({t for _, c in samples for t in c})
        times = [t for t, _ in samples]
        for tenant in tenants:
            cumulative = [c.get(tenant, 0) for _, c in samples]
            ax.plot(times, cumulative, label=f"tenant {tenant}", color=TENANT_COLOURS.get(tenant))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("lane rounds (cumulative)")
    ax.set_title(f"Lane service per tenant — {title}")
    ax.legend()
    return save_figure(fig, path)


def itl_cdf(gaps_by_mode: Mapping[str, Sequence[float]], path: Path, title: str) -> Path:
    """CDF of inter-token gaps (seconds in, milliseconds plotted), one line per mode; p99 marked."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for mode, gaps in gaps_by_mode.items():
        if not gaps:
            continue
        ms, fractions = cdf([g * 1000 for g in gaps])
        n = len(ms)
        p99 = ms[min(n - 1, round(0.99 * (n - 1)))]
        line = ax.step(ms, fractions, where="post", label=f"{mode}: p99 {p99:.0f} ms (n={n})")[0]
        ax.plot([p99], [0.99], marker="o", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency of classic streams (ms, log scale)")
    ax.set_ylabel("fraction of gaps")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, path)
