"""The int4 matmul kernel against its source at another git revision: the default model's
120 layer matmuls (30 layers of qkv, o, gate_up, down; random int4 weights, ~66 MB, so they
stream from memory as in the model) by rows, the two builds' call sets in a shuffled order
round by round in one process (this machine's speed drifts within seconds).

    .venv/bin/python benchmarks/matmul_ab.py [--against HEAD~1] [--rounds 30]
        [--rows 1,2,4,5,8,16,32,64,128] [--inputs bfloat16]

``--inputs int8`` times the kernel on int8 inputs (``int4_q8_x86.c``, ``--matmul-inputs
int8``) instead of the default exact one (``int4_x86.c``). Both builds are this CPU's
widest vector build (no tile kernel). Per row count: each build's median ms for the 120
matmuls, the paired ratio (the median over rounds of this tree's time over the other's),
and whether the two builds gave every output the same bits.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels import LAYERS, SHAPES  # noqa: E402
from revision_build import build_at  # noqa: E402

from speclane.config import MATMUL_INPUTS  # noqa: E402
from speclane.kernels import int4_cpu  # noqa: E402
from speclane.kernels.select import Kernels  # noqa: E402
from speclane.models.linear import Int4Weight, quantize_int4_groups  # noqa: E402

SOURCES = {"bfloat16": int4_cpu.SOURCE.name, "int8": int4_cpu.INT8_INPUTS_SOURCE.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1", help="the git revision whose kernel is the other arm")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rows", default="1,2,4,5,8,16,32,64,128")
    parser.add_argument("--inputs", default="bfloat16", choices=MATMUL_INPUTS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    here = Kernels.load("native", tiles=False, matmul_inputs=args.inputs)
    with tempfile.TemporaryDirectory() as where:
        kernel = build_at(args.against, SOURCES[args.inputs], here.int4.isa, int4_cpu.declare, Path(where))
    arms = {"this tree": here, args.against: dataclasses.replace(here, int4=kernel)}
    torch.manual_seed(0)
    layers = [[quantize_int4_groups(torch.randn(n, k) * 0.02) for n, k in SHAPES] for _ in range(LAYERS)]
    weights = {name: [[Int4Weight(*p, kernels) for p in layer] for layer in layers] for name, kernels in arms.items()}
    rows_list = [int(r) for r in args.rows.split(",")]
    inputs = {rows: {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)} for rows in rows_list}

    def call_set(name: str, rows: int) -> tuple[float, list[torch.Tensor]]:
        start = time.perf_counter()
        out = [weight.matmul(inputs[rows][k]) for layer in weights[name] for (_, k), weight in zip(SHAPES, layer, strict=True)]
        return (time.perf_counter() - start) * 1000, out

    print(f"### int4 matmuls of one forward ({LAYERS} layers x {len(SHAPES)}), {here.int4.isa} build, {args.inputs} "
          f"inputs, {args.rounds} rounds\n")
    print(f"| rows | ms, {args.against} | ms, this tree | this tree / {args.against} (paired) | the same bits |")
    print("|---|---|---|---|---|")
    shuffle = random.Random(0).shuffle
    for rows in rows_list:
        outputs = {name: call_set(name, rows)[1] for name in arms}  # a warm-up each, and the bits
        same = all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True))
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            order = list(arms)
            shuffle(order)
            for name in order:
                times[name].append(call_set(name, rows)[0])
        paired = statistics.median(a / b for a, b in zip(times["this tree"], times[args.against], strict=True))
        print(f"| {rows} | {statistics.median(times[args.against]):.2f} | {statistics.median(times['this tree']):.2f} "
              f"| {paired:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
