"""Our AVX2 int4 kernel against torch's, by rows, over the default model's layer shapes.

    .venv/bin/python benchmarks/int4_kernel.py [--rounds 7] [--rows 1,2,3,4,5,6,8,9,12,16,32,96]

Times the 120 layer matmuls of one SmolLM2-135M forward (30 layers of qkv, o, gate_up and
down; random int4 weights, ~66 MB: they stream from memory as in the model) with each
kernel, the two alternated in one process, and prints the median ms per row count and
the ratio. Rows are what a tick puts through the linears: 1 for a lone decode step, K+1
for a verify round, one per stream in a mixed tick, the prompt's tokens in a prefill.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from speclane.kernels import int4_cpu
from speclane.models.linear import Int4Weight, quantize_int4_groups

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down of SmolLM2-135M
LAYERS = 30


def build(kernel: str, layers: list) -> list[list[Int4Weight]]:
    os.environ["SPECLANE_INT4_KERNEL"] = kernel
    int4_cpu._library.cache_clear()
    try:
        return [[Int4Weight(*parts) for parts in layer] for layer in layers]
    finally:
        del os.environ["SPECLANE_INT4_KERNEL"]
        int4_cpu._library.cache_clear()


def forward_ms(weights: list[list[Int4Weight]], inputs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for layer in weights:
        for (_, in_features), weight in zip(SHAPES, layer, strict=True):
            weight.matmul(inputs[in_features])
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,9,12,16,32,96")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    layers = [[quantize_int4_groups(torch.randn(n, k) * 0.02) for n, k in SHAPES] for _ in range(LAYERS)]
    arms = {"torch": build("torch", layers), "avx2": build("avx2", layers)}
    samples = {(arm, rows): [] for arm in arms for rows in rows_list}
    for round_ in range(args.rounds + 1):  # round 0 warms both arms up and is dropped
        for rows in rows_list:
            inputs = {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)}
            for arm, weights in arms.items():
                ms = forward_ms(weights, inputs)
                if round_:
                    samples[(arm, rows)].append(ms)
    print(f"### int4 matmuls of one forward ({LAYERS} layers x {len(SHAPES)}), median of {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads\n")
    print("| rows | torch's kernel ms | ours (AVX2) ms | ours / torch's | ours vs ours at 1 row |\n|---|---|---|---|---|")
    one_row = statistics.median(samples[("avx2", rows_list[0])])
    for rows in rows_list:
        theirs, ours = statistics.median(samples[("torch", rows)]), statistics.median(samples[("avx2", rows)])
        print(f"| {rows} | {theirs:.1f} | {ours:.1f} | {ours / theirs:.2f}x | {ours / one_row:.2f}x |")


if __name__ == "__main__":
    main()
