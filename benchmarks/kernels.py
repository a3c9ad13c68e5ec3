"""Our CPU kernels (kernels/*.c) against torch's: the int4 matmuls alone, the float-weight
matmul alone, then whole forwards.

    .venv/bin/python benchmarks/kernels.py [--rounds 7] [--threads 2] [--forwards-only | --float-only]

Table 1: the 120 layer matmuls of one SmolLM2-135M forward (30 layers of qkv, o, gate_up,
down; random int4 weights, ~66 MB, so they stream from memory as in the model) by rows,
torch's ``_weight_int4pack_mm_for_cpu`` against each build of ours this CPU runs: AVX2,
AVX-512, AVX-512 with bfloat16 dot products, and where the CPU has AMX the tile kernel for
calls of 5+ rows (``amx``; all give the same bits). Rows are what a tick puts through
the linears: 1 for a lone decode step, K+1 for a verify round, one per stream in a mixed
tick, the prompt's tokens in a prefill.

Table 2: the float-weight matmul (``kernels/float_x86.c``, the build ``auto`` picks) on
float16, bfloat16 and float32 weights against torch's ``F.linear`` over bfloat16 weights
(what a bfloat16 model without our kernel runs), for SmolLM2-135M's gate/up-sized
[1536 x 576] and down [576 x 1536] weights: 30 random weights of each shape (as a forward's
30 layers, so they stream from memory), microseconds per call.

Table 3: one eager forward + logits of the default model (KV length 200) by positions of
one sequence and by batch of one-token sequences: torch's int4 kernel, SDPA and norm / SiLU
ops; our int4 (the build ``auto`` picks, and the tile kernel where the CPU has AMX) and
attention kernels with torch's norm / SiLU ops; all three of ours. Each arm is a model built
with its own ``Kernels``; the arms alternate in one process; medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from speclane.bench.common import alternate
from speclane.bench.decode import forward_time_ms
from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine, load_tokenizer
from speclane.kernels import build, float_cpu, int4_cpu
from speclane.kernels.select import Kernels
from speclane.models.build import build_model
from speclane.models.linear import Int4Weight, quantize_int4_groups
from speclane.models.loader import read_weights

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down of SmolLM2-135M
LAYERS = 30
ROWS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 32, 96]
FLOAT_SHAPES = [(1536, 576), (576, 1536)]  # SmolLM2-135M's up (or gate) and down
FLOAT_ROWS = [1, 8, 96]
FLOAT_TYPES = [torch.float16, torch.bfloat16, torch.float32]
FORWARDS = [(1, 1), (2, 1), (4, 1), (5, 1), (9, 1), (96, 1), (1, 4), (1, 8)]  # (positions, batch)


def int4_kernels(kernel: str) -> Kernels:
    """The kernels of one int4 arm: ``torch``, a build alone (no tile kernel), ``amx``
    (auto's build with the tile kernel for calls of TILE_MIN_ROWS+ rows) or ``auto``."""
    if kernel in ("torch", "auto"):
        return Kernels.load(kernel)
    if kernel == "amx":
        return Kernels.load("native", tiles=True)
    return Kernels.load("native", isa=kernel, tiles=False)


def alternated_medians(measure: Callable[[str, object], float], kernels: list[str], cases: list,
                       rounds: int) -> dict:
    """Median ms per (kernel, case): bench.common.alternate over every (kernel, case) pair,
    the kernels side by side for each case, after a discarded warm-up of each."""
    arms = {(kernel, case): (lambda kernel=kernel, case=case: measure(kernel, case))
            for case in cases for kernel in kernels}
    return {key: statistics.median(values) for key, values in alternate(arms, rounds).items()}


def matmul_table(rounds: int) -> None:
    torch.manual_seed(0)
    layers = [[quantize_int4_groups(torch.randn(n, k) * 0.02) for n, k in SHAPES] for _ in range(LAYERS)]
    kernels = ["torch"] + [isa for isa in reversed(int4_cpu.ISAS) if not build.missing_cpu_flags(isa)]
    kernels += ["amx"] if not build.missing_cpu_flags("amx") else []
    weights = {}
    for kernel in kernels:
        loaded = int4_kernels(kernel)
        weights[kernel] = [[Int4Weight(*p, loaded) for p in layer] for layer in layers]
    inputs = {rows: {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)} for rows in ROWS}

    def measure(kernel: str, rows: int) -> float:
        start = time.perf_counter()
        for layer in weights[kernel]:
            for (_, in_features), weight in zip(SHAPES, layer, strict=True):
                weight.matmul(inputs[rows][in_features])
        return (time.perf_counter() - start) * 1000

    ms = alternated_medians(measure, kernels, ROWS, rounds)
    best = kernels[-1]  # the tile kernel where there is one, else the widest build
    print(f"### int4 matmuls of one forward ({LAYERS} layers x {len(SHAPES)}), median of {rounds} rounds\n")
    print("| rows | torch's kernel ms | " + " | ".join(f"ours {k} ms | {k} / torch's" for k in kernels[1:])
          + f" | {best} vs {best} at 1 row |\n|---|---|" + "---|---|" * len(kernels[1:]) + "---|")
    for rows in ROWS:
        cells = [f"{ms[(k, rows)]:.1f} | {ms[(k, rows)] / ms[('torch', rows)]:.2f}x" for k in kernels[1:]]
        print(f"| {rows} | {ms[('torch', rows)]:.1f} | " + " | ".join(cells)
              + f" | {ms[(best, rows)] / ms[(best, 1)]:.2f}x |")


