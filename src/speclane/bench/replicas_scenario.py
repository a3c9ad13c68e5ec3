"""``speclane bench replicas``: one engine process vs engine replicas on Ray, over HTTP.

On this machine's cores (two here) the arms are ``speclane serve --num-threads 2`` (one
process, both cores in one engine) and ``speclane serve --replicas 2 --num-threads 1``
(two Ray actors, a core each, behind the cluster front), both up at once. Each arm
serves 16 greedy streams at once (``CHAT_PROMPTS``), the arms' runs alternated, and the
table reports their aggregate tok/s, median of the runs, and the replicas' rate over the
one process's, the median of the runs' paired ratios. The router's added latency per request is measured inside the front while
one-token requests are sent alone: the time from a request's arrival at the front to a
replica accepting it (admission queue, placement, the Ray call) plus the mean trip of a
poll reply that carries outputs back. The table also gives each one-token request's end
to end time, beside a one-process server with one thread (the engine a replica runs).

Without ``--quick`` the scenario also runs ``speclane simulate --replicas 8 --requests
10000 --tenants 1000`` (its own process: the simulator sits above the benchmarks) and
carries its table: the fair lane's bounds over 8 replicas with the counters shared every
50 ms, every 500 ms and not at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from speclane.bench.common import Table, median
from speclane.bench.driver import progress
from speclane.bench.http_streams import (
    aggregate_rate,
    concurrent_streams,
    histogram_totals,
    new_tenant,
)
from speclane.bench.prompts import CHAT_PROMPTS
from speclane.bench.servers import speclane_server
from speclane.config import EngineConfig

STREAMS = 16
WARMUP = 3
SIMULATE = ["--replicas", "8", "--requests", "10000", "--tenants", "1000"]


def _one_token_ms(url: str, model: str, repeats: int) -> float:
    """Median wall time of a one-token chat completion sent alone (after three warm-ups)."""
    times = []
    for i in range(repeats + WARMUP):
        started = time.perf_counter()
        response = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}],
            "max_tokens": 1, "temperature": 0})
        response.raise_for_status()
        if i >= WARMUP:
            times.append((time.perf_counter() - started) * 1000.0)
    return median(times)


def _front_seconds(url: str) -> dict[str, tuple[float, int]]:
    """(sum, count) of the front's dispatch and delivery histograms."""
    totals = histogram_totals(url, [f"speclane_cluster_{kind}_seconds" for kind in ("dispatch", "delivery")])
    return {name.removeprefix("speclane_cluster_").removesuffix("_seconds"): value for name, value in totals.items()}


def replicas(config: EngineConfig, quick: bool = False) -> list[Table]:
    model = config.model.model
    max_tokens, runs, repeats = (32, 1, 5) if quick else (64, 3, 15)
    prompts = (CHAT_PROMPTS * 2)[:STREAMS]
    arms = {"1 process x 2 threads": (2, ()), "2 replicas x 1 thread (Ray)": (1, ("--replicas", "2"))}
    throughput = Table(f"Aggregate tok/s of {STREAMS} concurrent greedy streams ({max_tokens} tokens each)",
                       ["server", "tok/s (median)", "runs"])
    # The one-thread baseline first, before any Ray process exists (or is still exiting).
    with speclane_server(dataclasses.replace(config, model=dataclasses.replace(config.model, num_threads=1))) as one:
        latency_ms = {"1 process x 1 thread": _one_token_ms(one.url, model, repeats)}
    # Both servers up at once, their runs alternated, so that the machine's noise hits both
    # arms alike and the ratio pairs runs made side by side. The idle one still wakes now and
    # then (the cluster front long-polls its replicas, a status every 0.25 s): small beside
    # 16 streams, and a cost the one-process arm pays while the replicas are idle.
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    with contextlib.ExitStack() as stack:
        servers = {arm: stack.enter_context(speclane_server(config.replace(num_threads=threads), extra))
                   for arm, (threads, extra) in arms.items()}
        for server in servers.values():
            concurrent_streams(server.url, model, prompts[:2], 8)  # warm-up
        for run in range(runs):
            for arm, server in servers.items():
                progress(f"{arm}: run {run + 1}/{runs}")
                rates[arm].append(aggregate_rate(concurrent_streams(server.url, model, prompts, max_tokens, new_tenant())))
        ray_arm = next(arm for arm, (_, extra) in arms.items() if extra)
        before = _front_seconds(servers[ray_arm].url)
        latency_ms[ray_arm] = _one_token_ms(servers[ray_arm].url, model, repeats)
        after = _front_seconds(servers[ray_arm].url)
        front_ms = {k: 1000.0 * (after[k][0] - before[k][0]) / max(1.0, after[k][1] - before[k][1]) for k in after}
    for arm in arms:
        throughput.add(arm, median(rates[arm]), runs)
    one_process = next(arm for arm in arms if arm != ray_arm)
    paired = [r / o for r, o in zip(rates[ray_arm], rates[one_process], strict=True)]
    throughput.notes.append(f"{ray_arm} / {one_process}: {median(paired):.2f}x (median of {runs} runs, each over "
                            f"the other arm's run beside it; range {min(paired):.2f}-{max(paired):.2f})")
    latency = Table("Router's added latency: a one-token request sent alone", ["server", "median ms", "requests"])
    for arm, ms in latency_ms.items():
        latency.add(arm, ms, repeats)
    added = front_ms["dispatch"] + front_ms["delivery"]
    latency.notes.append(
        f"the router's added latency, measured inside the front: {added:.1f} ms per request = arrival to a "
        f"replica accepting it {front_ms['dispatch']:.1f} ms (speclane_cluster_dispatch_seconds) + a poll reply's "
        f"trip back {front_ms['delivery']:.1f} ms (speclane_cluster_delivery_seconds, mean per reply)")
    latency.notes.append("end to end, the one-process server runs its HTTP handling and its engine thread in one "
                         "Python process (one GIL); a replica's engine has its process to itself")
    throughput.notes.append("the replicas' torch threads are fixed by --num-threads; Ray runs the "
                            "replicas as actors of a local cluster started by speclane serve; each run's streams are "
                            "a tenant of their own (http_streams.new_tenant): no run drafts from an earlier run's answers")
    return [throughput, latency] + ([] if quick else simulated_cluster())


def simulated_cluster() -> list[Table]:
    """The tables of ``speclane simulate`` over 8 replicas (``SIMULATE``), run in its own process."""
    progress("replicas: speclane simulate " + " ".join(SIMULATE))
    with tempfile.TemporaryDirectory() as out:
        command = [str(Path(sys.executable).with_name("speclane")), "simulate", *SIMULATE, "--out", out]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        minutes = (time.perf_counter() - started) / 60
        report = json.loads((Path(out) / "report.json").read_text())
    tables = [Table(t["title"], t["columns"], t["rows"], t["notes"]) for t in report["tables"]]
    for table in tables:
        table.notes.append(f"`speclane simulate {' '.join(SIMULATE)}` (the cost model, seed {report.get('seed', 0)}; "
                           f"{minutes:.1f} min)")
    return tables
