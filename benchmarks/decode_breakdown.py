"""Where one decode step's time goes: the step with the int4 matmuls and/or attention
replaced by no-ops, alternated in one process (this machine's speed drifts between runs).

    .venv/bin/python benchmarks/decode_breakdown.py [--rounds 8]

Prints the median ms of one forward + logits (one sequence, KV length 200) per variant.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import speclane.models.linear as linear
from speclane.config import EngineConfig
from speclane.engine.calibration import forward_ms
from speclane.kernels import attention_cpu
from speclane.llm import LLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(2)
    llm = LLM(config=EngineConfig().replace(spec_mode="off"))
    model, cache = llm.engine.model, llm.engine.cache
    real_sdpa = F.scaled_dot_product_attention
    # An int4 weight on our kernel calls its bound kernel (Int4Weight.bound, one per weight),
    # one on torch's calls Int4Weight._torch_kernel: swap both.
    weights = [lin.quantized for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    weights = [w for w in [*weights, model.lm_head.quantized] if isinstance(w, linear.Int4Weight) and w.kernel != "torch"]
    real_kernel = ([w.bound for w in weights], linear.Int4Weight._torch_kernel)

    def no_int4(w):
        return lambda x: torch.zeros(x.shape[0], w.out_features, dtype=torch.bfloat16)

    def no_torch(self, x):
        return torch.zeros(x.shape[0], self.out_features, dtype=torch.bfloat16)

    no_matmul = ([no_int4(w) for w in weights], no_torch)

    def use_int4(kernel) -> None:
        ours, torch_kernel = kernel
        for w, call in zip(weights, ours, strict=True):
            w.bound = call
        linear.Int4Weight._torch_kernel = torch_kernel

    def no_sdpa(q, k, v, attn_mask=None, scale=None):
        return torch.zeros_like(q)

    def no_fused_attention(lib, qkv, cos, signed_sin, k_cache, v_cache, *args):
        num_heads = args[-3]
        return torch.zeros(qkv.shape[0], num_heads * k_cache.shape[-1], dtype=torch.bfloat16)

    # Attention runs through our fused kernel (bfloat16: RoPE, cache write and attention in
    # one call) or SDPA (elsewhere): replace both.
    real_attention = (attention_cpu.paged_rope_write_attention, real_sdpa)
    no_attention = (no_fused_attention, no_sdpa)

    variants = {
        "whole step": (real_kernel, real_attention),
        "without int4 matmuls": (no_matmul, real_attention),
        "without attention": (real_kernel, no_attention),
        "without both": (no_matmul, no_attention),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(args.rounds):
            for name, (kernel, attention) in variants.items():
                use_int4(kernel)
                attention_cpu.paged_rope_write_attention, F.scaled_dot_product_attention = attention
                times = [forward_ms(model, cache, kv_len=200) for _ in range(12)]
                samples[name].append(statistics.median(times[2:]))
    finally:
        use_int4(real_kernel)
        attention_cpu.paged_rope_write_attention, F.scaled_dot_product_attention = real_attention
    print("| variant | ms per step (median) |\n|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
