"""Engine benchmarks: concurrency, speed-up, head-of-line latency, throughput."""

from __future__ import annotations

import time

import torch

from speclane.bench.common import Table, alternate, median, percentile
from speclane.bench.decode import load_transformers
from speclane.bench.driver import (
    Job,
    drive,
    drive_clients_interleaved,
    drive_interleaved,
    progress,
)
from speclane.bench.factory import EngineFactory
from speclane.bench.prompts import CHAT_PROMPTS, LONG_DOCUMENT, SPEEDUP_TASKS
from speclane.request import SamplingParams


def concurrency(factory: EngineFactory, new_tokens: int = 128, quick: bool = False) -> list[Table]:
    """Aggregate decode tok/s at 1/4/8/16 streams vs transformers one prompt after another;
    then latency of 8 decoding streams while a 1,500-token prompt is admitted."""
    levels = (1, 4) if quick else (1, 4, 8, 16)
    prompts = [factory.chat_ids(p) for p in CHAT_PROMPTS]
    sp = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine = factory.engine(spec_mode="off")
    hf = load_transformers(factory.base.model.model, torch.bfloat16)
    table = Table(f"Aggregate greedy decode, {new_tokens} new tokens per stream", ["streams", "speclane tok/s", "transformers tok/s (sequential)", "ratio"])
    for n in levels:
        progress(f"concurrency {n}")

        def ours(n=n) -> float:
            jobs = [Job(f"c{n}-{i}-{time.perf_counter()}", prompts[i % len(prompts)], sp) for i in range(n)]
            _, wall = drive(engine, jobs)
            return n * new_tokens / wall

        def theirs(n=n) -> float:
            from speclane.bench.decode import transformers_generate

            wall = sum(transformers_generate(hf, prompts[i % len(prompts)], new_tokens)[0] for i in range(n))
            return n * new_tokens / wall

        runs = alternate({"ours": ours, "theirs": theirs}, repeats=1 if n > 4 or quick else 2, warmup=n == levels[0])
        a, b = median(runs["ours"]), median(runs["theirs"])
        table.add(n, a, b, f"{a / b:.2f}x")
    table.notes.append("transformers generate() in bfloat16 runs the same prompts one after another (it has no continuous batching); both in one process, alternating.")
    return [table, admission_latency(factory, quick=quick)]


def admission_latency(factory: EngineFactory, quick: bool = False) -> Table:
    long_ids = factory.tokenizer.encode(LONG_DOCUMENT)[:1500]
    prompts = [factory.chat_ids(p) for p in CHAT_PROMPTS[:8]]
    table = Table("8 decoding streams while a 1,500-token prompt is admitted", ["prefill", "admission", "streams' ITL p50 ms", "ITL p99 ms", "p99 vs idle", "long prompt TTFT s"])
    for chunked, budget in ((True, 16), (True, 64), (True, 256), (False, 256)):
        engine = factory.engine(spec_mode="off", enable_chunked_prefill=chunked, max_num_batched_tokens=budget)
        for admit in (False, True):
            progress(f"admission chunked={chunked} admit={admit}")
            jobs = [Job(f"s{i}", prompts[i], SamplingParams(max_tokens=48 if quick else 96, ignore_eos=True)) for i in range(8)]
            if admit:
                jobs.append(Job("long", long_ids, SamplingParams(max_tokens=4, ignore_eos=True), arrival_s=0.6))
            timelines, _ = drive(engine, jobs)
            # Gaps of the 8 streams during the admission window (from the long prompt's arrival to its first token).
            lo = timelines["long"].added_s if admit else 0.6
            hi = timelines["long"].token_times[0] if admit else lo + 3.0
            gaps = []
            for i in range(8):
                tl = timelines[f"s{i}"]
                times = tl.token_times
                gaps += [b - a for a, b in zip(times, times[1:], strict=False) if lo <= b <= hi + 1e-9]
            row = [(f"chunked ({budget}-token budget)" if chunked else "not chunked (waits to run whole)"), "1,500-token prompt" if admit else "none",
                   percentile(gaps, 50) * 1000, percentile(gaps, 99) * 1000]
            if not admit:
                idle_p99 = row[3]
                row += ["1.00x", "-"]
            else:
                row += [f"{row[3] / idle_p99:.2f}x", timelines["long"].ttft_s]
            table.add(*row)
    table.notes.append("ITL: gaps between consecutive tokens of the 8 streams falling inside the admission window (arrival of the long prompt to its first token); 'idle' rows take the same window length without an admission.")
    table.notes.append("Without chunking, a prompt larger than the tick budget is admitted only when it fits (here: once the streams finish), so it never stalls them but waits; on this CPU a tick's cost grows almost linearly with its tokens, so only a budget near the number of decode rows keeps p99 within 2x.")
    return table


