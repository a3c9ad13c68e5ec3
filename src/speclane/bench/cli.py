"""``speclane bench SCENARIO``: run a scenario, print its tables, write report.md/json (+ plots)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from speclane.bench.common import Table, write_report
from speclane.config import EngineConfig

SCENARIOS: dict[str, str] = {
    "decode": "single-stream decode tok/s vs transformers, batch step times, memory-bandwidth ceiling",
    "concurrency": "aggregate tok/s at 1-16 streams vs transformers; latency while a long prompt is admitted",
    "speedup": "speculation on/off vs transformers assisted generation on copy, code and chat tasks",
    "hol": "classic streams' inter-token latency beside a speculative stream: slice vs burst",
    "throughput": "total tok/s of 8 streams, one holding the lane, vs speculation off",
    "fairness": "lane share between tenants under three policies, with a lane timeline plot",
    "priority": "ticks from an urgent arrival to holding the lane",
    "overhead": "cost of a lane decision by number of waiters; the lane's share of tick time",
    "mtp": "chat outside the MTP head's training: MTP drafter vs n-gram vs off, acceptance per draft position",
    "drafters": "held-out drafts set, 7 categories: ngram, suffix, mtp and auto speed-up over off, acceptance; "
                "8 streams per category, lane on vs off; auto vs llama.cpp's server n-gram speculation",
    "structured": "JSON-schema decoding vs unconstrained (1 and 8 streams); forced-token drafting, lane on vs off",
    "toolcall": "one agent turn (tool call, tool result, answer) over HTTP: speclane vs llama.cpp's llama-server",
    "prefix": "10-turn chat with a ~1,000-token system prompt: TTFT per turn, prefix cache on vs off vs llama.cpp",
    "vs-llama-cpp": "one stream, 8/16 streams, speculation under load and a noisy neighbour, vs llama.cpp",
    "gguf": "GGUF files of several types, decode and 8 HTTP streams vs llama.cpp; each weight type's kernel vs bfloat16",
    "replicas": "16 HTTP streams: 2 Ray replicas x 1 thread vs 1 process x 2 threads; the router's added latency",
}


def run_bench(args: argparse.Namespace, config: EngineConfig) -> int:
    name = args.scenario
    if name not in SCENARIOS:
        valid = "\n".join(f"  {k:12s} {v}" for k, v in SCENARIOS.items())
        raise ValueError(f"unknown scenario {name!r}; valid scenarios:\n{valid}")
    import torch

    torch.set_num_threads(config.model.num_threads or 2)
    tables, extra = _run(name, config, quick=args.quick)
    for table in tables:
        print(table.markdown())
    out = Path(args.out) / name
    report = write_report(out, f"speclane bench {name}", tables, _report_extra(name, tables, extra, config))
    if name == "fairness" and extra:
        from speclane.bench.plots import lane_share_over_time, lane_timeline

        for policy, data in extra.items():
            slug = policy.split(" ")[0].strip("()")
            lane_timeline(data, out / f"lane-timeline-{slug}.png", title=policy)
            lane_share_over_time(data, out / f"lane-share-{slug}.png", title=policy)
    if name == "hol" and extra:
        from speclane.bench.common import classic_stream_gaps
        from speclane.bench.plots import itl_cdf

        # The gaps the table was computed from (pooled runs, the four classic streams), else
        # the classic streams of the last run.
        itl_cdf({mode: data.get("gaps") or classic_stream_gaps(data["timelines"]) for mode, data in extra.items()},
                out / "itl-cdf.png", "Classic streams beside one speculative stream, per mode")
    print(f"report: {report}")
    return 0


def _report_extra(name: str, tables: list[Table], extra: dict, config: EngineConfig) -> dict:
    """What report.json carries beyond the tables: a ``calibration`` block for
    ``speclane simulate --calibrate`` (decode, speedup) and the engine counters of each
    mode (hol), which prove which code path ran."""
    from speclane.bench.calibration_record import calibration_record

    out: dict = {}
    # The calibrated scenarios (decode, speedup) run one stream: a lone request's depth.
    record = calibration_record(name, tables, num_draft_tokens=config.lane.max_draft_tokens)
    if record:
        out["calibration"] = record
    if name == "hol" and extra:
        out["counters"] = {mode: data["counters"] for mode, data in extra.items()}
    return out


def _run(name: str, config: EngineConfig, quick: bool) -> tuple[list[Table], dict]:
    from speclane.bench import engine_scenarios as es
    from speclane.bench import lane_scenarios as ls

    if name == "decode":
        from speclane.bench import decode

        return decode.run(config, repeats=2 if quick else 3, new_tokens=64 if quick else 128), {}
    if name == "toolcall":
        from speclane.bench.toolcall_scenario import toolcall

        return toolcall(config, quick=quick), {}
    if name == "vs-llama-cpp":
        from speclane.bench.vs_llama_cpp import vs_llama_cpp

        return vs_llama_cpp(config, quick=quick), {}
    if name == "prefix":
        from speclane.bench.prefix_scenario import prefix

        return prefix(config, quick=quick), {}
    if name == "gguf":
        from speclane.bench.gguf_scenario import gguf

        return gguf(config, quick=quick), {}
    if name == "replicas":
        from speclane.bench.replicas_scenario import replicas

        return replicas(config, quick=quick), {}
    if name == "overhead":
        from speclane.bench.factory import EngineFactory

        return ls.overhead(quick=quick) + ls.tick_share(EngineFactory(config), quick=quick), {}
    from speclane.bench.factory import EngineFactory

    factory = EngineFactory(config)
    if name == "fairness":
        return ls.fairness(factory, quick=quick)
    if name == "hol":
        return es.hol(factory, quick=quick)
    runners: dict[str, Callable[..., list[Table]]] = {
        "concurrency": es.concurrency,
        "speedup": es.speedup,
        "throughput": es.throughput,
        "priority": ls.priority,
        "mtp": _mtp,
        "drafters": _drafters,
        "structured": _structured,
    }
    return runners[name](factory, quick=quick), {}


def _structured(factory, quick: bool = False):
    from speclane.bench.structured_scenario import structured

    return structured(factory, quick=quick)


def _drafters(factory, quick: bool = False):
    from speclane.bench.drafters_scenario import drafters

    return drafters(factory, quick=quick)


def _mtp(factory, quick: bool = False):
    from speclane.bench.mtp_scenario import mtp

    return mtp(factory, quick=quick)
