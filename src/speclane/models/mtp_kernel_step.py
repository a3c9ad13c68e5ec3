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

``FusedStep`` goes one further: a draft step (the block, then the last entry's draft logits
and their argmax) in one C call (``kernels/mtp_step.c``) that calls the same kernels in the
same order, so its bits are ``extend`` + ``MTPHead.draft_logits``'s. Right after a target
forward the ~25 calls' glue cost about as much as their work (a round of two drafts: ~1.9 ms,
of which ~1 ms outside the kernels). ``SPECLANE_MTP_STEP_KERNEL=auto|avx512|avx2|torch``
(``torch``: the calls one by one, as above).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from speclane.kernels import attention_cpu, build, norm_cpu

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
        for entries in (self.keys, self.values):
            entries[:, :, :window] = entries[:, :, drop : self.length].clone()
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


# -- the fused step (kernels/mtp_step.c) --------------------------------------------------
SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "mtp_step.c"
SWITCH = "SPECLANE_MTP_STEP_KERNEL"
ISAS = ("avx512", "avx2")  # it only calls the other kernels: any build does


class _WeightRef(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("minimum", ctypes.c_void_p)]


class _Head(ctypes.Structure):
    """``mtp_head`` of mtp_step.c, field for field."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("int4", "norm", "silu", "attention")]
    _fields_ += [(name, ctypes.c_int) for name in ("hidden", "inter", "heads", "kv_heads", "head_dim", "vocab", "max_rows")]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
    _fields_ += [(name, ctypes.c_void_p) for name in ("hidden_norm", "embed_norm", "attn_norm", "mlp_norm", "final_norm", "embed")]
    _fields_ += [(name, _WeightRef) for name in ("fc", "qkv", "o", "gate_up", "down", "head")]
    _fields_ += [(name, ctypes.c_void_p) for name in ("joined", "wide", "act", "narrow", "narrow2", "q", "x")]
    _fields_ += [(name, ctypes.c_void_p) for name in ("out", "carry", "logits", "vocab_ids")]


def _declare(lib: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    lib.mtp_step.argtypes = [pointer] * 3 + [ctypes.c_int] + [pointer] * 4 + [ctypes.c_int] + [pointer] * 4
    lib.mtp_step.restype = ctypes.c_int
    lib.mtp_draft_greedy.argtypes = [pointer] * 3 + [ctypes.c_int] * 2 + [pointer] * 4 + [ctypes.c_int] + [pointer] * 4
    lib.mtp_draft_greedy.restype = ctypes.c_int


@cache
def _kernel() -> build.Kernel | None:
    return build.load(SOURCE, SWITCH, _declare, ISAS)


def using(value: str):
    """``with using("torch"): ...``: the block runs with ``SPECLANE_MTP_STEP_KERNEL=value``."""
    return build.switched(SWITCH, value, _kernel)


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


@dataclass
class StepOutput:
    """A draft step: the block's outputs of its new entries, and the last one's draft logits."""

    out: torch.Tensor  # [n, H] float32
    best: int  # the index of the logits' maximum (the first of equal maxima)
    logits: torch.Tensor | None = None  # [draft_vocab] float32, where the caller asked for them


class FusedStep:
    """One C call per draft step over the head's int4 weights (module docstring)."""

    def __init__(self, head: MTPHead, lib: ctypes.CDLL):
        cfg, kernels = head.config, head.kernels
        self.lib, self.config = lib, cfg
        self.max_rows = 2 * cfg.window  # a catch-up holds at most ~2 windows (MTPDrafter.observe); more: the calls one by one
        weights = {name: kernels[name].quantized for name in ("fc", "qkv", "o", "gate_up", "down", "head")}
        rows, h, i = self.max_rows, cfg.hidden_size, cfg.intermediate_size
        qkv_width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        bf16 = torch.bfloat16
        self._scratch = {
            "joined": torch.empty(rows, 2 * h, dtype=bf16), "wide": torch.empty(rows, max(2 * i, qkv_width), dtype=bf16),
            "act": torch.empty(rows, i, dtype=bf16), "narrow": torch.empty(rows, h, dtype=bf16),
            "narrow2": torch.empty(rows, h, dtype=bf16), "q": torch.empty(rows, cfg.num_heads, cfg.head_dim, dtype=bf16),
            "x": torch.empty(rows, h), "out": torch.empty(rows, h), "carry": torch.empty(h),
            "logits": torch.empty(cfg.draft_vocab, dtype=bf16),
        }
        self._vocab_ids = head.vocab_ids.to(torch.int64).contiguous()
        self._norms = {name: getattr(head, name).detach().float().contiguous()
                       for name in ("hidden_norm", "embed_norm", "attn_norm", "mlp_norm", "final_norm")}
        self._embed = head.embed.contiguous()
        norm_lib = norm_cpu.library()
        int4_lib = weights["fc"].library
        self._struct = _Head(
            int4=_address(int4_lib, "int4_matmul"), norm=_address(norm_lib, "add_rms_norm"),
            silu=_address(norm_lib, "silu_mul"), attention=_address(attention_cpu.library(), "rope_write_attention"),
            hidden=h, inter=i, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            vocab=cfg.draft_vocab, max_rows=rows, eps=cfg.rms_norm_eps, scale=cfg.head_dim**-0.5,
            embed=self._embed.data_ptr(),
            **{name: t.data_ptr() for name, t in self._norms.items()},
            **{name: _WeightRef(*(t.data_ptr() for t in w.tensors)) for name, w in weights.items()},
            **{name: t.data_ptr() for name, t in self._scratch.items()}, vocab_ids=self._vocab_ids.data_ptr(),
        )
        self._weights = weights  # keep the packed tensors alive while the pointers are
        self._pointer = ctypes.addressof(self._struct)

    @classmethod
    def for_head(cls, head: MTPHead) -> FusedStep | None:
        """The fused step for a head whose kernel step runs (``MTPHead.kernel_step``: the
        norm and attention kernels are ours) where mtp_step.c builds and every matmul is on
        one build of our int4 kernel, else None."""
        kernel = _kernel()
        builds = {k.quantized.library for k in head.kernels.values()}
        if kernel is None or len(builds) != 1 or None in builds:
            return None
        return cls(head, kernel.library)

    def _cache_arguments(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: list[int],
                         tables: RotationTables, ahead: int) -> tuple[torch.Tensor, ctypes.Array, tuple]:
        """What both C entry points take for ``hidden``'s rows and ``ahead`` more entries
        after them: the rows as float32 (keep it alive through the call), the tokens, and
        the cache and rotation tables' pointers.

        Pointers into the cache and the tables are computed here rather than sliced: right
        after a target forward each torch op costs ~10-20 µs, and a step had a dozen."""
        n = hidden.shape[0]
        cache.reserve(n + ahead)
        if hidden.dtype != torch.float32 or not hidden.is_contiguous():
            hidden = hidden.float().contiguous()
        cos, signed_sin = tables.covering(cache.end + n + ahead)
        table_offset = cache.first * self.config.head_dim * 2  # bytes: bfloat16 rows of head_dim
        index_offset = cache.length * 4  # bytes: int32 per row
        return hidden, (ctypes.c_int64 * n)(*next_tokens), (
            cache.keys.data_ptr(), cache.values.data_ptr(), cache.row_slot.data_ptr() + index_offset,
            cache.row_len.data_ptr() + index_offset, cache.capacity, cos.data_ptr() + table_offset,
            signed_sin.data_ptr() + table_offset)

    def __call__(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: list[int], tables: RotationTables,
                 want_logits: bool) -> StepOutput | None:
        """``extend`` then the last entry's draft logits, in one call; None past ``max_rows``."""
        n = hidden.shape[0]
        if n > self.max_rows:
            return None
        hidden, tokens, at_cache = self._cache_arguments(cache, hidden, next_tokens, tables, 0)
        out = torch.empty(n, self.config.hidden_size)
        logits = torch.empty(self.config.draft_vocab, dtype=torch.bfloat16) if want_logits else self._scratch["logits"]
        best = self.lib.mtp_step(self._pointer, hidden.data_ptr(), tokens, n, *at_cache, out.data_ptr(), logits.data_ptr())
        if best < 0:
            raise RuntimeError(f"mtp_step failed ({best})")
        cache.length += n
        return StepOutput(out, best, logits.float() if want_logits else None)

    def draft_greedy(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: list[int], k: int,
                     tables: RotationTables) -> tuple[list[int], float] | None:
        """A whole greedy round in one C call (``mtp_draft_greedy``): the catch-up on ``hidden``'s
        rows, then ``k`` drafts by argmax. Returns the drafted token ids and the catch-up's
        ms; None past ``max_rows``. The cache keeps the true entries only."""
        n = hidden.shape[0]
        if n > self.max_rows or k < 1:
            return None
        hidden, tokens, at_cache = self._cache_arguments(cache, hidden, next_tokens, tables, k)
        drafts = (ctypes.c_int64 * k)()
        catch_up_ms = ctypes.c_double()
        done = self.lib.mtp_draft_greedy(self._pointer, hidden.data_ptr(), tokens, n, k, *at_cache, drafts,
                                         ctypes.byref(catch_up_ms))
        if done != k:
            raise RuntimeError(f"mtp_draft_greedy failed ({done})")
        cache.length += n
        return list(drafts), catch_up_ms.value