def _single(factory: EngineFactory, engine, ids: list[int], prediction: list[int], new_tokens: int) -> tuple[float, dict, float]:
    """(end-to-end tok/s, usage, decode-phase tok/s) of one request alone."""
    jobs = [Job(f"x{time.perf_counter()}", ids, SamplingParams(max_tokens=new_tokens), options={"prediction_token_ids": prediction})]
    timelines, wall = drive(engine, jobs)
    tl = next(iter(timelines.values()))
    return len(tl.token_times) / wall, tl.usage, tl.decode_rate


def speedup(factory: EngineFactory, new_tokens: int = 128, repeats: int = 3, quick: bool = False) -> list[Table]:
    on = factory.engine(spec_mode="slice")
    off = factory.engine(spec_mode="off")
    hf = load_transformers(factory.base.model.model, torch.bfloat16)
    table = Table(f"Single-stream speed-up, greedy, up to {new_tokens} new tokens", [
        "task", "speclane spec on tok/s", "spec off tok/s", "on/off", "decode-phase on/off (tok/s)", "acceptance",
        "tokens/round", "transformers assisted (prompt lookup 4) tok/s", "transformers plain tok/s", "on / assisted"])
    for task, (prompt, prediction) in SPEEDUP_TASKS.items():
        progress(f"speedup {task}")
        ids = factory.chat_ids(prompt)
        pred = factory.tokenizer.encode(prediction) if prediction else []
        table.add(task, *_speedup_row(factory, (on, off, hf), ids, pred, new_tokens, 1 if quick else repeats))
    table.notes.append(f"speclane: default engine (bfloat16 activations, int4 GGUF weights, {factory.base.lane.drafter} drafter {'adaptive K up to ' if factory.base.lane.spec_adaptive_k else 'K='}{factory.base.lane.max_draft_tokens}, one round per tick). "
                       "transformers: bfloat16, generate() with prompt_lookup_num_tokens=4, same prompts; arms alternate A B C D after a warm-up. "
                       "Each run is a tenant of its own: no run drafts from an earlier run's answer to the same prompt.")
    table.notes.append("tok/s columns are end to end (prefill included, as for transformers); the decode-phase column times "
                       "the tokens after the first (1 / time per output token), where speculation acts: prefill is the "
                       "same work in both arms.")
    return [table, _draft_depth_table(factory, off, new_tokens, 1 if quick else repeats)]


def _tokens_per_round(spec: dict) -> float:
    """Tokens a round yielded on average: its accepted drafts plus the bonus token."""
    return (spec.get("accepted_tokens", 0) + spec.get("rounds", 0)) / max(1, spec.get("rounds", 0))


def _measured_median(values: list[float], runs: list[float]) -> float:
    """Median of the samples ``alternate`` kept: it discards each arm's warm-up call, so
    samples recorded on the side keep only their last ``len(runs)``."""
    return median(values[-len(runs):])


