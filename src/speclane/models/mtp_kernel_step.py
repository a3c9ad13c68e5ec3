"""The MTP head's drafting step on the target's own CPU kernels.

A draft step is one transformer block at one row (a catch-up: a few rows). In torch ops
it took ~0.50 ms here, of which the int4 matmuls were ~0.13 ms: the rest was ~40 small
ops' dispatch (RoPE by cat and multiply, a growing cache by ``torch.cat``, attention by
reshapes and two tiny ``bmm``), paid two or three times per round, 15-20% of a round's
time (`bench mtp`). The block is a Llama decoder layer, so it runs the
way the target's layers do (``models/llama.py``): the fused add + RMSNorm and SiLU * up
kernels, the int4 matmuls, and RoPE, the cache write and the attention in one call of
``attention_x86.c`` (``rope_write_attention``), over a cache in that kernel's layout.

``KernelCache`` is that cache: one slot ``[1, kv_heads, capacity, head_dim]`` of bfloat16
keys and values, entry ``i`` at absolute position ``first + i``. The kernel rotates a row
by its cache index, so it is handed the rotation tables from row ``first`` on: keys keep
the rotation of their absolute position when old entries are dropped (``keep_last``
moves the newest entries to the front and advances ``first``; nothing is re-rotated).

``KernelHead`` is the head as it drafts for a target on our kernels: the torch
reference's weights (``MTPHead``) as int4, its norms on the fused kernels, that cache.
Numerics differ from the float32 reference by the int4 weights and by bfloat16 rounding
of the matmuls' and the attention's inputs, as the target's own layers round them. Drafts
are drafts: the verify forward decides what is kept, so the output is unchanged either way.

``FusedStep`` goes one further: a draft step (the block, then the last entry's draft logits
and their argmax) in one C call (``kernels/mtp_step.c``) that calls the same kernels in the
same order, so its bits are ``KernelHead.extend`` + ``KernelHead.draft_logits``'s. Right after
a target forward the ~25 calls' glue cost about as much as their work (a round of two
drafts: ~1.9 ms, of which ~1 ms outside the kernels). It runs where the kernels hold
``mtp_step`` (``Kernels.load(mtp_step=False)``: the calls one by one, the same bits).
"""

from __future__ import annotations

import ctypes

import torch

from speclane.kernels import attention_cpu, norm_cpu
from speclane.kernels.select import Kernels
from speclane.models.linear import Int4Weight, Linear, quantize_int4_groups
from speclane.models.mtp_head import MTPConfig, MTPHead, StepOutput

# Entries past the window before the cache is compacted: dropping them every round would
# copy the whole window each round; every 32 positions it is a ~100 KB copy now and then.
COMPACT_SLACK = 32


def supported(config: MTPConfig, kernels: Kernels) -> bool:
    """Whether ``KernelHead`` runs for this head on ``kernels``: ours for the int4 matmul,
    the norm and the attention, which takes this head's shape."""
    ours = all(kernel is not None for kernel in (kernels.int4, kernels.norm, kernels.attention))
    return ours and attention_cpu.supports(torch.bfloat16, config.num_heads, config.num_kv_heads, config.head_dim)


def drafting_head(head: MTPHead, kernels: Kernels) -> KernelHead | MTPHead:
    """The head as it drafts for a target on ``kernels``: on our kernels where they run
    (``supported``), else the torch reference itself."""
    return KernelHead(head, kernels) if supported(head.config, kernels) else head


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


MATMULS = ("fc", "qkv", "o", "gate_up", "down", "head")  # the head's int4 weights, by name


