"""``speclane bench gguf``: the GGUF files users bring, speclane against llama.cpp, and
what each weight type costs.

The files: the default SmolLM2-135M Q4_1 file (the baseline row), the same model as
Q4_K_M and as Q8_0 (made from it by ``llama-quantize --allow-requantize`` into
``~/.cache/speclane/bench-gguf``, once, and reused), and Gemma 3 270M Q4_K_M. For each:

- single-stream greedy decode, ``NEW_TOKENS`` tokens after a short chat prompt: speclane's
  engine alone (``speclane.LLM``, speculation off; matmul inputs bfloat16, the default, and
  int8, llama.cpp's arithmetic) against ``llama-bench``'s ``tg`` test of
  the same file (``-p 0 -n NEW_TOKENS``), alternating, medians;
- ``len(STREAM_PROMPTS)`` concurrent streamed chat completions over HTTP (greedy,
  ``max_tokens`` ``NEW_TOKENS``, prompts that ask for long answers, tokens counted from the
  servers' usage): ``speclane serve`` (speculation off per request, and the default lane
  on; and a second server with ``--matmul-inputs int8``) against ``llama-server -np 8 -c 8192``,
  each with its resident memory once loaded.
  The servers run one at a time, each round starting the other first; medians of rounds.

Both engines get the same threads. Without llama.cpp's programs (``bench/llama_cpp.py``)
speclane's arms still run and the tables say the reference did not. The second part,
each weight type on our kernel against a dense bfloat16 matmul, is ``bench/weight_types.py``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from speclane.bench.common import Table, alternate, median
from speclane.bench.decode import PROMPT, engine_decode_arms
from speclane.bench.driver import progress
from speclane.bench.http_streams import (
    CLIENTS_NOTE,
    StreamResult,
    aggregate_rate,
    concurrent_streams,
    light_streams,
    new_tenant,
)
from speclane.bench.llama_cpp import decode_rate, find_llama_cpp_tool, llama_server, requantize
from speclane.bench.servers import ServerProcess, speclane_server
from speclane.bench.weight_types import weight_types
from speclane.config import EngineConfig
from speclane.engine import threads as threads_module
from speclane.models.loader import ModelLoadError, resolve_model

NEW_TOKENS = 128
CACHE = Path.home() / ".cache" / "speclane" / "bench-gguf"
REQUANTIZED = ("Q4_K_M", "Q8_0")  # llama-quantize's names of the types made from the default file
CONTEXT_PER_STREAM = 1024
STREAM_PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a week-long journey across a desert, day by day.",
    "Write a detailed guide to growing tomatoes at home.",
    "Tell the history of the printing press and how it changed the world.",
    "Write a long letter from a sailor to his family, describing life at sea.",
    "Explain how computers store and process information, for a beginner, in detail.",
    "Describe a busy market in a small town from morning to night.",
]


@dataclass(frozen=True)
class GGUFFile:
    label: str
    path: Path | None  # None: not available here (``missing`` says why)
    missing: str = ""


def gguf_files(quantize: Path | None, quick: bool = False) -> list[GGUFFile]:
    """The files this scenario measures, the default file first (``quick``: it and Q4_K_M)."""
    default = resolve_model("smollm2-135m-instruct")
    files = [GGUFFile("SmolLM2-135M Q4_1 (the default file)", default)]
    for type_name in REQUANTIZED[:1] if quick else REQUANTIZED:
        label = f"SmolLM2-135M {type_name} (llama-quantize of the Q4_1 file)"
        if quantize is None:
            files.append(GGUFFile(label, None, "llama-quantize was not found"))
            continue
        progress(f"gguf: {label}")
        out = CACHE / f"{default.stem.split('.')[0]}.{type_name}.gguf"
        files.append(GGUFFile(label, requantize(quantize, default, out, type_name)))
    if quick:
        return files
    try:
        files.append(GGUFFile("Gemma 3 270M Q4_K_M", resolve_model("gemma-3-270m")))
    except ModelLoadError as err:
        files.append(GGUFFile("Gemma 3 270M Q4_K_M", None, str(err)))
    return files


def layer_types(path: Path) -> str:
    """The GGML types of a file's layer matmul weights, most frequent first ("Q5_0 x 90, ...")."""
    from collections import Counter

    from gguf import GGUFReader

    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors
                     if t.name.startswith("blk.") and len(t.shape) == 2)
    return ", ".join(f"{name} x {count}" for name, count in counts.most_common())


def ratio(ours: float | None, theirs: float | None) -> str:
    """``ours / theirs`` as "1.23x", or "-" where either did not run."""
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def busy_elsewhere(seconds: float = 1.0) -> float:
    """Cores' worth of CPU that other processes used over ``seconds``, sampled while this
    process waits (at a scenario's start, before it starts anything): a machine that is not
    quiet. 0.0 where ``/proc`` has no counters."""
    before = threads_module.read_sample()
    time.sleep(seconds)
    after = threads_module.read_sample()
    if before is None or after is None:
        return 0.0
    return max(0.0, (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)) / seconds