def _draft_depth_table(factory: EngineFactory, off, new_tokens: int, repeats: int) -> Table:
    """The copy task (a lone stream) by the most drafts a round, --lone-draft-tokens and
    --num-draft-tokens set alike (the defaults: 8 alone, 4 beside other streams). Its own
    alternation against the off arm."""
    prompt, _ = SPEEDUP_TASKS["copy-heavy"]
    ids = factory.chat_ids(prompt)
    depths = (4, 8)
    engines = {"off": off} | {f"K={k}": factory.engine(spec_mode="slice", num_draft_tokens=k, lone_draft_tokens=k) for k in depths}
    decode: dict[str, list[float]] = {name: [] for name in engines}
    rounds: dict[str, dict] = {}

    def run(name: str) -> float:
        rate, usage, decode_rate = _single(factory, engines[name], ids, [], new_tokens)
        decode[name].append(decode_rate)
        rounds[name] = usage.get("speculative", {})
        return rate

    runs = alternate({name: (lambda name=name: run(name)) for name in engines}, repeats)
    table = Table("Copy-heavy task by draft depth (--lone-draft-tokens and --num-draft-tokens alike), greedy",
                  ["K", "tok/s", "vs off", "decode-phase vs off", "tokens/round"])
    off_rate, off_decode = median(runs["off"]), _measured_median(decode["off"], runs["off"])
    for name in engines:
        if name == "off":
            continue
        spec = rounds[name]
        rate, rate_decode = median(runs[name]), _measured_median(decode[name], runs[name])
        table.add(name, rate, f"{rate / off_rate:.2f}x", f"{rate_decode / off_decode:.2f}x", f"{_tokens_per_round(spec):.2f}")
    table.notes.append("Adaptive K up to the depth; the same prompt, arms alternating after a warm-up. A round's extra "
                       "rows are not free on a CPU (each costs its FMAs), so deeper drafts pay only where they are accepted.")
    return table


def hol(factory: EngineFactory, quick: bool = False, repeats: int = 3) -> tuple[list[Table], dict]:
    """4 classic streams + 1 speculative stream: classic ITL in slice vs burst vs no spec stream.

    Each mode has its own engine, warmed up by a short discarded run; then the modes run in
    turn ``repeats`` times (A B C D A B C D ...) and each mode's gaps are pooled, so a slow
    spell of the machine does not land on one mode. Also returns, per mode, the last run's
    timelines (for the ITL CDF plot) and the counters of the measured runs."""
    from speclane.bench.prompts import PARAGRAPH

    classic_prompts = [factory.chat_ids(p) for p in CHAT_PROMPTS[:4]]
    spec_prompt = factory.chat_ids(f"Repeat the following paragraph exactly:\n\n{PARAGRAPH}")
    n_classic, repeats = (48, 1) if quick else (96, repeats)
    # The second row separates the two costs in the slice row: a fifth stream's own decode
    # row (a fifth row through every matmul) and its speculation.
    modes = {"no speculative stream": None, "5th stream, speculation off": False, "slice": True, "burst": True}

    def jobs(speculative: bool | None, tokens: int, run: str) -> list[Job]:
        out = [Job(f"c{i}{run}", classic_prompts[i], SamplingParams(max_tokens=tokens, ignore_eos=True),
                   options={"speculative": False}) for i in range(4)]
        if speculative is not None:
            # Arrives with the others: its prefill shares their first tick instead of sitting
            # inside their gaps (a prefill stall is chunked prefill's subject, `bench concurrency`).
            out.append(Job(f"spec{run}", spec_prompt, SamplingParams(max_tokens=160 * tokens // n_classic, ignore_eos=True),
                           options={"speculative": speculative}))
        return out

    engines = {mode: factory.engine(spec_mode="burst" if mode == "burst" else "slice") for mode in modes}
    for mode, speculative in modes.items():
        progress(f"hol warm-up {mode}")
        drive(engines[mode], jobs(speculative, 8, "-warm"))
    before = {mode: engine.counters.snapshot() for mode, engine in engines.items()}
    gaps: dict[str, list[float]] = {mode: [] for mode in modes}
    raw: dict[str, dict] = {}
    for run in range(repeats):
        for mode, speculative in modes.items():
            progress(f"hol run {run + 1}/{repeats} {mode}")
            timelines, _ = drive(engines[mode], jobs(speculative, n_classic, f"-{run}"))
            gaps[mode] += [g for i in range(4) for g in _raw_gaps(timelines[f"c{i}-{run}"].token_times)]
            raw[mode] = {"timelines": timelines}
    table = Table("Head-of-line: classic streams' inter-token latency beside one speculative stream",
                  ["mode", "classic ITL p50 ms", "classic ITL p99 ms", "p99 vs no spec stream", "p99 vs 5th stream classic",
                   "max gap ms", "slice rounds", "burst rounds"])
    p99 = {mode: percentile(g, 99) * 1000 for mode, g in gaps.items()}
    base, fifth = p99["no speculative stream"], p99["5th stream, speculation off"]
    for mode in modes:
        after = engines[mode].counters.snapshot()
        counters = {k: v - before[mode][k] for k, v in after.items() if isinstance(v, int | float)}
        raw[mode]["counters"] = counters
        raw[mode]["gaps"] = gaps[mode]  # the ITL CDF plot draws what the table summarises
        table.add(mode, percentile(gaps[mode], 50) * 1000, p99[mode], f"{p99[mode] / base:.2f}x", f"{p99[mode] / fifth:.2f}x",
                  max(gaps[mode]) * 1000, counters["slice_rounds"], counters["burst_rounds"])
    table.notes.append("Classic streams: 4 chat requests with speculative=false; the fifth stream copies a paragraph "
                       f"(160 tokens); all five start together. Gaps pooled over {repeats} runs per mode, modes in turn, "
                       "after a discarded warm-up of each mode's engine.")
    return [table], raw


def _raw_gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False) if b > a]


