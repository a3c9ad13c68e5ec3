"""Tables for ``speclane simulate``: the lane's bounds (docs/design.md), and service.

Pure formatting over ``PolicyOutcome``s; ``bench.common.Table`` renders the Markdown.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from speclane.bench.common import Table, percentile
from speclane.sim.experiment import PolicyOutcome
from speclane.sim.workload import SimJob


def bounds_table(outcomes: Sequence[PolicyOutcome], title: str) -> Table:
    table = Table(title, [
        "policy", "max wait to first grant, ticks (s)", "its bound ceil(W/S)·B", "waits over bound: clean / all (of n)",
        "Jain (lane share / fair share)", "max gap to fair share (either way), grants", "holder overrun, max rounds (promise ≤ 1)",
        "work-conservation violations (ticks checked)", "grants / yields / preemptions"])
    for o in outcomes:
        b, r = o.bounds, o.result
        worst = b.max_wait()
        budget = b.budget_rounds or 8
        bounded = o.lane.spec_grant_rounds > 0
        table.add(
            o.policy,
            f"{worst.wait_ticks} ({worst.wait_s:.1f} s)" if worst else "-",
            (f"{worst.bound:.0f}" if bounded and worst else "-" if worst is None else "none (no round budget)"),
            (f"{b.wait_violations(clean_only=True)} / {b.wait_violations(clean_only=False)} (of {len(b.waits)}); "
             f"clean, behind own tenant: {b.wait_violations(clean_only=True, behind_own_tenant=True)}"
             if bounded else "n/a"),
            b.jain,
            f"{b.max_lag_rounds / budget:.1f} ({b.max_lag_rounds:.0f} rounds)",
            b.max_overrun if bounded or o.lane.spec_grant_ms > 0 else "n/a (no budget)",
            f"{b.wc_violations} ({b.wc_checked})",
            f"{r.lane_grants} / {r.lane_yields} / {r.lane_preemptions}",
        )
    table.notes += [
        "Wait: from the first round boundary a request spends as a waiter to its first grant, in ticks (a holder runs one "
        "round per tick). W = waiters of its priority then, S = slots, B = rounds per grant: the lane promises a grant "
        "within ceil(W/S)·B. 'clean' = no grant went to another priority during the wait (the promise is about "
        "equal-priority waiters); 'all' counts every wait, including those overtaken by more urgent or skip-cap grants. "
        "'behind own tenant': the wait began with a request of its own tenant already waiting; with --fairness tenant "
        "the lane serves tenants in turn, so such a request waits for its tenant's turns and W x B is not its bound.",
        "Lane share: each tick's lane rounds of a priority are split among that priority's backlogged tenants by weight "
        "(generalized processor sharing, capped at one round per eligible request); Jain is over actual / fair of every "
        "(tenant, priority) entitled to at least one grant. Lag = fair - actual within a backlogged period, in grants of B "
        "rounds (8 for hold).",
        "Overrun: rounds a holder began with its budget spent while someone waited. Work conservation: after each "
        "schedule, holders >= min(slots, eligible requests).",
    ]
    return table


def service_table(outcomes: Sequence[PolicyOutcome]) -> Table:
    table = Table("Service under each policy", [
        "policy", "TTFT p50 / p99 s", "speculative requests' tok/s p50", "lane rounds", "tokens per lane round",
        "draft acceptance", "generated tok/s (simulated)", "429 retries", "ticks", "simulator wall s"])
    for o in outcomes:
        r = o.result
        ttft = [rec.first_token_s - rec.arrival_s for rec in r.records if rec.first_token_s is not None]
        rates = [rec.num_output_tokens / (rec.finished_s - rec.first_token_s) for rec in r.records
                 if rec.speculative and rec.first_token_s is not None and rec.finished_s > rec.first_token_s]
        rounds = r.slice_rounds + r.burst_rounds
        table.add(o.policy, f"{percentile(ttft, 50):.2f} / {percentile(ttft, 99):.2f}",
                  statistics.median(rates) if rates else float("nan"), rounds,
                  (r.accepted_tokens + rounds) / rounds if rounds else float("nan"),
                  f"{r.accepted_tokens / r.draft_tokens:.0%}" if r.draft_tokens else "-",
                  r.generated_tokens / r.busy_s if r.busy_s else float("nan"), r.rejected, r.ticks, r.wall_s)
    table.notes.append("slice rounds and burst rounds are counted apart in report.json: a slice-mode run shows zero burst rounds.")
    return table


def heavy_tenants_table(outcomes: Sequence[PolicyOutcome], jobs: Sequence[SimJob], top: int = 5) -> Table:
    counts = Counter(j.tenant.name for j in jobs)
    tenants = {j.tenant.name: j.tenant for j in jobs}
    heavy = [name for name, _ in counts.most_common(top)]
    table = Table(f"The {top} heaviest tenants: lane rounds received / fair share",
                  ["tenant", "requests", "priority", "weight"] + [o.policy for o in outcomes])
    for name in heavy:
        t = tenants[name]
        ratios = [o.bounds.share_ratios.get((name, t.priority), float("nan")) for o in outcomes]
        table.add(name, counts[name], t.priority, t.weight, *ratios)
    table.notes.append("1.0 = exactly its fair share while backlogged; below 1 it got less than its share.")
    return table


def write_report(out: Path, title: str, header: list[str], tables: list[Table], images: list[Path],
                 outcomes: Sequence[PolicyOutcome], extra: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", *[f"- {h}" for h in header], ""]
    lines += [t.markdown() for t in tables]
    lines += [f"![{p.stem}]({p.name})\n" for p in images]
    (out / "report.md").write_text("\n".join(lines))
    summary = {
        "name": title, "date": time.strftime("%Y-%m-%d %H:%M"), "header": header,
        "tables": [t.__dict__ for t in tables],
        "policies": {o.policy: _summary(o) for o in outcomes},
        **extra,
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2, default=str))
    return out / "report.md"


def _summary(o: PolicyOutcome) -> dict[str, Any]:
    r, b = o.result, o.bounds
    return {
        "lane": o.lane.__dict__,
        "counters": {k: getattr(r, k) for k in ("ticks", "sim_time_s", "wall_s", "busy_s", "rejected", "slice_rounds",
                                                "burst_rounds", "draft_tokens", "accepted_tokens", "generated_tokens",
                                                "lane_grants", "lane_yields", "lane_preemptions")},
        "bounds": {"max_wait_ticks": b.max_wait().wait_ticks if b.waits else None,
                   "wait_violations_clean": b.wait_violations(clean_only=True),
                   "wait_violations_clean_behind_own_tenant": b.wait_violations(clean_only=True, behind_own_tenant=True),
                   "wait_violations_all": b.wait_violations(clean_only=False), "num_waits": len(b.waits),
                   "jain": b.jain, "max_lag_rounds": b.max_lag_rounds, "max_overrun": b.max_overrun,
                   "work_conservation_violations": b.wc_violations, "membership_mismatches": b.membership_mismatches},
    }