def load_note(before: float, after: float, cores: int, threads: int, others: float) -> str:
    """The machine's load around the measurements, with a warning where other processes
    kept at least half a core busy at the start and the engines run several threads: their
    threads meet at a barrier after every operation (llama.cpp's ggml, torch's OpenMP), and
    a thread the OS has preempted holds the others there, so both engines' rates collapse,
    by different amounts. The load averages count the scenario's own threads too (engines,
    servers and clients), so they do not decide it."""
    note = (f"Load average (1 min) of this machine: {before:.1f} before the scenario, {after:.1f} after (the "
            f"scenario's own threads included), on {cores} cores; other processes used {others:.2f} cores at its "
            "start.")
    if threads > 1 and others >= 0.5:
        note += (f" Another process kept a core busy: each engine's {threads} threads wait at every operation's "
                 "barrier for a preempted one, so these rates are far below an idle machine's and their ratios "
                 "are noise; rerun on an idle machine, or with --num-threads 1.")
    return note


def gguf(config: EngineConfig, quick: bool = False) -> list[Table]:
    threads = config.model.num_threads or 2
    tools = {name: find_llama_cpp_tool(name) for name in ("llama-bench", "llama-server", "llama-quantize")}
    tokens = NEW_TOKENS // 2 if quick else NEW_TOKENS
    rounds = 1 if quick else 2
    load_before, others = os.getloadavg()[0], busy_elsewhere()
    cores = len(os.sched_getaffinity(0))
    decode = Table(f"Single-stream greedy decode, {tokens} new tokens, {threads} thread{'s' * (threads > 1)}: "
                   "speclane's engine vs llama.cpp's llama-bench on the same file",
                   ["file", "layer matmul types", "MiB", "speclane tok/s", "llama.cpp tok/s", "speclane / llama.cpp",
                    "speclane, int8 matmul inputs, tok/s", "int8 inputs / llama.cpp"])
    streams = Table(f"{len(STREAM_PROMPTS)} concurrent streamed chat completions over HTTP, {tokens} max tokens each: "
                    "speclane serve vs llama-server",
                    ["file", "speclane tok/s (speculation off)", "speclane tok/s (lane on)", "llama.cpp tok/s",
                     "speclane off / llama.cpp", "speclane, int8 matmul inputs, off, tok/s", "int8 inputs / llama.cpp",
                     "light client: speclane off / llama.cpp (tok/s)", "tokens / stream (speclane, llama.cpp)", "resident MiB (speclane, llama.cpp)"])
    for file in gguf_files(tools["llama-quantize"], quick):
        if file.path is None:
            decode.notes.append(f"{file.label}: not run ({file.missing}).")
            continue
        config_file = config.replace(model=str(file.path), num_threads=threads)
        ours, int8, theirs = _decode(config_file, tools["llama-bench"], tokens, repeats=2 if quick else 3)
        gc.collect()  # the engine's model goes before the servers start
        decode.add(file.label, layer_types(file.path), file.path.stat().st_size / 2**20, ours, theirs or "not run",
                   ratio(ours, theirs), int8, ratio(int8, theirs))
        streams.add(file.label, *_streams(config_file, tools["llama-server"], tokens, rounds, lane=not quick))
    decode.notes.append(f"speclane: speclane.LLM with speculation off, greedy, ignore_eos, {tokens} tokens after the first "
                        f"one of a chat prompt of {len(PROMPT)} characters (the prompt's prefill and first token left out, "
                        f"as llama-bench's tg test has no prompt); llama-bench: -p 0 -n {tokens} -t {threads} -r 1 (its tg test, "
                        "after its own warm-up). The arms alternate, "
                        f"{2 if quick else 3} runs each after a warm-up of speclane; medians. 'int8 matmul inputs': the "
                        "same engine with --matmul-inputs int8 (each group of 32 inputs rounded to 8 bits before the "
                        "quantized matmuls, as llama.cpp computes; the default multiplies bfloat16 inputs exactly).")
    streams.notes.append(f"Each round starts speclane serve (--num-threads {threads}), sends one warm-up request, "
                         "reads its resident memory, runs the arms, stops it, then does the same with llama-server "
                         f"(-np {len(STREAM_PROMPTS)} -c {len(STREAM_PROMPTS) * CONTEXT_PER_STREAM} -t {threads} "
                         f"--jinja); the rounds alternate which server goes first; medians of {rounds} round(s). "
                         "Never both servers at once.")
    streams.notes.append("Greedy (temperature 0), the same prompts asking for long answers, one prompt per stream; "
                         "tok/s: completion tokens (the servers' usage) per second from the first request to the "
                         "last stream's end. 'lane on': speclane's default lane (the requests may speculate). "
                         "Resident memory: the server process's after its warm-up request (speclane's holds "
                         "Python, torch and its KV pool; llama-server's its KV cache of -c tokens).")
    streams.notes.append(CLIENTS_NOTE)
    if quick:
        decode.notes.append("--quick: the default file and its Q4_K_M only, half the tokens, one round of streams "
                            "without the lane-on arm, two layers in the weight-type table.")
    for name, table in (("llama-bench", decode), ("llama-quantize", decode), ("llama-server", streams)):
        if tools[name] is None:
            table.notes.append(f"{name} was not found (PATH or ~/.cache/speclane-anchors): what it makes or measures "
                               "did not run.")
    types = weight_types(config.model.kernels, quick=quick)
    load = load_note(load_before, os.getloadavg()[0], cores, threads, others)
    for table in (decode, streams, types):
        table.notes.append(load)
    return [decode, streams, types]


