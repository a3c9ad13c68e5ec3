"""Our own Llama-family model (Llama, SmolLM, Qwen2-style q/k/v bias) over a ragged batch.

One forward holds any mix of prefill chunks, single decode steps and multi-token
verifications: each sequence brings its own new tokens and its own cached length
(``RaggedBatch``). New keys/values are written into the ``KVCache`` slot of each
sequence; attention reads each slot's ``[0, start + num_new)`` positions.

Attention: bfloat16 models use our row-by-row kernel (``kernels/attention_x86.c``:
every query row alone, so a position's result does not depend on its neighbours in the
batch). Elsewhere SDPA, with the query heads that share a KV head folded into extra
query rows (measured faster here than ``enable_gqa`` or a per-sequence loop), so it runs
on ``[batch, kv_heads, tokens * group, head_dim]`` against un-repeated keys.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speclane.kernels import attention_cpu, norm_cpu
from speclane.kernels.select import Kernels
from speclane.models.kv_cache import KVCache
from speclane.models.linear import Linear

REFINE_TOP = 32  # logits recomputed in float32 after a quantized head (see LlamaModel.logits)


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, object], ...] = ()  # HF rope_scaling dict as sorted items
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    architecture: str = "llama"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"unsupported head layout: hidden {self.hidden_size}, heads {self.num_heads}, kv heads {self.num_kv_heads}"
            )


@dataclass
class RaggedBatch:
    """Inputs of one forward. ``T`` tokens in all, ``B`` sequences."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token
    slots: list[int]  # [B] KV slot of each sequence
    starts: list[int]  # [B] cached length before this forward
    num_new: list[int]  # [B] new tokens of each sequence (sum == T)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = dict(config.rope_scaling)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        # Llama 3.1's frequency-dependent scaling: long wavelengths are divided by
        # `factor`, short ones kept, the band between interpolated smoothly.
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        middle = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")
    return inv_freq


