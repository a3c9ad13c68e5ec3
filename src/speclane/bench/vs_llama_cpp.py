"""``speclane bench vs-llama-cpp``: speclane against llama.cpp on llama.cpp's own ground,
the default GGUF file, the same threads and the same client.

- **One stream.** The engine alone (``speclane.LLM``, speculation off, the tokens after
  the first one) against ``llama-bench``'s ``tg`` test (no prompt); one streamed chat
  completion over HTTP (speculation off per request, and the default lane) against
  ``llama-server``, each also from the light client, and from a speclane server that sends
  a chunk per tick (``--stream-interval-ms 0``; the default paces chunks at 20 ms); speclane's
  HTTP decode rate as a fraction of its engine's, per client and pacing. The engine
  also with ``--matmul-inputs int8`` (the inputs of the quantized matmuls rounded to 8 bits,
  llama.cpp's arithmetic), here and in the noisy-neighbour runs.
- **One stream at depth.** The engine alone decoding after a context of 1,024 and 4,096
  tokens (a plain-text prompt of that many tokens, its prefill left out) against
  ``llama-bench``'s ``tg`` test at the same depth (``-d``): the attention's share of a
  step grows with the context, and each side's attention kernel with it.
- **Streams.** 8 and 16 concurrent streamed chat completions: aggregate tok/s and mean
  time to first token, ``speclane serve`` (speculation off per request, and the lane; and a
  server with ``--matmul-inputs int8``, speculation off) against ``llama-server -np 16``;
  speculation off and llama-server again with the light client (``http_streams.light_streams``),
  whose parsing takes less of the cores the servers share with their clients.
- **Speculation under load.** 8 and 16 streams with speculation off, the default drafter
  (``auto``; the default server, ``speculative`` per request), the n-gram drafter and the
  MTP drafter (servers with ``--drafter ngram`` / ``--drafter mtp``): each drafter's
  aggregate over off, median and range of the runs; then the same streams through engines
  in this process (``speclane.LLM``, no HTTP and no client on the cores), every arm's
  engine at once with their ticks interleaved (``driver.drive_interleaved``: a tick of
  each in turn, each arm's rate its tokens over its own ticks' time, so the machine's
  drift slows every arm alike): the lane's decisions alone, without the clients' share of
  the noise; and sustained: n closed-loop clients on those engines for a fixed window of
  each engine's ticks, each sending its next request as soon as its answer ends, so tokens
  that speculation saves free a slot for the next request (a closed batch ends with its
  longest stream whatever the others saved).
- **A noisy neighbour.** Single-stream decode with one busy process beside it (a Python
  loop, one core's worth), as a fraction of the quiet rate measured just before, for
  speclane's engine and for ``llama-bench``.

Every comparison alternates its arms and reports medians; servers run side by side but
only one is measured at a time (an idle speclane engine and an idle llama-server use no
CPU). Without llama.cpp's programs (``bench/llama_cpp.py``) speclane's arms still run.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclane.bench.common import Table, alternate, median
from speclane.bench.decode import PROMPT, engine_decode_arms, engine_decode_rate
from speclane.bench.driver import (
    Job,
    drive_clients_interleaved,
    drive_interleaved,
    progress,
    run_tenant,
)
from speclane.bench.gguf_scenario import STREAM_PROMPTS, busy_elsewhere, load_note, ratio
from speclane.bench.http_streams import (
    CLIENTS_NOTE,
    StreamResult,
    aggregate_rate,
    concurrent_streams,
    histogram_totals,
    light_streams,
    new_tenant,
)
from speclane.bench.http_streams import decode_rate as stream_decode_rate
from speclane.bench.llama_cpp import decode_rate, find_llama_cpp_tool, llama_server
from speclane.bench.prompts import LONG_DOCUMENT
from speclane.bench.servers import speclane_server
from speclane.config import DEFAULT_STREAM_INTERVAL_MS, EngineConfig
from speclane.engine.stats import EngineCounters
from speclane.llm import LLM
from speclane.models.loader import resolve_model
from speclane.request import SamplingParams

NEW_TOKENS = 128
STREAM_LEVELS = (8, 16)
SUSTAIN_SECONDS = 8.0  # the sustained arms' window: several answers per client at 8-16 clients
CONTEXT_PER_SLOT = 1024
DEPTHS = (1024, 4096)  # tokens in the context before the one-stream-at-depth decode
OFF = {"speculative": False}
SETTLE_S = 1.2  # a busy neighbour's head start before the noisy measurement


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _dies_with_parent() -> None:
    """In the child before it runs: Linux kills it when the benchmark dies (a killed
    benchmark would otherwise leave it spinning on a core, under every later measurement)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def busy_process() -> Iterator[None]:
    """One other process spinning on the CPU while the block runs (one core's worth),
    started ``SETTLE_S`` before it: a neighbour that has been there a while, which the
    engine's thread governor (reading the CPU counters each second) has had time to see."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_dies_with_parent)
    try:
        time.sleep(SETTLE_S)
        yield
    finally:
        hog.kill()
        hog.wait()


def mean_ttft(results: list[StreamResult]) -> float:
    """Mean seconds from sending to the first content chunk (a stream without one counts
    its whole time)."""
    return sum((r.first_token if r.first_token is not None else r.finished) - r.started for r in results) / len(results)


TTFT_METRIC = "speclane_time_to_first_token_seconds"  # the engine's: arrival to first token


class StreamArm:
    """One arm of a comparison: ``streams`` concurrent streams against a server; each call
    returns their aggregate tok/s and records their mean time to first token, as the client
    saw it and (speclane's servers) as the engine did: the rest is the HTTP path's (the
    request's parsing and tokenizing, the first chunk's way back) and the client's.

    ``fresh_tenant`` (speclane's servers): each call's streams are a tenant of their own
    (``http_streams.new_tenant``), as a new application's traffic would be: the prompts
    repeat from call to call, and the prefix cache every tenant shares holds them, as
    llama-server's slots do. ``cold``: no cache holds them; on speclane's servers the new
    tenant reads only its own (empty) part of the prefix cache, and llama-server's arm
    is given ``COLD_LLAMA_SERVER`` in ``extra``."""

    def __init__(self, url: str, model: str, streams: int, tokens: int, extra: dict[str, Any] | None = None,
                 fresh_tenant: bool = True, light_client: bool = False, cold: bool = False) -> None:
        self.url, self.model, self.streams, self.tokens, self.extra = url, model, streams, tokens, extra
        self.fresh_tenant, self.cold = fresh_tenant, cold
        self.send = light_streams if light_client else concurrent_streams  # http_streams: the two clients
        self.ttfts: list[float] = []
        self.engine_ttfts: list[float] = []  # speclane's servers only
        self.decode_rates: list[float] = []  # per call, the streams' mean rate after their first token

    def request_extra(self) -> dict[str, Any] | None:
        """The body fields of this call's requests beyond the prompt (a new tenant per call)."""
        if not self.fresh_tenant:
            return self.extra
        if self.cold:
            return {**(self.extra or {}), "user": run_tenant()}
        return new_tenant(self.extra)

    def __call__(self) -> float:
        before = histogram_totals(self.url, [TTFT_METRIC]).get(TTFT_METRIC) if self.fresh_tenant else None
        results = self.send(self.url, self.model, prompts(self.streams), self.tokens, self.request_extra())
        self.ttfts.append(mean_ttft(results))
        if before is not None:
            total, count = histogram_totals(self.url, [TTFT_METRIC])[TTFT_METRIC]
            self.engine_ttfts.append((total - before[0]) / max(1, count - before[1]))
        rates = [r for r in map(stream_decode_rate, results) if math.isfinite(r)]  # NaN: fewer than 2 tokens
        self.decode_rates.append(sum(rates) / len(rates) if rates else float("nan"))
        return aggregate_rate(results)


def prompts(n: int) -> list[str]:
    return [STREAM_PROMPTS[i % len(STREAM_PROMPTS)] for i in range(n)]


INT8_ENGINE = "speclane, int8 matmul inputs"  # the engine-alone and noisy-neighbour arm
INT8_SERVER = "speclane, int8 matmul inputs, speculation off"  # the concurrent streams' arm
LIGHT = ", light client"  # a concurrent streams' arm with http_streams.light_streams, against llama-server's with it
# A concurrent streams' arm whose prompts no cache holds (StreamArm's ``cold``), against
# llama-server's with the same: every prompt's whole prefill is in its time to first token.
COLD = ", cold prompts"
COLD_LLAMA_SERVER = {"cache_prompt": False}  # llama-server's per-request switch for its slots' prompt cache
REFERENCE = "llama.cpp llama-server"
SPEC_OFF = "speclane, speculation off"
LANE_ON = "speclane, lane on"
# A server that sends a chunk per tick (``--stream-interval-ms 0``), against the default's
# pacing: each chunk is one wake-up of the server's event loop and of the client, on the
# cores the engine decodes on.
UNPACED = "speclane, speculation off, a chunk per tick"
ENGINE_BESIDE_HTTP = "speclane engine alone"  # the one-stream HTTP alternation's in-process arm


def vs_llama_cpp(config: EngineConfig, quick: bool = False) -> list[Table]:
    threads = config.model.num_threads or 2
    gguf = resolve_model(config.model.model)
    tools = {name: find_llama_cpp_tool(name) for name in ("llama-bench", "llama-server")}
    tokens = NEW_TOKENS // 2 if quick else NEW_TOKENS
    repeats = 2 if quick else 3
    spec_runs = 2 if quick else 5
    # One stream's runs are short (8 arms, ~12 s a run): more of them settle a ratio near 0.95x.
    single_runs = 2 if quick else 9
    load_before, others = os.getloadavg()[0], busy_elsewhere()

    # The default engine, and the same with --matmul-inputs int8 (llama.cpp's arithmetic).
    engine_arms = engine_decode_arms(config, {"speclane": "bfloat16", INT8_ENGINE: "int8"}, PROMPT, tokens)

    def bench_rate() -> float:
        assert tools["llama-bench"] is not None
        return decode_rate(tools["llama-bench"], gguf, threads, tokens, repeats=1)

    if tools["llama-bench"] is not None:
        engine_arms["llama.cpp"] = bench_rate
    progress("vs-llama-cpp: engine alone")
    engine = alternate(engine_arms, repeats, warmup=False)
    progress("vs-llama-cpp: a noisy neighbour")
    noisy = _noisy(engine_arms, repeats)
    progress("vs-llama-cpp: one stream at depth")
    depth = _depth_runs(config, tools["llama-bench"], gguf, threads, tokens, repeats, DEPTHS[:1] if quick else DEPTHS)

    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(speclane_server(config)).url
        ours_int8 = stack.enter_context(speclane_server(config, ["--matmul-inputs", "int8"])).url
        unpaced = stack.enter_context(speclane_server(config, ["--stream-interval-ms", "0"])).url
        mtp = stack.enter_context(speclane_server(config, ["--drafter", "mtp"])).url
        ngram = stack.enter_context(speclane_server(config, ["--drafter", "ngram"])).url
        theirs = None
        if tools["llama-server"] is not None:
            slots = max(STREAM_LEVELS)
            theirs = stack.enter_context(llama_server(tools["llama-server"], gguf, threads, slots=slots,
                                                      context=slots * CONTEXT_PER_SLOT)).url
        servers = {SPEC_OFF: (ours, OFF), LANE_ON: (ours, None)}
        if theirs is not None:
            servers[REFERENCE] = (theirs, None)
        many = {**servers, INT8_SERVER: (ours_int8, OFF)}  # the concurrent streams' arms
        model = config.model.model
        for url, _ in many.values():
            concurrent_streams(url, model, prompts(1), 8)  # warm-up
        for url in (mtp, ngram, unpaced):
            concurrent_streams(url, model, prompts(1), 8)
        progress("vs-llama-cpp: one stream over HTTP")
        single_arms = {name: StreamArm(url, model, 1, tokens, extra, fresh_tenant=url != theirs)
                       for name, (url, extra) in {**servers, UNPACED: (unpaced, OFF)}.items()}
        single_arms.update({name + LIGHT: StreamArm(url, model, 1, tokens, extra, fresh_tenant=url != theirs,
                                                    light_client=True)
                            for name, (url, extra) in {SPEC_OFF: (ours, OFF), UNPACED: (unpaced, OFF),
                                                       **({REFERENCE: (theirs, None)} if theirs else {})}.items()})
        # The engine alone in the same alternation: "HTTP / engine" pairs runs made side by side.
        single = alternate({**single_arms, ENGINE_BESIDE_HTTP: engine_arms["speclane"]}, single_runs, warmup=False)  # type: ignore[dict-item]
        progress("vs-llama-cpp: concurrent streams")
        loads: dict[int, dict[str, StreamArm]] = {}
        rates: dict[int, dict[str, list[float]]] = {}
        light = {name: many[name] for name in (SPEC_OFF, REFERENCE) if name in many}
        for n in STREAM_LEVELS:
            loads[n] = {name: StreamArm(url, model, n, tokens, extra, fresh_tenant=url != theirs)
                        for name, (url, extra) in many.items()}
            loads[n].update({name + LIGHT: StreamArm(url, model, n, tokens, extra, fresh_tenant=url != theirs,
                                                     light_client=True) for name, (url, extra) in light.items()})
            loads[n].update({name + COLD: StreamArm(url, model, n, tokens, COLD_LLAMA_SERVER if url == theirs else extra,
                                                    fresh_tenant=url != theirs, cold=True)
                             for name, (url, extra) in light.items()})
            rates[n] = alternate(loads[n], repeats, warmup=False)  # type: ignore[arg-type]
        progress("vs-llama-cpp: speculation under load")
        spec = {n: alternate({"off": StreamArm(ours, model, n, tokens, OFF), "auto": StreamArm(ours, model, n, tokens),
                              "ngram": StreamArm(ngram, model, n, tokens), "mtp": StreamArm(mtp, model, n, tokens)},
                             spec_runs, warmup=False)
                for n in STREAM_LEVELS}
    progress("vs-llama-cpp: speculation under load, engines alone (ticks interleaved)")
    sustain_s = SUSTAIN_SECONDS / 4 if quick else SUSTAIN_SECONDS
    spec_alone, spec_sustained, spec_work = _engine_spec_runs(config, tokens, sustain_s, spec_runs)
    load = load_note(load_before, os.getloadavg()[0], len(os.sched_getaffinity(0)), threads, others)
    tables = [_single_table(engine, single, single_arms, tokens, threads, repeats, single_runs),
              _depth_table(depth, tokens, threads, repeats), _streams_table(loads, rates, tokens, repeats),
              _spec_table(spec, spec_alone, tokens, spec_runs, spec_work, spec_sustained, sustain_s), _noisy_table(noisy, tokens, repeats)]
    for table in tables:
        if tools["llama-server"] is None or tools["llama-bench"] is None:
            table.notes.append("llama.cpp's llama-bench or llama-server was not found (PATH or "
                               "~/.cache/speclane-anchors): its arms did not run.")
        table.notes.append(load)
    return tables


def same_client_reference(name: str) -> str:
    """The llama-server arm an arm is compared with: the one driven by the same client, its
    prompts as cold or as cached."""
    return REFERENCE + next((suffix for suffix in (LIGHT, COLD) if name.endswith(suffix)), "")


def _noisy(arms: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Per arm, the rate with a busy process beside it over the quiet rate just before."""
    kept: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(repeats):
        for name, arm in arms.items():
            time.sleep(SETTLE_S)  # the quiet run too follows a settled machine (no neighbour just gone)
            quiet = arm()
            with busy_process():
                kept[name].append(arm() / quiet)
    return kept


def _single_table(engine: dict[str, list[float]], single: dict[str, list[float]], single_arms: dict[str, StreamArm],
                  tokens: int, threads: int, repeats: int, http_repeats: int) -> Table:
    table = Table(f"One stream, {tokens} new tokens, greedy, {threads} threads: speclane vs llama.cpp",
                  ["path", "speclane tok/s", "llama.cpp tok/s", "speclane / llama.cpp"])
    ours_engine = median(engine["speclane"])
    theirs_engine = median(engine["llama.cpp"]) if "llama.cpp" in engine else None
    table.add("engine alone, decode (speclane.LLM vs llama-bench tg)", ours_engine, theirs_engine or "not run",
              ratio(ours_engine, theirs_engine))
    if INT8_ENGINE in engine:
        int8 = median(engine[INT8_ENGINE])
        table.add("engine alone, decode, --matmul-inputs int8", int8, theirs_engine or "not run", ratio(int8, theirs_engine))
    beside = single[ENGINE_BESIDE_HTTP]
    fractions = []
    for name in (SPEC_OFF, LANE_ON, SPEC_OFF + LIGHT, UNPACED, UNPACED + LIGHT):
        if name not in single:
            continue
        reference = same_client_reference(name)
        theirs_http = median(single[reference]) if reference in single else None
        ours = median(single[name])
        label = name.removeprefix("speclane, ").removesuffix(LIGHT) + (", light client" if name.endswith(LIGHT) else "")
        table.add(f"one streamed chat completion over HTTP ({label})", ours, theirs_http or "not run",
                  ratio(ours, theirs_http))
        if name != LANE_ON:
            http_decode = single_arms[name].decode_rates
            paired = sorted(h / e for h, e in zip(http_decode, beside, strict=True))
            fractions.append(f"{label}: {median(paired):.2f}x (range {paired[0]:.2f}-{paired[-1]:.2f}; medians "
                             f"{median(http_decode):.3g} / {median(beside):.3g} tok/s)")
    table.notes.append("speclane over HTTP / its engine alone, both decoding after the first token, each HTTP run over "
                       "the engine-alone run beside it in the same alternation (target: at least 0.95x): "
                       + "; ".join(fractions) + ". HTTP rows: completion tokens per second from sending the request "
                       "to the stream's end (prefill included), the same chat prompt for both servers, each against "
                       "llama-server with the same client (the openai SDK, or the light client). speclane serve's default "
                       f"(--stream-interval-ms {DEFAULT_STREAM_INTERVAL_MS:g}) sends the tokens decoded within "
                       f"{DEFAULT_STREAM_INTERVAL_MS:g} ms as one chunk (the first and the last chunk are never held back); "
                       "'a chunk per tick' is --stream-interval-ms 0. Each chunk is a wake-up of the server's event loop "
                       "and of the client on the cores the engine decodes on.")
    table.notes.append(f"Engine alone: {tokens} tokens after the first one (the prompt's prefill and first token left out, "
                       f"as llama-bench's tg test has no prompt). Arms alternate, {repeats} runs each ({http_repeats} for one stream "
                       "over HTTP); medians. "
                       f"llama-bench: -p 0 -n {tokens} -t {threads}. --matmul-inputs int8: each group of 32 inputs "
                       "rounded to 8 bits before the quantized matmuls, as llama.cpp computes (the default multiplies "
                       "bfloat16 inputs exactly; docs/design.md has both arms' accuracy).")
    return table


def _depth_runs(config: EngineConfig, bench: Path | None, gguf: Path, threads: int, tokens: int, repeats: int,
                depths: tuple[int, ...]) -> dict[int, dict[str, list[float]]]:
    """Per depth, the engine alone (speculation off) and ``llama-bench`` decoding ``tokens``
    tokens after that many tokens of context, alternated, ``repeats`` runs each."""
    llm = LLM(config=config.replace(spec_mode="off", max_model_len=max(depths) + tokens + 2))
    copies = -(-max(depths) // len(llm.encode_prompt(LONG_DOCUMENT, chat=False)))  # enough for the deepest context
    document = llm.encode_prompt(LONG_DOCUMENT * copies, chat=False)
    llm.generate([document[:64]], SamplingParams(max_tokens=8))  # warm-up
    runs: dict[int, dict[str, list[float]]] = {}
    for depth in depths:
        arms: dict[str, Callable[[], float]] = {"speclane": lambda depth=depth: engine_decode_rate(llm, document[:depth], tokens)}
        if bench is not None:
            arms["llama.cpp"] = lambda depth=depth: decode_rate(bench, gguf, threads, tokens, repeats=1, depth=depth,
                                                                flash_attention=True)
        runs[depth] = alternate(arms, repeats, warmup=False)
    return runs


def _depth_table(runs: dict[int, dict[str, list[float]]], tokens: int, threads: int, repeats: int) -> Table:
    table = Table(f"One stream at depth: {tokens} new tokens after a context of n tokens, greedy, {threads} threads, "
                  "engine alone vs llama-bench", ["context (tokens)", "speclane tok/s", "llama.cpp tok/s", "speclane / llama.cpp"])
    for depth, arms in runs.items():
        ours = median(arms["speclane"])
        theirs = median(arms["llama.cpp"]) if "llama.cpp" in arms else None
        table.add(depth, ours, theirs or "not run", ratio(ours, theirs))
    table.notes.append(f"speclane.LLM with speculation off decoding {tokens} tokens after the first one, its prompt the "
                       "first n tokens of a plain-text document (its prefill and first token left out); llama-bench: "
                       f"-p 0 -n {tokens} -t {threads} -d n -fa 1 (its tg test after n tokens of context, which it "
                       "processes untimed; with flash attention, which decoded 1.07-1.12x faster than without at these "
                       f"depths here). Arms alternate, {repeats} runs each; medians. Both keep the context's keys and values "
                       "in 16-bit floats (speclane bfloat16, llama.cpp float16 by default).")
    return table


def _streams_table(arms: dict[int, dict[str, StreamArm]], rates: dict[int, dict[str, list[float]]], tokens: int,
                   repeats: int) -> Table:
    table = Table(f"Concurrent streamed chat completions, {tokens} max tokens each: aggregate tok/s and time to "
                  "first token", ["streams", "server", "tok/s", "vs llama.cpp", "mean TTFT s", "TTFT vs llama.cpp",
                                  "engine's TTFT s"])
    for n, runs in rates.items():
        for name, values in runs.items():
            reference = same_client_reference(name)
            ref_rate = median(runs[reference]) if reference in runs else None
            ref_ttft = median(arms[n][reference].ttfts) if reference in runs else None
            ttft = median(arms[n][name].ttfts)
            engine_ttfts = arms[n][name].engine_ttfts
            table.add(n, name, median(values), ratio(median(values), ref_rate), ttft,
                      f"{ttft / ref_ttft:.2f}x" if ref_ttft else "-", median(engine_ttfts) if engine_ttfts else "-")
    table.notes.append(f"Arms alternate, {repeats} runs each; medians. TTFT: sending to the first content chunk, "
                       "the mean over a run's streams. The engine's TTFT: a request's arrival in the engine to its "
                       f"first token ({TTFT_METRIC} on /metrics, the run's mean); the rest of the client's is the "
                       "HTTP path's (parsing, tokenizing, the first chunk's way back) and the client's own, "
                       f"on the same cores as the engine. llama-server: -np {max(STREAM_LEVELS)} -c "
                       f"{max(STREAM_LEVELS) * CONTEXT_PER_SLOT}. Targets: 16 streams at least 3x llama-server; "
                       "TTFT at 8 streams at most 0.25x.")
    table.notes.append("The prompts repeat from run to run. In the rows without 'cold prompts' both servers hold them "
                       "from the run before (speclane's prefix cache that every tenant shares, llama-server's slots), "
                       "so the first token waits for little prefill. 'Cold prompts': no cache holds them (speclane: a "
                       "new tenant's own part of the prefix cache, empty; llama-server: cache_prompt false on each "
                       "request), so each stream's whole prompt is prefilled before its first token, as for a "
                       "prompt neither server has seen.")
    table.notes.append(CLIENTS_NOTE)
    return table


@dataclass
class LaneWork:
    """What an engine-alone arm's runs computed, from its counters: ticks, decode rows (one
    per stream a tick) and the rows its drafts added. Unlike the arms' wall-clock rates,
    these do not move with the machine's noise."""

    ticks: int = 0
    decode_rows: int = 0
    drafted: int = 0
    accepted: int = 0

    @staticmethod
    def reading(counters: EngineCounters) -> tuple[int, int, int]:
        """The counters ``add`` takes differences of: ticks, drafted and accepted tokens."""
        return counters.ticks, counters.draft_tokens, counters.accepted_tokens

    def add(self, counters: EngineCounters, before: tuple[int, int, int], tokens: int) -> None:
        """A run of ``tokens`` tokens: ``counters`` now, against their ``reading`` before it."""
        ticks, drafted, accepted = (now - then for now, then in zip(self.reading(counters), before, strict=True))
        self.ticks += ticks
        self.drafted += drafted
        self.accepted += accepted
        self.decode_rows += tokens - accepted  # a decode row yields one token, plus its accepted drafts

    def summary(self, off: LaneWork) -> str:
        extra = self.drafted / max(1, self.decode_rows)
        return f"+{extra:.1%} rows, {self.accepted}/{self.drafted} accepted, ticks {self.ticks / max(1, off.ticks):.2f}x"


def _engine_spec_runs(config: EngineConfig, tokens: int, seconds: float, runs: int
                      ) -> tuple[dict[int, dict[str, list[float]]], dict[int, dict[str, list[float]]], dict[int, dict[str, LaneWork]]]:
    """Per drafter (and off, twice: ``OFF_AGAIN``), an engine in this process; per stream
    count n, ``runs`` runs of n concurrent greedy requests of ``prompts(n)`` (chat, up to
    ``tokens`` each) on every engine at once, their ticks interleaved
    (``driver.drive_interleaved``), after a warm-up run; then ``runs`` runs of n
    closed-loop clients for ``seconds`` of each engine's ticks (``drive_clients_interleaved``).
    Returns per n and arm the batch runs' and the sustained runs' tok/s, and the
    ``LaneWork`` of the batch runs (the warm-up's included)."""
    engines = {"off": LLM(config=config.replace(spec_mode="off")), "auto": LLM(config=config),
               "ngram": LLM(config=config.replace(drafter="ngram")), "mtp": LLM(config=config.replace(drafter="mtp")),
               OFF_AGAIN: LLM(config=config.replace(spec_mode="off"))}
    inner = {name: llm.engine for name, llm in engines.items()}
    encoded = [next(iter(engines.values())).encode_prompt(p, chat=True) for p in prompts(max(STREAM_LEVELS))]
    batches: dict[int, dict[str, list[float]]] = {}
    sustained: dict[int, dict[str, list[float]]] = {}
    work: dict[int, dict[str, LaneWork]] = {}
    for n in STREAM_LEVELS:
        batches[n] = {name: [] for name in engines}
        sustained[n] = {name: [] for name in engines}
        work[n] = {name: LaneWork() for name in engines}
        for run in range(runs + 1):  # the first: a warm-up
            jobs = {name: [Job(f"load-{n}-{run}-{i}", ids, SamplingParams(max_tokens=tokens)) for i, ids in enumerate(encoded[:n])]
                    for name in engines}
            before = {name: LaneWork.reading(engine.counters) for name, engine in inner.items()}
            busy = drive_interleaved(inner, jobs)
            for name, engine in inner.items():
                work[n][name].add(engine.counters, before[name], busy[name].tokens)
                if run:
                    batches[n][name].append(busy[name].rate)
        for _ in range(runs):
            busy = drive_clients_interleaved(inner, encoded[:n], SamplingParams(max_tokens=tokens), seconds)
            for name in engines:
                sustained[n][name].append(busy[name].rate)
    return batches, sustained, work


# A second speculation-off engine beside the first (an A/A arm): how far two engines that do
# the same work read apart in this process, the noise the drafters' ratios are read against.
OFF_AGAIN = "off again"
ENGINES_ALONE = "engines alone, ticks interleaved"  # the in-process arms' rows
SPEC_ARMS = ("auto", "ngram", "mtp", OFF_AGAIN)


def _spec_table(spec: dict[int, dict[str, list[float]]], alone: dict[int, dict[str, list[float]]], tokens: int,
                runs: int, work: dict[int, dict[str, LaneWork]] | None = None,
                sustained: dict[int, dict[str, list[float]]] | None = None, sustain_s: float = SUSTAIN_SECONDS) -> Table:
    table = Table("Speculation under load: aggregate tok/s with each drafter over speculation off",
                  ["streams", "path", "off tok/s", "auto (default) / off (median, range)", "ngram / off (median, range)",
                   "mtp / off (median, range)", "off again / off (A/A, median, range)"])
    paths = [("HTTP, openai client", spec), (ENGINES_ALONE, alone)]
    if sustained:
        paths.append((ENGINES_ALONE + ", sustained clients", sustained))
    for path, measured in paths:
        for n, arms in measured.items():
            row: list[Any] = [n, path, median(arms["off"])]
            for drafter in SPEC_ARMS:
                if drafter not in arms:
                    row.append("-")
                    continue
                ratios = [a / b for a, b in zip(arms[drafter], arms["off"], strict=True)]
                row.append(f"{median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
            table.add(*row)
    for n, arms_work in (work or {}).items():
        table.add(n, "engines alone: the work (all batch runs, warm-up included)", "-",
                  *(arms_work[drafter].summary(arms_work["off"]) if drafter in arms_work else "-" for drafter in SPEC_ARMS))
    table.notes.append(f"{runs} runs per arm, each run's ratio against the off run beside it; {tokens} max tokens per "
                       "stream, greedy. Target: at least 1.0x for each drafter at 8 and 16 streams. Off again: a second "
                       "speculation-off engine (engines alone), the noise between two engines doing the same work.")
    table.notes.append("HTTP: speclane serve (the default server, a request's speculation off per request for the off arm; "
                       "servers with --drafter ngram / mtp), the streams' clients on the same cores, the arms alternated. "
                       "Engines alone: the same prompts through one speclane.LLM per arm in the benchmark's process, every "
                       "arm's batch at once with the engines' ticks interleaved (one tick of each, in a shuffled order each "
                       "round; bench/driver.py drive_interleaved), after a warm-up run: an arm's tok/s is its tokens over its "
                       "own ticks' time, so a stretch of this machine's drift slows every arm alike and what moves the ratio "
                       "is the lane's decisions. Their work, from the engines' counters: the rows the drafts added to the "
                       "decode rows, the drafts accepted, and the ticks over the off arm's (a closed batch ends with its "
                       "longest stream).")
    if sustained:
        table.notes.append(f"Sustained clients: on the same engines, ticks interleaved as above, n closed-loop clients per "
                           f"engine until its ticks have taken {sustain_s:g} s each run, each client sending its prompt again "
                           "(a new tenant) as soon as its answer ends; tok/s is the tokens its clients received over its ticks' "
                           "time. Here what speculation saves frees a slot for the next request, as in a server that always "
                           "has work.")
    return table


def _noisy_table(noisy: dict[str, list[float]], tokens: int, repeats: int) -> Table:
    table = Table("A noisy neighbour: single-stream decode beside one busy process, as a fraction of quiet",
                  ["engine", "kept (median)", "runs"])
    for name, kept in noisy.items():
        table.add(name, f"{median(kept):.2f}", ", ".join(f"{k:.2f}" for k in kept))
    table.notes.append(f"Each run measures the quiet rate ({tokens} tokens, {SETTLE_S} s after the last run's neighbour "
                       f"left), then the same beside a Python busy loop started {SETTLE_S} s before it; {repeats} runs. "
                       "speclane's engine gives up a thread per core another process keeps busy (--adapt-threads; the "
                       "first tick after an idle stretch already runs on the cores that stretch left free); llama-bench "
                       "keeps its -t threads. Target: speclane keeps at least 0.5.")
    return table
