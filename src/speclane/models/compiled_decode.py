"""A single sequence's one-token decode step as one compiled graph (``--compile``).

On this project's 2-core CPU an eager decode step of the default model is ~15 ms of
int4 matmuls and ~15 ms of everything else: about a thousand small ops (norms, casts,
RoPE, SiLU, residual adds, KV-cache views, SDPA's own set-up) at ~10 µs of dispatch
each (``benchmarks/decode_breakdown.py``). ``torch.compile`` turns the whole step, every
layer and its attention, into one graph of fused C++ loops and int4 kernel calls, run
without Python in between: ~30% faster than eager here until our C kernels took over the
glue too (fused norm / SiLU, RoPE + cache write + attention); since the eighth session the
eager step is faster (bench decode: 3.69x vs 3.26x transformers), so ``make run`` serves
eagerly and this path stays for CPUs where our kernels do not build (docs/benchmarks.md).

Shapes: the only size that changes from step to step is the sequence's cached length
``L``, marked dynamic, so one compile serves every position (``MIN_CACHED`` and up:
dynamo specialises sizes 0 and 1). The graph reads the cache but never writes it: it
returns the new position's keys and values of every layer, and the caller writes them
with one copy per tensor (a compiled write into a slice of the cache copies the cache).

Attention is written out as products and sums rather than SDPA, so inductor fuses it
into float32-accumulating loops over the L cached positions; the new token's own key is
scored apart from the cached ones, so nothing is concatenated onto the cache.

Numerics: ``emulate_precision_casts`` makes inductor round to bfloat16 where eager
does, but fused reductions (RMSNorm, attention) sum in another order, so an occasional
bfloat16 rounding flips: tests see hidden states within ~1.5-2.5% of the eager step, not the
same bits. Ragged batches, prefill and verification run eager.

Cost: the compile is long (dynamo traces all layers, inductor generates C++ for each):
~2-4 minutes on 2 cores the first time, seconds after from inductor's cache, which
``compile_decode`` keeps under ~/.cache/speclane/inductor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from speclane.engine.kv_cache import KVCache
from speclane.models.linear import Int4Weight
from speclane.models.llama import _rotate

MIN_CACHED = 2  # shortest cached length the compiled step takes (see module docstring)


def supports(model) -> bool:
    """Int4 linears without biases (the default GGUF model): the compiled step's shape."""
    linears = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return (all(isinstance(lin.quantized, Int4Weight) and lin.bias is None for lin in linears)
            and len({lin.quantized.kernel for lin in linears}) == 1)


class LayerTensors(NamedTuple):
    """One layer's tensors for the compiled step (each linear: its int4 kernel's tensors,
    ``Int4Weight.tensors``)."""

    qkv: tuple[torch.Tensor, ...]
    attn_norm: torch.Tensor
    o: tuple[torch.Tensor, ...]
    gate_up: tuple[torch.Tensor, ...]
    down: tuple[torch.Tensor, ...]
    mlp_norm: torch.Tensor

    @classmethod
    def of(cls, layer) -> LayerTensors:
        return cls(layer.qkv.quantized.tensors, layer.attn_norm, layer.o.quantized.tensors,
                   layer.gate_up.quantized.tensors, layer.down.quantized.tensors, layer.mlp_norm)


class CompiledDecodeStep:
    """``step(token, position, slot, cache)`` -> final-normed hidden state [1, hidden]."""

    def __init__(self, model):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "speclane" / "inductor"))
        self.model = model
        self.layers = [LayerTensors.of(layer) for layer in model.layers]
        self._fn = torch.compile(_step_function(model), dynamic=False, fullgraph=True)

    def takes(self, cached: int, num_new: int) -> bool:
        return num_new == 1 and cached >= MIN_CACHED

    def __call__(self, token: torch.Tensor, position: int, slot: int, cache: KVCache) -> torch.Tensor:
        past_keys = cache.all_keys[:, slot, :, :position]  # [layers, kv_heads, L, head_dim] views
        past_values = cache.all_values[:, slot, :, :position]
        for past in (past_keys, past_values):
            torch._dynamo.mark_dynamic(past, 2, min=MIN_CACHED, max=cache.max_len)
        m = self.model
        hidden, keys, values = self._fn(token, torch.tensor([position]), past_keys, past_values, m.embed, m.cos,
                                        m.signed_sin, m.final_norm, self.layers)
        cache.all_keys[:, slot, :, position] = keys
        cache.all_values[:, slot, :, position] = values
        cache.advance(slot, position, 1)
        return hidden


def _step_function(model):
    """The step as a pure function of tensors; sizes are closure constants."""
    import torch._inductor.config as inductor_config

    inductor_config.emulate_precision_casts = True  # round where eager rounds (module docstring)
    cfg, dt = model.config, model.dtype
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q_size, kv_size, kernel = heads * head_dim, kv_heads * head_dim, model.layers[0].qkv.quantized
    query_group, scale, hidden, eps = cfg.group_size, model.scale, cfg.hidden_size, cfg.rms_norm_eps

    def int4(x, tensors):
        return kernel.graph_matmul(x, *tensors)

    def attention(q, k, v, past_k, past_v):
        """q: [1, heads, d]; k, v: [1, kv_heads, d]; past_*: [kv_heads, L, d] -> [1, heads * d]."""
        q = q.view(kv_heads, query_group, 1, head_dim).float()
        scores = (q * past_k.unsqueeze(1).float()).sum(-1)  # [kv_heads, group, L]
        own = (q.squeeze(2) * k.view(kv_heads, 1, head_dim).float()).sum(-1, keepdim=True)  # [.., 1]
        weights = torch.softmax(torch.cat([scores, own], dim=-1) * scale, dim=-1)
        out = (weights[..., :-1, None] * past_v.unsqueeze(1).float()).sum(-2)  # [kv_heads, group, d]
        out = out + weights[..., -1:] * v.view(kv_heads, 1, head_dim).float()
        return out.to(dt).view(1, q_size)

    def step(token, position, past_keys, past_values, embed, cos_table, sin_table, final_norm, layers):
        # The same maths as LlamaModel.forward (float32 residual, linears in dt).
        x = F.embedding(token, embed).float()  # [1, hidden]
        cos, sin = cos_table[position].unsqueeze(1), sin_table[position].unsqueeze(1)
        new_keys, new_values = [], []
        for i, t in enumerate(layers):
            qkv = int4(F.rms_norm(x, (hidden,), t.attn_norm, eps).to(dt), t.qkv)
            qk = _rotate(qkv[:, : q_size + kv_size].view(1, heads + kv_heads, head_dim), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=1)
            v = qkv[:, q_size + kv_size :].view(1, kv_heads, head_dim)
            new_keys.append(k)
            new_values.append(v)
            x = x + int4(attention(q, k, v, past_keys[i], past_values[i]), t.o)
            gate, up = int4(F.rms_norm(x, (hidden,), t.mlp_norm, eps).to(dt), t.gate_up).chunk(2, dim=-1)
            x = x + int4(F.silu(gate) * up, t.down)
        return F.rms_norm(x, (hidden,), final_norm, eps), torch.cat(new_keys), torch.cat(new_values)

    return step
