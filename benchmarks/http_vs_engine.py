"""One stream over HTTP against the engine alone, at several stream intervals: the check
behind ``--stream-interval-ms``'s default (``speclane bench vs-llama-cpp`` reports the same
fraction beside llama.cpp).

    .venv/bin/python benchmarks/http_vs_engine.py [--intervals 0,10,20,40] [--runs 10] [--tokens 128]

A ``speclane serve`` per interval, and the engine alone in this process (the engine-alone
arm of ``bench vs-llama-cpp``: ``bench.decode.engine_decode_arms``). Each run answers the
same chat prompt on every arm, in ``bench.common.alternate``'s order (shuffled per run after
the first, seeded): an arm that always runs right after the engine alone reads 0.80x where
the same server in another order reads 0.96x. Per server: the decode rate after the first
token over the engine alone's in the same run (median and quartiles), the chunks, and the
CPU its event-loop thread and this client spent between the first and the last chunk
(``/proc/PID/task/PID/schedstat``; the client's ``time.thread_time``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from speclane.bench.common import alternate
from speclane.bench.decode import engine_decode_arms
from speclane.bench.servers import speclane_server
from speclane.config import EngineConfig

PROMPT = "Write a long story about a dragon."


def loop_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the process's main thread (a server's event loop)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def http_rate(url: str, pid: int, model: str, tokens: int, tenant: str) -> tuple[float, int, float, float]:
    """Decode rate after the first token, chunks, and the loop thread's and this thread's
    CPU seconds between the first and the last content chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "ignore_eos": True, "speculative": False, "user": tenant,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks, first = 0, None
    with httpx.Client(timeout=300) as client, client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                done = event["usage"]["completion_tokens"]
                chunks += 1
                if first is None:
                    first = (done, time.perf_counter(), loop_thread_cpu_s(pid), time.thread_time())
                last = (done, time.perf_counter(), loop_thread_cpu_s(pid), time.thread_time())
    assert first is not None
    return ((last[0] - first[0]) / (last[1] - first[1]), chunks, last[2] - first[2], last[3] - first[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="0,10,20,40", help="--stream-interval-ms of each server, comma-separated")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    config = EngineConfig()
    intervals = [value.strip() for value in args.intervals.split(",")]
    with contextlib.ExitStack() as stack:
        servers = {interval: stack.enter_context(speclane_server(config, ["--stream-interval-ms", interval]))
                   for interval in intervals}
        work: dict[str, list[tuple[int, float, float]]] = {name: [] for name in servers}

        def http_arm(name: str) -> Callable[[], float]:
            server, runs = servers[name], itertools.count()

            def run() -> float:
                rate, *measured = http_rate(server.url, server.pid, config.model.model, args.tokens,
                                            f"run-{next(runs)}-{name}")
                work[name].append(tuple(measured))  # type: ignore[arg-type]
                return rate
            return run

        engine = engine_decode_arms(config, {"engine": "bfloat16"}, PROMPT, args.tokens)["engine"]
        rates = alternate({"engine": engine, **{name: http_arm(name) for name in servers}}, args.runs)
        for name in servers:
            del work[name][0]  # alternate's discarded warm-up
    print(f"engine alone: {statistics.median(rates['engine']):.1f} tok/s (median of {args.runs})")
    print("| --stream-interval-ms | tok/s | HTTP / engine (median, quartiles) | chunks | loop thread ms | client ms |")
    print("|---|---|---|---|---|---|")
    for name in servers:
        ratios = sorted(h / e for h, e in zip(rates[name], rates["engine"], strict=True))
        quartiles = statistics.quantiles(ratios, n=4)
        chunks, loop_s, client_s = (statistics.median(column) for column in zip(*work[name], strict=True))
        print(f"| {name} | {statistics.median(rates[name]):.1f} | {statistics.median(ratios):.3f} "
              f"({quartiles[0]:.2f}-{quartiles[2]:.2f}) | {chunks:.0f} | {loop_s * 1e3:.0f} | {client_s * 1e3:.0f} |")


if __name__ == "__main__":
    main()