def throughput(factory: EngineFactory, quick: bool = False, repeats: int = 5, sustain_s: float | None = None) -> list[Table]:
    """8 streams, one holding the lane, against the same 8 with speculation off: every arm's
    engine runs its batch (then its clients) at once, their ticks interleaved, so the
    machine's drift falls on every arm alike (``driver.drive_interleaved``)."""
    from speclane.bench.prompts import PARAGRAPH

    prompts = [factory.chat_ids(p) for p in CHAT_PROMPTS[:7]] + [factory.chat_ids(f"Repeat the following paragraph exactly:\n\n{PARAGRAPH}")]
    n = 64 if quick else 128
    engines = {
        "lane on, adaptive K": factory.engine(spec_mode="slice"),
        "lane on, fixed K": factory.engine(spec_mode="slice", spec_adaptive_k=False),
        "speculation off": factory.engine(spec_mode="off"),
        OFF_AGAIN: factory.engine(spec_mode="off"),
    }
    sampling = SamplingParams(max_tokens=n, ignore_eos=True)
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for run in range(1 + (1 if quick else repeats)):  # the first: a warm-up
        jobs = {name: [Job(f"t{i}-{run}", prompts[i], sampling) for i in range(8)] for name in engines}
        busy = drive_interleaved(engines, jobs)
        if run:
            for name in engines:
                runs[name].append(busy[name].rate)
    table = Table(f"Aggregate throughput, 8 greedy streams x {n} tokens",
                  ["mode", "tok/s (median)", "runs", "vs off (medians)", "vs off (median of paired runs)", "slice rounds (cumulative)"])
    for name, engine in engines.items():
        table.add(name, *_against_off(runs, name), engine.counters.slice_rounds)
    table.notes.append(f"{INTERLEAVED} The first run of each engine is a warm-up, left out. 7 chat streams + 1 copy "
                       "stream, all may hold the lane. A closed batch: the seven chat streams set the run's length in "
                       "every arm (the copy stream's early finish frees its row for the rest of the run), so drafts can at "
                       f"best break even here. '{OFF_AGAIN}': a second speculation-off engine, how far two engines doing "
                       "the same work read apart (the noise the ratios are read against).")
    seconds = sustain_s if sustain_s is not None else 3.0 if quick else 12.0
    return [table, _sustained_throughput(engines, prompts, n, seconds, 1 if quick else repeats)]