def _decode(config: EngineConfig, bench: Path | None, tokens: int, repeats: int) -> tuple[float, float, float | None]:
    """Median tok/s of speclane's engine (matmul inputs bfloat16, then int8) and of
    llama-bench (None without it), alternating."""
    threads = config.model.num_threads or 2
    arms = engine_decode_arms(config, {"speclane": "bfloat16", "speclane int8": "int8"}, PROMPT, tokens)
    if bench is not None:
        arms["llama.cpp"] = lambda: decode_rate(bench, Path(config.model.model), threads, tokens, repeats=1)
    progress(f"gguf decode: {Path(config.model.model).name}")  # llama-bench warms itself up
    runs = alternate(arms, repeats, warmup=False)
    return median(runs["speclane"]), median(runs["speclane int8"]), median(runs["llama.cpp"]) if "llama.cpp" in runs else None


def _streams(config: EngineConfig, server: Path | None, tokens: int, rounds: int, lane: bool) -> list:
    """The row's cells: tok/s of speclane off, lane on (or "-"), llama.cpp (or "not run"),
    the ratio, the tokens per stream and the resident memory of each server."""
    model = config.model.model
    rates: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    memory: dict[str, float | None] = {}

    def measure(name: str, url: str, extra: dict | None = None, send: Callable[..., list[StreamResult]] = concurrent_streams
                ) -> None:
        # speclane's arms each a tenant of their own: the lane arm follows the off arm's same prompts
        results = send(url, model, STREAM_PROMPTS, tokens, extra if name.startswith("llama.cpp") else new_tenant(extra))
        rates.setdefault(name, []).append(aggregate_rate(results))
        counts.setdefault(name, []).extend(r.completion_tokens for r in results)

    def ours() -> None:
        with _started("speclane", speclane_server(config), model, memory) as s:
            measure("off", s.url, {"speculative": False})
            measure("off light", s.url, {"speculative": False}, light_streams)
            if lane:
                measure("lane", s.url)

    def ours_int8() -> None:
        with _started("speclane int8", speclane_server(config, ["--matmul-inputs", "int8"]), model, memory) as s:
            measure("int8", s.url, {"speculative": False})

    def theirs() -> None:
        assert server is not None
        slots = len(STREAM_PROMPTS)
        with _started("llama.cpp", llama_server(server, Path(model), config.model.num_threads or 2, slots=slots,
                                                context=slots * CONTEXT_PER_STREAM), model, memory) as s:
            measure("llama.cpp", s.url)
            measure("llama.cpp light", s.url, send=light_streams)

    arms = [ours, ours_int8] + ([theirs] if server is not None else [])
    for i in range(rounds):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            progress(f"gguf streams: {Path(model).name} round {i + 1}/{rounds} {arm.__name__}")
            arm()
    off, on, int8, ref = (median(rates[k]) if k in rates else None for k in ("off", "lane", "int8", "llama.cpp"))
    per_stream = ", ".join(f"{median(counts[k]):.0f}" if k in counts else "-" for k in ("off", "llama.cpp"))
    resident = ", ".join(f"{memory[k]:.0f}" if memory.get(k) else "-" for k in ("speclane", "llama.cpp"))
    light, light_ref = (median(rates[k]) if k in rates else None for k in ("off light", "llama.cpp light"))
    light_cell = f"{ratio(light, light_ref)} ({light:.0f} / {light_ref:.0f})" if light and light_ref else "-"
    return [off, on if on is not None else "-", ref if ref is not None else "not run", ratio(off, ref), int8,
            ratio(int8, ref), light_cell, per_stream, resident]


@contextlib.contextmanager
def _started(name: str, server: contextlib.AbstractContextManager[ServerProcess], model: str,
             memory: dict[str, float | None]) -> Iterator[ServerProcess]:
    """The server, warmed up by one short request, with its resident memory recorded then."""
    with server as s:
        concurrent_streams(s.url, model, STREAM_PROMPTS[:1], 8)
        memory[name] = s.resident_mib()
        yield s
