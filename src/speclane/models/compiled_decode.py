"""A one-token decode step with the work between attentions compiled (``--compile``).

On this project's 2-core CPU a decode step of the default model is ~15 ms of int4
matmuls, ~3 ms of attention and ~12 ms of everything else: about a thousand small ops
(norms, casts, RoPE, SiLU, residual adds) at ~12 µs of dispatch each
(``benchmarks/decode_breakdown.py``). ``torch.compile`` fuses them into a few C++
kernels, with a C++ wrapper that calls the int4 kernel without Python in between.

What is compiled: from one layer's attention output to the next layer's q, k, v (the o
projection, the MLP, both norms, the next qkv projection and RoPE), as pure functions of
tensors, so the 30 layers share one graph. The KV-cache writes and attention stay eager:
compiled code that mutates a slice of the cache copies the whole cache.

Numerics: ``emulate_precision_casts`` makes inductor round to bfloat16 where eager
does, but its fused reductions (RMSNorm) sum in another order, so an occasional bfloat16
rounding flips and carries through the KV cache: tests see the same greedy tokens as the
eager step over 32 steps with hidden states within ~1.5%, not the same bits. Only a
single sequence's one-token step takes this path (static shapes: one compile); ragged
batches, prefill and verification run eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from speclane.models.linear import INT4_MM, Int4Weight
from speclane.models.llama import _rotate


def supports(model) -> bool:
    """Int4 linears without biases (the default GGUF model): the compiled functions' shape."""
    linears = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return all(isinstance(lin.quantized, Int4Weight) and lin.bias is None for lin in linears)


class LayerTensors(NamedTuple):
    """The tensors the compiled functions take for one layer (int4: packed weight and its
    scales-and-zeros per linear)."""

    qkv_p: torch.Tensor
    qkv_s: torch.Tensor
    attn_norm: torch.Tensor
    o_p: torch.Tensor
    o_s: torch.Tensor
    gu_p: torch.Tensor
    gu_s: torch.Tensor
    d_p: torch.Tensor
    d_s: torch.Tensor
    mlp_norm: torch.Tensor

    @classmethod
    def of(cls, layer) -> LayerTensors:
        def pair(lin):
            return lin.quantized.packed, lin.quantized.scales_and_zeros

        return cls(*pair(layer.qkv), layer.attn_norm, *pair(layer.o), *pair(layer.gate_up), *pair(layer.down),
                   layer.mlp_norm)


def make_functions(model) -> tuple[Callable, Callable, Callable]:
    """(attention_inputs, between, last), compiled. Shapes and sizes are closure constants."""
    import torch._inductor.config as inductor_config

    inductor_config.emulate_precision_casts = True  # round where eager rounds (module docstring)
    cfg = model.config
    layer0 = model.layers[0]
    group = layer0.qkv.quantized.group
    q_size, kv_size, heads, kv_heads, head_dim = layer0.q_size, layer0.kv_size, layer0.num_heads, layer0.num_kv_heads, layer0.head_dim
    intermediate, eps, hidden, dt = layer0.intermediate, cfg.rms_norm_eps, cfg.hidden_size, model.dtype

    def qkv_of(x, attn_norm, qkv_p, qkv_s, cos, sin):
        h = F.rms_norm(x, (hidden,), attn_norm, eps).to(dt)
        qkv = INT4_MM(h, qkv_p, group, qkv_s)
        qk = _rotate(qkv[:, : q_size + kv_size].view(-1, heads + kv_heads, head_dim), cos, sin)
        q, k = qk.split([heads, kv_heads], dim=1)
        return q, k, qkv[:, q_size + kv_size :].view(-1, kv_heads, head_dim)

    def mlp_after_attention(x, out, o_p, o_s, gu_p, gu_s, d_p, d_s, mlp_norm):
        x = x + INT4_MM(out, o_p, group, o_s)
        h = F.rms_norm(x, (hidden,), mlp_norm, eps).to(dt)
        gate, up = INT4_MM(h, gu_p, group, gu_s).split(intermediate, dim=-1)
        return x + INT4_MM(F.silu(gate) * up, d_p, group, d_s)

    def attention_inputs(x, qkv_p, qkv_s, attn_norm, cos, sin):
        return qkv_of(x, attn_norm, qkv_p, qkv_s, cos, sin)

    def between(x, out, o_p, o_s, gu_p, gu_s, d_p, d_s, mlp_norm, next_qkv_p, next_qkv_s, next_attn_norm, cos, sin):
        x = mlp_after_attention(x, out, o_p, o_s, gu_p, gu_s, d_p, d_s, mlp_norm)
        return (x, *qkv_of(x, next_attn_norm, next_qkv_p, next_qkv_s, cos, sin))

    def last(x, out, o_p, o_s, gu_p, gu_s, d_p, d_s, mlp_norm, final_norm):
        x = mlp_after_attention(x, out, o_p, o_s, gu_p, gu_s, d_p, d_s, mlp_norm)
        return F.rms_norm(x, (hidden,), final_norm, eps)

    def compiled(fn):
        return torch.compile(fn, dynamic=False, fullgraph=True, options={"cpp_wrapper": True})

    return compiled(attention_inputs), compiled(between), compiled(last)