OFF_AGAIN = "off again (A/A)"
INTERLEAVED = ("One engine per arm, every arm's engine running its streams at once with their ticks interleaved (one "
               "tick of each engine in turn, in a shuffled order each round); an arm's tok/s is its tokens over its own "
               "ticks' time, so a slow stretch of the machine slows every arm alike.")


def _against_off(runs: dict[str, list[float]], name: str) -> list:
    """An arm's median tok/s, its runs, and its ratio to speculation off by medians and paired:
    each run against the off engine's run beside it (the same interleaved run)."""
    mine, off = runs[name], runs["speculation off"]
    paired = median([a / b for a, b in zip(mine, off, strict=True)])
    return [median(mine), ", ".join(f"{x:.1f}" for x in mine), f"{median(mine) / median(off):.2f}x", f"{paired:.2f}x"]


def _sustained_throughput(engines: dict, prompts: list[list[int]], n: int, seconds: float, repeats: int) -> Table:
    """The same 8 streams as clients that keep sending: each resends its prompt as soon as its
    answer is done, until its engine's ticks have taken the window. Aggregate tok/s while
    all 8 are busy, as a server sees it."""
    sampling = SamplingParams(max_tokens=n, ignore_eos=True)
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(repeats):
        busy = drive_clients_interleaved(engines, prompts, sampling, seconds)
        for name in engines:
            runs[name].append(busy[name].rate)
    table = Table(f"Sustained throughput, 8 clients sending back to back ({n} tokens per answer) for {seconds:g} s of ticks",
                  ["mode", "tok/s (median)", "runs", "vs off (medians)", "vs off (median of paired runs)"])
    for name in engines:
        table.add(name, *_against_off(runs, name))
    table.notes.append(f"{INTERLEAVED} The same engines and prompts as the closed batch above (7 chat clients + 1 copy "
                       "client, all may hold the lane; each request a tenant of its own). Tokens counted as they reach "
                       "the clients within each engine's window; what runs at its end is aborted.")
    return table


def _speedup_row(factory: EngineFactory, engines, ids: list[int], pred: list[int], new_tokens: int, repeats: int) -> list:
    from speclane.bench.decode import transformers_generate

    on, off, hf = engines
    usage_box: dict = {}
    n_tokens: dict = {}

    decode_rates: dict[str, list[float]] = {"on": [], "off": []}

    def ours(name: str, engine) -> float:
        rate, usage, decode_rate = _single(factory, engine, ids, pred, new_tokens)
        decode_rates[name].append(decode_rate)
        if name == "on":
            usage_box.update(usage)
        return rate

    def reference(**kwargs) -> float:
        # As many tokens as ours produced (ours may stop at EOS; transformers is forced to the length).
        n = n_tokens.setdefault("n", usage_box.get("completion_tokens", new_tokens))
        wall, _ = transformers_generate(hf, ids, n, **kwargs)
        return n / wall

    runs = alternate({"on": lambda: ours("on", on), "off": lambda: ours("off", off), "assisted": lambda: reference(prompt_lookup_num_tokens=4),
                      "plain": reference}, repeats)
    spec = usage_box.get("speculative", {})
    acc = spec.get("accepted_tokens", 0) / max(1, spec.get("draft_tokens", 0))
    per_round = _tokens_per_round(spec)
    a, b, c, d = (median(runs[k]) for k in ("on", "off", "assisted", "plain"))
    d_on, d_off = (_measured_median(decode_rates[k], runs[k]) for k in ("on", "off"))
    return [a, b, f"{a / b:.2f}x", f"{d_on / d_off:.2f}x ({d_on:.1f} / {d_off:.1f})", f"{acc:.0%}", f"{per_round:.2f}",
            c, d, f"{a / c:.2f}x"]