class Layer(nn.Module):
    def __init__(self, config: LlamaConfig, qkv: Linear, o: Linear, gate_up: Linear, down: Linear,
                 attn_norm: torch.Tensor, mlp_norm: torch.Tensor):
        super().__init__()
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.attn_norm = attn_norm  # [hidden]
        self.mlp_norm = mlp_norm  # [hidden]
        self.eps = config.rms_norm_eps
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.intermediate = config.intermediate_size


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, embed: torch.Tensor, layers: list[Layer], final_norm: torch.Tensor,
                 lm_head: Linear, dtype: torch.dtype, kernels: Kernels, *, quantization: str = "none"):
        super().__init__()
        self.config = config
        self.dtype = dtype
        # The linears' effective quantization (build.effective_quantization: none, int8,
        # int4): the MTP drafter quantizes its head to match, calibration keys on it.
        self.quantization = quantization
        self.kernels = kernels  # the ones its linears were made with (build_model); its MTP drafter's too
        self.ops = norm_cpu.LayerOps.for_dtype(kernels.norm_library, dtype)
        # bfloat16: our row-by-row attention where it is loaded and takes this shape.
        ours = attention_cpu.supports(dtype, config.num_heads, config.num_kv_heads, config.head_dim)
        self.attention_library = kernels.attention_library if ours else None
        self.embed = embed  # [vocab, hidden]
        self.layers = layers
        self.final_norm = final_norm  # [hidden]
        self.lm_head = lm_head
        self.scale = 1.0 / math.sqrt(config.head_dim)
        inv_freq = rope_inv_freq(config)
        t = torch.arange(config.max_position_embeddings, dtype=torch.float64)
        angles = torch.outer(t, inv_freq)  # [max_pos, head_dim / 2]
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(dtype)  # [max_pos, head_dim]
        # sin with the first half negated: rotate-half becomes roll(x) * signed_sin (see _rotate).
        half = config.head_dim // 2
        self.signed_sin = torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1).to(dtype)

    # -- the forward --------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """Run the batch, write its K/V into the cache, return hidden states [T, hidden]."""
        cfg = self.config
        max_kv = max(s + n for s, n in zip(batch.starts, batch.num_new, strict=True))
        if max_kv > cfg.max_position_embeddings:
            raise ValueError(f"position {max_kv} is beyond the model's {cfg.max_position_embeddings} positions")
        if max_kv > cache.max_len:  # before any kernel reads or writes past a slot's end
            raise ValueError(f"position {max_kv} is beyond the KV cache's {cache.max_len} positions")
        attn = _AttentionPlan(batch, cfg, self.dtype, self.attention_library)
        if not attn.ours:  # our kernel rotates inside (rope_write_attention)
            cos = self.cos[batch.positions].unsqueeze(1)  # [T, 1, head_dim]
            sin = self.signed_sin[batch.positions].unsqueeze(1)
        # The residual stream stays in float32 (it is only [T, hidden]); the linears run in
        # self.dtype. In bfloat16 this keeps near-tied logits in the float32 order.
        x = F.embedding(batch.input_ids, self.embed).float()  # [T, hidden]
        ops = self.ops
        branch = None  # the last MLP's output, added to x by the next norm
        for i, layer in enumerate(self.layers):
            h = ops.add_rms_norm(x, branch, layer.attn_norm, layer.eps)
            qkv = layer.qkv(h)  # [T, q + 2 kv]
            if attn.ours:
                out = attn.rope_attend(qkv, self.cos, self.signed_sin, cache.keys[i], cache.values[i], self.scale)
            else:
                # q and k heads sit side by side in the fused projection: rotate them in one go.
                qk = _rotate(qkv[:, : layer.q_size + layer.kv_size].view(-1, layer.num_heads + layer.num_kv_heads, layer.head_dim), cos, sin)
                q, k = qk.split([layer.num_heads, layer.num_kv_heads], dim=1)
                v = qkv[:, layer.q_size + layer.kv_size :].view(-1, layer.num_kv_heads, layer.head_dim)
                out = attn.attend(q, k, v, cache.keys[i], cache.values[i], self.scale)  # [T, q_size]
            h = ops.add_rms_norm(x, layer.o(out), layer.mlp_norm, layer.eps)
            branch = layer.down(ops.silu_mul(layer.gate_up(h), layer.intermediate))
        x = x + branch
        for slot, start, n in zip(batch.slots, batch.starts, batch.num_new, strict=True):
            cache.advance(slot, start, n)
        return F.rms_norm(x, (cfg.hidden_size,), self.final_norm, cfg.rms_norm_eps)  # float32

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] (float32) -> [N, vocab] float32 logits.

        A quantized head returns coarse logits (int4 weights, bfloat16 output): enough to
        find the candidates, not to rank near-ties. The top ``REFINE_TOP`` candidates of each
        row are recomputed exactly from the float32 copy of the head, so greedy choices
        match the float32 model and do not depend on which kernel the tick used.
        """
        head = self.lm_head
        if head.quantized is None:
            return F.linear(hidden.to(head.dense.dtype), head.dense).float()
        coarse = head.quantized.matmul(hidden.to(torch.bfloat16)).float()  # [N, vocab]
        top = coarse.topk(REFINE_TOP, dim=-1).indices  # [N, R]
        exact = torch.einsum("nh,nrh->nr", hidden.float(), head.dense[top])  # [N, R]
        return coarse.scatter_(-1, top, exact)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the Hugging Face (rotate-half) layout. x: [T, heads, head_dim].

    rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1.., +1..]; the signs live in
    ``signed_sin``. Three ops instead of seven: at one decode row each op is mostly
    dispatch, and this runs once per layer.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class _AttentionPlan:
    """Index tensors and the mask for one forward, shared by every layer."""

    def __init__(self, batch: RaggedBatch, cfg: LlamaConfig, dtype: torch.dtype, attention_library: ctypes.CDLL | None):
        self.num_seqs = len(batch.slots)
        self.group = cfg.group_size
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.slots = batch.slots
        self.starts = batch.starts
        self.num_new = batch.num_new
        self.kv_len = max(s + n for s, n in zip(batch.starts, batch.num_new, strict=True))
        self.max_new = max(batch.num_new)
        total = sum(batch.num_new)
        slot_of_token = torch.repeat_interleave(torch.tensor(batch.slots), torch.tensor(batch.num_new))
        self.write_slots = slot_of_token  # [T]
        self.write_positions = batch.positions  # [T]
        self.single = self.num_seqs == 1
        # bfloat16: our row-by-row kernel (kernels/attention_x86.c), so that a position's
        # attention does not depend on the rows beside it; it needs no mask or padding.
        self.ours = attention_library is not None
        if self.ours:
            self.library = attention_library
            self.row_slot = slot_of_token.to(torch.int32).contiguous()
            self.row_len = (batch.positions + 1).to(torch.int32).contiguous()  # position p sees keys 0..p
            self.num_heads = cfg.num_heads
            self.q_scratch = torch.empty(total, cfg.num_heads, cfg.head_dim, dtype=dtype)  # shared by the layers
            return
        if self.single:
            n, start = batch.num_new[0], batch.starts[0]
            self.mask = None if n == 1 else _causal_mask(start, n, self.kv_len).repeat_interleave(self.group, dim=0)
            return
        self.slot_index = torch.tensor(batch.slots)
        # Row of each token in the padded [B * max_new] query layout.
        offsets = torch.tensor([0] + list(batch.num_new[:-1])).cumsum(0)
        seq_of_token = torch.repeat_interleave(torch.arange(self.num_seqs), torch.tensor(batch.num_new))
        within = torch.arange(total) - offsets[seq_of_token]
        self.pad_index = seq_of_token * self.max_new + within  # [T]
        # Query t of sequence b (absolute position starts[b] + t) sees keys <= its position.
        key_pos = torch.arange(self.kv_len)  # [L]
        q_pos = torch.tensor(batch.starts)[:, None] + torch.arange(self.max_new)[None, :]  # [B, max_new]
        limit = torch.minimum(q_pos, torch.tensor(batch.starts)[:, None] + torch.tensor(batch.num_new)[:, None] - 1)
        allowed = key_pos[None, None, :] <= limit[:, :, None]  # [B, max_new, L]
        # [B, 1, max_new * group, L] matching the folded query rows.
        self.mask = allowed.repeat_interleave(self.group, dim=1).unsqueeze(1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, scale: float) -> torch.Tensor:
        """SDPA (where our kernel does not run; it has ``rope_attend``). q: [T, heads, d];
        k, v: [T, kv_heads, d]. Writes k/v, returns [T, heads * d]."""
        g, kvh, d = self.group, self.num_kv_heads, self.head_dim
        if self.single:
            slot, n = self.slots[0], self.num_new[0]
            self._write(k, v, k_cache, v_cache)
            keys = k_cache[slot, :, : self.kv_len].unsqueeze(0)  # [1, kvh, L, d]
            values = v_cache[slot, :, : self.kv_len].unsqueeze(0)
            if n == 1:  # a decode step: the folded layout is q's own memory layout, no copies
                out = F.scaled_dot_product_attention(q.view(1, kvh, g, d), keys, values, scale=scale)
                return out.view(1, kvh * g * d)
            # [n, kvh * g, d] -> [1, kvh, n * g, d]: query heads of a KV group become rows.
            queries = q.view(n, kvh, g, d).permute(1, 0, 2, 3).reshape(1, kvh, n * g, d)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.mask, scale=scale)
            return out.view(kvh, n, g, d).permute(1, 0, 2, 3).reshape(n, kvh * g * d)
        self._write(k, v, k_cache, v_cache)
        b, m = self.num_seqs, self.max_new
        keys = k_cache[:, :, : self.kv_len].index_select(0, self.slot_index)  # [B, kvh, L, d]
        values = v_cache[:, :, : self.kv_len].index_select(0, self.slot_index)
        padded = q.new_zeros(b * m, kvh * g, d)
        padded[self.pad_index] = q
        queries = padded.view(b, m, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, m * g, d)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.mask, scale=scale)
        out = out.view(b, kvh, m, g, d).permute(0, 2, 1, 3, 4).reshape(b * m, kvh * g * d)
        return out[self.pad_index]

    def rope_attend(self, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, scale: float) -> torch.Tensor:
        """Our kernel only: RoPE on the fused projection's q and k, the cache write and the
        attention in one call (``attention_cpu.rope_write_attention``). -> [T, heads * d]"""
        return attention_cpu.rope_write_attention(self.library, qkv, cos, signed_sin, k_cache, v_cache, self.row_slot, self.row_len,
                                                  self.num_heads, scale, self.q_scratch)

    def _write(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """This forward's keys and values into the cache (k, v: [T, kv_heads, d])."""
        if self.single:  # one sequence: one contiguous range of positions
            slot, start, n = self.slots[0], self.starts[0], self.num_new[0]
            k_cache[slot, :, start : start + n] = k.transpose(0, 1)
            v_cache[slot, :, start : start + n] = v.transpose(0, 1)
        else:
            k_cache[self.write_slots, :, self.write_positions] = k
            v_cache[self.write_slots, :, self.write_positions] = v


def _causal_mask(start: int, num_new: int, kv_len: int) -> torch.Tensor:
    """[num_new, kv_len] bool: new token t (position start + t) sees keys <= start + t."""
    q_pos = start + torch.arange(num_new)[:, None]
    return torch.arange(kv_len)[None, :] <= q_pos
