"""The MTP head's drafting step on the target's own CPU kernels.

A draft step is one transformer block at one row (a catch-up: a few rows). In torch ops
it took ~0.50 ms here, of which the int4 matmuls were ~0.13 ms: the rest was ~40 small
ops' dispatch (RoPE by cat and multiply, a growing cache by ``torch.cat``, attention by
reshapes and two tiny ``bmm``), paid two or three times per round, 15-20% of a round's
time (`bench mtp`, thirteenth session). The block is a Llama decoder layer, so it runs the
way the target's layers do (``models/llama.py``): the fused add + RMSNorm and SiLU * up
kernels, the int4 matmuls, and RoPE, the cache write and the attention in one call of
``attention_x86.c`` (``rope_write_attention``), over a cache in that kernel's layout.

``KernelCache`` is that cache: one slot ``[1, kv_heads, capacity, head_dim]`` of bfloat16
keys and values, entry ``i`` at absolute position ``first + i``. The kernel rotates a row
by its cache index, so it is handed the rotation tables from row ``first`` on: keys keep
the rotation of their absolute position when old entries are dropped (``keep_last``
moves the newest entries to the front and advances ``first``; nothing is re-rotated).

Numerics differ from the float32 torch path (``MTPHead.extend``) by bfloat16 rounding of
the attention's inputs, as the target's own layers round them. Drafts are drafts: the
verify forward decides what is kept, so the output is unchanged either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from speclane.kernels import attention_cpu

if TYPE_CHECKING:
    from speclane.models.mtp_head import MTPConfig, MTPHead

# Entries past the window before the cache is compacted: dropping them every round would
# copy the whole window each round; every 32 positions it is a ~100 KB copy now and then.
COMPACT_SLACK = 32


def supported(config: MTPConfig) -> bool:
    """Whether the attention kernel runs for this head's shape on this machine."""
    return attention_cpu.supports(torch.bfloat16, config.num_heads, config.num_kv_heads, config.head_dim)


class KernelCache:
    """One request's block K/V in the attention kernel's layout (module docstring)."""

    def __init__(self, config: MTPConfig, first: int, capacity: int | None = None):
        self.config = config
        self.first = first
        self.length = 0
        self._allocate(capacity or config.window + COMPACT_SLACK + 16)

    def _allocate(self, capacity: int) -> None:
        """Buffers for ``capacity`` entries, the current ones copied over. The kernel's
        per-row arguments are slices of preallocated tensors: at one row, making them
        anew each step cost more than the attention itself."""
        cfg = self.config
        shape = (1, cfg.num_kv_heads, capacity, cfg.head_dim)
        for name in ("keys", "values"):
            grown = torch.zeros(shape, dtype=torch.bfloat16)
            if hasattr(self, name):
                grown[:, :, : self.length] = getattr(self, name)[:, :, : self.length]
            setattr(self, name, grown)
        self.row_slot = torch.zeros(capacity, dtype=torch.int32)  # one slot: every row's is 0
        self.row_len = torch.arange(1, capacity + 1, dtype=torch.int32)  # entry i sees entries 0..i
        self.q_scratch = torch.empty(capacity, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16)

    @property
    def end(self) -> int:
        return self.first + self.length

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` more entries (a catch-up after a long wait, deep drafts)."""
        needed = self.length + rows
        if needed > self.capacity:
            self._allocate(max(needed, 2 * self.capacity))

    def truncate(self, end: int) -> None:
        self.length = max(0, min(self.length, end - self.first))

    def keep_last(self, window: int) -> None:
        """Drop entries older than the window, once ``COMPACT_SLACK`` have built up."""
        drop = self.length - window
        if drop < COMPACT_SLACK:
            return
        for cache in (self.keys, self.values):
            cache[:, :, :window] = cache[:, :, drop : self.length].clone()
        self.first += drop
        self.length = window


class RotationTables:
    """bfloat16 cos and signed sin by absolute position (``llama.py``'s layout: sin with
    its first half negated), grown by doubling as positions come."""

    def __init__(self, inv_freq: torch.Tensor):
        self.inv_freq = inv_freq  # float64 [head_dim / 2]
        self.cos = torch.empty(0)
        self.signed_sin = torch.empty(0)

    def covering(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos.shape[0] < positions:
            size = max(positions, 2 * self.cos.shape[0], 1024)
            angles = torch.outer(torch.arange(size, dtype=torch.float64), self.inv_freq)
            angles = torch.cat([angles, angles], dim=-1)
            half = angles.shape[-1] // 2
            self.cos = angles.cos().to(torch.bfloat16).contiguous()
            self.signed_sin = torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1).to(torch.bfloat16).contiguous()
        return self.cos, self.signed_sin


@torch.inference_mode()
def extend(head: MTPHead, cache: KernelCache, hidden: torch.Tensor, next_tokens: torch.Tensor,
           tables: RotationTables) -> torch.Tensor:
    """``MTPHead.extend`` on the kernels: entries for the next ``n`` positions after
    ``cache.end``, from target hidden states (or block outputs) ``hidden`` [n, H] and the
    tokens after them; returns the block's outputs o [n, H] float32."""
    cfg, ops, kernels = head.config, head._ops, head.kernels
    eps = cfg.rms_norm_eps
    n = hidden.shape[0]
    cache.reserve(n)
    # One row (a draft step): a view of the embedding's row, not an indexing op.
    embedded = head.embed[int(next_tokens[0])][None] if n == 1 else head.embed[next_tokens]
    joined = torch.cat([ops.add_rms_norm(hidden.float().contiguous(), None, head.hidden_norm, eps),
                        ops.add_rms_norm(embedded, None, head.embed_norm, eps)], dim=-1)
    x = kernels["fc"](joined).float()  # the residual stream, float32 as in the target
    qkv = kernels["qkv"](ops.add_rms_norm(x, None, head.attn_norm, eps)).contiguous()
    cos, signed_sin = tables.covering(cache.end + n)
    rows = slice(cache.length, cache.length + n)
    attn = attention_cpu.rope_write_attention(
        qkv, cos[cache.first :], signed_sin[cache.first :], cache.keys, cache.values, cache.row_slot[rows],
        cache.row_len[rows], cfg.num_heads, cfg.head_dim**-0.5, cache.q_scratch[:n])
    cache.length += n
    h = ops.add_rms_norm(x, kernels["o"](attn), head.mlp_norm, eps)  # x += o, in place
    return x + kernels["down"](ops.silu_mul(kernels["gate_up"](h), cfg.intermediate_size)).float()