class KernelHead:
    """An ``MTPHead`` (frozen, its target attached) drafting on our kernels: int4 matmuls,
    the fused norm / SiLU, RoPE + cache write + attention in one call, and the whole step
    in one C call where ``kernels.mtp_step`` is loaded (``FusedStep``). Its caches are
    ``KernelCache``s (``new_cache``); the drafter calls it as it calls the torch reference.

    A draft step is a handful of one-row matmuls over ~9M weights; in float32 they read
    ~36 MB per step and took ~23 ms per K=3 round here, most of a target step. int4 reads
    an eighth of that.
    """

    def __init__(self, head: MTPHead, kernels: Kernels):
        if not supported(head.config, kernels):
            raise ValueError("KernelHead: our int4, norm and attention kernels must run for this head (supported)")
        self.config = cfg = head.config
        self.vocab_ids = head.vocab_ids
        self.kernels = kernels
        with torch.no_grad():
            weights = {name: getattr(head, name).weight for name in MATMULS[:-1]}
            weights["head"] = head.head_weight
            self.linears = {name: Linear(None, Int4Weight(*quantize_int4_groups(w.float()), kernels))
                            for name, w in weights.items()}
        self.norms = {name: getattr(head, name).detach().float().contiguous()
                      for name in ("hidden_norm", "embed_norm", "attn_norm", "mlp_norm", "final_norm")}
        self.embed = head.embed.contiguous()
        self.ops = norm_cpu.LayerOps(kernels.norm_library, torch.bfloat16)
        self.attention_library = kernels.attention_library
        self.tables = RotationTables(head.inv_freq)
        self.eps = cfg.rms_norm_eps
        # One C call where mtp_step.c is loaded and every matmul is on our int4 build (a
        # weight with a row count that is not a multiple of 16 runs on torch's int4 op).
        one_build = all(linear.quantized.library is kernels.int4_library for linear in self.linears.values())
        self.fused = FusedStep(self, kernels.mtp_step_library) if kernels.mtp_step is not None and one_build else None

    @property
    def fused_step(self) -> bool:
        """``step`` and ``draft_greedy`` run as one C call (``FusedStep``)."""
        return self.fused is not None

    def new_cache(self, first: int) -> KernelCache:
        """An empty cache whose first entry will be position ``first``."""
        return KernelCache(self.config, first)

    @torch.inference_mode()
    def extend(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: torch.Tensor,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        """``MTPHead.extend`` on the kernels, one call each: entries for the next ``n``
        positions after ``cache.end`` (``positions``, if given, must be those), from target
        hidden states (or block outputs) ``hidden`` [n, H] and the tokens after them;
        returns the block's outputs o [n, H] float32."""
        cfg, ops, linears, norms, eps = self.config, self.ops, self.linears, self.norms, self.eps
        n = hidden.shape[0]
        cache.reserve(n)
        # One row (a draft step): a view of the embedding's row, not an indexing op.
        embedded = self.embed[int(next_tokens[0])][None] if n == 1 else self.embed[next_tokens]
        joined = torch.cat([ops.add_rms_norm(hidden.float().contiguous(), None, norms["hidden_norm"], eps),
                            ops.add_rms_norm(embedded, None, norms["embed_norm"], eps)], dim=-1)
        x = linears["fc"](joined).float()  # the residual stream, float32 as in the target
        qkv = linears["qkv"](ops.add_rms_norm(x, None, norms["attn_norm"], eps)).contiguous()
        cos, signed_sin = self.tables.covering(cache.end + n)
        rows = slice(cache.length, cache.length + n)
        attn = attention_cpu.rope_write_attention(
            self.attention_library, qkv, cos[cache.first :], signed_sin[cache.first :], cache.keys, cache.values,
            cache.row_slot[rows], cache.row_len[rows], cfg.num_heads, cfg.head_dim**-0.5, cache.q_scratch[:n])
        cache.length += n
        h = ops.add_rms_norm(x, linears["o"](attn), norms["mlp_norm"], eps)  # x += o, in place
        return x + linears["down"](ops.gated_activation(linears["gate_up"](h), cfg.intermediate_size, "silu")).float()

    @torch.inference_mode()
    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Block outputs [n, H] -> logits over the draft vocabulary [n, draft_vocab] float32."""
        normed = self.ops.add_rms_norm(out.float().contiguous(), None, self.norms["final_norm"], self.eps)
        return self.linears["head"](normed).float()

    @torch.inference_mode()
    def logits_of(self, out: torch.Tensor) -> StepOutput:
        """The draft logits of the last of the block outputs ``out`` [n, H], and their argmax."""
        logits = self.draft_logits(out[-1:])[0]
        return StepOutput(out, int(torch.argmax(logits)), logits)

    @torch.inference_mode()
    def step(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: list[int],
             want_logits: bool = True) -> StepOutput:
        """A draft step: ``extend`` the cache by the positions after ``cache.end`` (hidden
        states [n, H] and the tokens after them), then ``logits_of`` the new entries, in one
        C call where the fused step runs (the same bits). ``want_logits`` False: only their
        argmax (greedy drafting), which spares the fused step a copy."""
        if self.fused is not None:
            result = self.fused(cache, hidden, next_tokens, self.tables, want_logits)
            if result is not None:
                return result
        return self.logits_of(self.extend(cache, hidden, torch.tensor(next_tokens)))

    def draft_greedy(self, cache: KernelCache, hidden: torch.Tensor, next_tokens: list[int],
                     k: int) -> tuple[list[int], float] | None:
        """A greedy round (catch-up, then ``k`` argmax drafts) in one C call where the fused
        step runs: the drafts and the catch-up's ms; else None (draft step by step)."""
        if self.fused is None:
            return None
        return self.fused.draft_greedy(cache, hidden, next_tokens, k, self.tables)


# -- the fused step (kernels/mtp_step.c) --------------------------------------------------


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


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


class FusedStep:
    """One C call per draft step over a ``KernelHead``'s int4 weights and kernels (module
    docstring); ``lib``: the loaded ``mtp_step.c``."""

    def __init__(self, head: KernelHead, lib: ctypes.CDLL):
        cfg = head.config
        self.lib, self.config = lib, cfg
        self.max_rows = 2 * cfg.window  # a catch-up holds at most ~2 windows (MTPDrafter.observe_tick); more: the calls one by one
        weights = {name: head.linears[name].quantized for name in MATMULS}
        if {w.library for w in weights.values()} != {head.kernels.int4_library}:
            raise ValueError("FusedStep: every matmul of the head must run on the kernels' int4 build")
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
        self._norms = head.norms  # float32, contiguous
        self._embed = head.embed
        norm_lib = head.kernels.norm_library
        self._struct = _Head(
            int4=_address(head.kernels.int4_library, "int4_matmul"), norm=_address(norm_lib, "add_rms_norm"),
            silu=_address(norm_lib, "silu_mul"), attention=_address(head.kernels.attention_library, "rope_write_attention"),
            hidden=h, inter=i, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            vocab=cfg.draft_vocab, max_rows=rows, eps=cfg.rms_norm_eps, scale=cfg.head_dim**-0.5,
            embed=self._embed.data_ptr(),
            **{name: t.data_ptr() for name, t in self._norms.items()},
            **{name: _WeightRef(*(t.data_ptr() for t in w.tensors)) for name, w in weights.items()},
            **{name: t.data_ptr() for name, t in self._scratch.items()}, vocab_ids=self._vocab_ids.data_ptr(),
        )
        self._weights = weights  # keep the packed tensors alive while the pointers are
        self._pointer = ctypes.addressof(self._struct)

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