def float_table(rounds: int) -> None:
    torch.manual_seed(0)
    kernel = float_cpu.load()  # the widest build this CPU runs (both give the same bits)
    kernels = ["torch"] + [str(dtype).removeprefix("torch.") for dtype in FLOAT_TYPES]
    dense = {shape: [torch.randn(*shape) * 0.02 for _ in range(LAYERS)] for shape in FLOAT_SHAPES}
    calls = {(shape, "torch"): [(lambda x, w=w.bfloat16(): torch.nn.functional.linear(x, w)) for w in weights]
             for shape, weights in dense.items()}
    for shape, weights in dense.items():
        for name, dtype in zip(kernels[1:], FLOAT_TYPES, strict=True):
            calls[(shape, name)] = [float_cpu.bind(float_cpu.pack(w.to(dtype)), kernel.library) for w in weights]
    inputs = {(shape, rows): torch.randn(rows, shape[1]).bfloat16() for shape in FLOAT_SHAPES for rows in FLOAT_ROWS}

    def measure(kernel: str, case: tuple[tuple[int, int], int]) -> float:
        shape, rows = case
        x = inputs[(shape, rows)]
        start = time.perf_counter()
        for call in calls[(shape, kernel)]:
            call(x)
        return (time.perf_counter() - start) * 1e6 / LAYERS

    cases = [(shape, rows) for shape in FLOAT_SHAPES for rows in FLOAT_ROWS]
    us = alternated_medians(measure, kernels, cases, rounds)
    print(f"\n### Float-weight matmul ({kernel.isa} build) vs torch's F.linear over bfloat16 weights, "
          f"us per call ({LAYERS} weights of each shape), median of {rounds} rounds\n")
    print("| weight [N x K] | rows | torch bfloat16 us | " + " | ".join(f"ours {k} us | / torch" for k in kernels[1:])
          + " |\n|---|---|---|" + "---|---|" * len(kernels[1:]))
    for shape, rows in cases:
        theirs = us[("torch", (shape, rows))]
        cells = [f"{us[(k, (shape, rows))]:.0f} | {us[(k, (shape, rows))] / theirs:.2f}x" for k in kernels[1:]]
        print(f"| {shape[0]} x {shape[1]} | {rows} | {theirs:.0f} | " + " | ".join(cells) + " |")


def forward_table(rounds: int) -> None:
    config = EngineConfig().replace(spec_mode="off", max_num_seqs=8)
    weights = read_weights(config.model.model)
    tokenizer = load_tokenizer(weights.tokenizer_source)
    ours = Kernels.load("auto")
    # Arms: torch's ops throughout; our int4 and attention kernels with torch's norm / SiLU
    # ops between them; all ours. One model each, built with the arm's kernels.
    arms = {"torch": Kernels.load("torch"), "ours, torch's glue": dataclasses.replace(ours, norm=None), "ours": ours}
    llms = {arm: SimpleNamespace(engine=LLMEngine.from_parts(config, build_model(weights, config.model, kernels), tokenizer))
            for arm, kernels in arms.items()}

    def measure(arm: str, case: tuple[int, int]) -> float:
        return forward_time_ms(llms[arm], batch=case[1], positions=case[0], kv_len=200, repeats=4)

    ms = alternated_medians(measure, list(arms), FORWARDS, rounds)
    print(f"\n### One forward + logits of the default model (eager, KV length 200), median of {rounds} rounds\n")
    print("| positions x batch | torch's int4 + SDPA + ops ms | ours with torch's norm / SiLU ms | all ours ms | "
          "all ours / torch's | all ours / ours with torch's glue | all ours vs all ours at 1 x 1 |\n"
          "|---|---|---|---|---|---|---|")
    for case in FORWARDS:
        theirs, mixed, ours = (ms[(arm, case)] for arm in arms)
        print(f"| {case[0]} x {case[1]} | {theirs:.1f} | {mixed:.1f} | {ours:.1f} | {ours / theirs:.2f}x | "
              f"{ours / mixed:.2f}x | {ours / ms[('ours', FORWARDS[0])]:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="torch's (and our kernels') threads")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--forwards-only", action="store_true", help="only table 3 (whole forwards)")
    only.add_argument("--float-only", action="store_true", help="only table 2 (the float-weight matmul)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.forwards_only and not args.float_only:
        matmul_table(args.rounds)
    if not args.forwards_only:
        float_table(args.rounds)
    if not args.float_only:
        forward_table(args.rounds)


if __name__ == "__main__":
    main()
