"""Our own Llama-family model over a ragged batch: Llama, SmolLM, Qwen2 (q/k/v bias),
Qwen3, Mistral, Phi-3 and Gemma 2 / 3, one model whose per-family pieces live in the
config's ``FamilyTraits`` (``models/families.py`` reads them from a config.json).

One forward holds any mix of prefill chunks, single decode steps and multi-token
verifications: each sequence brings its own new tokens and its own cached length
(``RaggedBatch``). New keys/values are written into the paged ``KVCache`` through each
sequence's block table; attention reads each sequence's ``[0, start + num_new)`` positions
through it.

A sequence may end in a draft tree (``RaggedBatch.trees``, ``speclane/draft_tree.py``): its
nodes take consecutive cache positions after the fed tokens, each at the RoPE position of
its depth, and each node's row sees the context, its ancestors and itself (the kernel's
tree rows; a mask on the torch path). The runner moves the accepted path's keys and
values to their positions (``KVCache.move``).

Attention: bfloat16 models use our row-by-row kernel on every layer (``kernels/attention_x86.c``:
every query row alone, so a position's result does not depend on its neighbours in the
batch), a sliding layer's window (a query at position p sees keys in ``(p - window, p]``)
and Gemma 2's soft-capped scores included. Elsewhere (float32, a head shape the kernel
does not take) the torch path: SDPA, with the query heads that share a KV head folded
into extra query rows (measured faster here than ``enable_gqa`` or a per-sequence loop),
so it runs on ``[batch, kv_heads, tokens * group, head_dim]`` against un-repeated keys,
with a windowed mask on sliding layers, or an explicit softmax with soft-capping. Keys
stay in the cache at every position (the cache is not a ring buffer): a window limits
what a query sees, not the cache's memory.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from speclane import draft_tree
from speclane.kernels import attention_cpu, norm_cpu
from speclane.kernels.select import Kernels
from speclane.models import forward_plan
from speclane.models.kv_cache import KVCache, gather
from speclane.models.linear import Linear

REFINE_TOP = 32  # logits recomputed in float32 after a quantized head (see LlamaModel.logits)


@dataclass(frozen=True)
class FamilyTraits:
    """What a model family changes in the Llama forward. The defaults are Llama's."""

    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # norms scale by (offset + weight): Gemma's 1 + w (added at build)
    embed_scale: float = 1.0  # the embedding is multiplied by this (Gemma: sqrt(hidden))
    activation: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    sandwich_norms: bool = False  # RMSNorm of the attention and MLP outputs too (Gemma 2 / 3)
    query_pre_attn_scalar: float = 0.0  # attention scale is its -1/2 power; 0: head_dim's
    attn_softcap: float = 0.0  # attention scores -> cap * tanh(scores / cap); 0: none
    final_softcap: float = 0.0  # the same on the output logits; 0: none
    layer_windows: tuple[int, ...] = ()  # per layer: sliding window (keys seen), 0 global; (): all global
    sliding_rope_theta: float = 0.0  # rope base of the sliding layers; 0: the global one
    sliding_rope_scaling: tuple[tuple[str, object], ...] = ()

    def window(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0


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
    explicit_head_dim: int = 0  # a config.json's head_dim where it is not hidden / heads; 0: hidden / heads
    traits: FamilyTraits = FamilyTraits()

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def __post_init__(self) -> None:
        if (not self.explicit_head_dim and self.hidden_size % self.num_heads) or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"unsupported head layout: hidden {self.hidden_size}, heads {self.num_heads}, kv heads {self.num_kv_heads}"
            )
        if self.traits.layer_windows and len(self.traits.layer_windows) != self.num_layers:
            raise ValueError(f"{len(self.traits.layer_windows)} layer windows for {self.num_layers} layers")
        if self.traits.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported MLP activation {self.traits.activation!r} (supported: silu, gelu_tanh)")

    @classmethod
    def from_dict(cls, fields: dict) -> LlamaConfig:
        """The inverse of ``dataclasses.asdict`` after a JSON round trip (lists back to tuples)."""
        fields = dict(fields)
        fields["rope_scaling"] = _frozen(fields.get("rope_scaling", ()))
        traits = dict(fields.get("traits") or {})
        for name in ("layer_windows", "sliding_rope_scaling"):
            if name in traits:
                traits[name] = _frozen(traits[name])
        fields["traits"] = FamilyTraits(**traits)
        return cls(**fields)


def _frozen(value: object) -> object:
    """Lists (from JSON) back into the tuples a frozen config holds."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass
class RaggedBatch:
    """Inputs of one forward. ``T`` tokens in all, ``B`` sequences."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute position of each token
    block_tables: list[Sequence[int]]  # [B] each sequence's KV block table (covering start + num_new)
    starts: list[int]  # [B] cached length before this forward
    num_new: list[int]  # [B] new tokens of each sequence (sum == T)
    # [B] per sequence, None or the parents of its last len(parents) new tokens, a draft
    # tree (``draft_tree.py``): ``positions`` holds their RoPE positions (by depth), and
    # their keys and values go to consecutive cache positions after the fed tokens.
    trees: list[tuple[int, ...] | None] | None = None


@dataclass
class TreeLayout:
    """Where a forward's draft-tree rows sit in the cache and what they see (int32 [T] or
    flat): ``slots``, each row's cache position; ``row_len``, the contiguous positions
    ``[0, row_len)`` it sees; ``extra_start`` [T + 1] and ``extra``, the further positions
    it sees (its tree ancestors, then its own slot)."""

    slots: torch.Tensor
    row_len: torch.Tensor
    extra_start: torch.Tensor
    extra: torch.Tensor

    @classmethod
    def of(cls, batch: RaggedBatch) -> TreeLayout | None:
        """None where no sequence carries a tree."""
        if not batch.trees or not any(batch.trees):
            return None
        slots: list[int] = []
        row_len: list[int] = []
        extra_start = [0]
        extra: list[int] = []
        for start, n, parents in zip(batch.starts, batch.num_new, batch.trees, strict=True):
            fed = n - len(parents or ())
            slots.extend(range(start, start + n))
            row_len.extend(range(start + 1, start + fed + 1))
            extra_start.extend([len(extra)] * fed)
            for j in range(len(parents or ())):
                row_len.append(start + fed)
                extra.extend(start + fed + a for a in draft_tree.path_to(parents, j))
                extra_start.append(len(extra))
        return cls(*(torch.tensor(values, dtype=torch.int32) for values in (slots, row_len, extra_start, extra)))

    def tree_rows(self, positions: torch.Tensor) -> attention_cpu.TreeRows:
        return attention_cpu.TreeRows(positions.to(torch.int32).contiguous(), self.extra_start, self.extra)


def rope_inv_freq(config: LlamaConfig, sliding: bool = False) -> torch.Tensor:
    """Rotary frequencies of the global layers, or of the sliding ones (``sliding``) where
    the family gives those their own base and scaling."""
    dim = config.head_dim
    theta, scaling = config.rope_theta, dict(config.rope_scaling)
    if sliding and config.traits.sliding_rope_theta:
        theta, scaling = config.traits.sliding_rope_theta, dict(config.traits.sliding_rope_scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "longrope":
        # Phi-3's LongRoPE: one divisor per frequency. models/families.py keeps the short
        # factors (the model serves at most original_max_position_embeddings positions).
        factors = torch.tensor(scaling["short_factor"], dtype=torch.float64)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"longrope short_factor has {factors.numel()} values for {inv_freq.numel()} frequencies")
        inv_freq = 1.0 / (factors * theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    elif kind == "freq_factors":  # a GGUF's rope_freqs tensor (models/families.gguf_finish)
        inv_freq = inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64)
    elif kind == "llama3":
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
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3, longrope, freq_factors)")
    return inv_freq


def rope_tables(config: LlamaConfig, dtype: torch.dtype, sliding: bool = False,
                positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, signed_sin) [positions, head_dim] in the rotate-half layout (see ``_rotate``);
    ``positions`` None: all of the model's."""
    inv_freq = rope_inv_freq(config, sliding)
    scaling = dict(config.traits.sliding_rope_scaling if sliding and config.traits.sliding_rope_theta else config.rope_scaling)
    # LongRoPE scales cos and sin (models/families.py resolves its attention_factor).
    magnitude = float(scaling.get("attention_factor", 1.0)) if scaling.get("rope_type") == "longrope" else 1.0
    t = torch.arange(config.max_position_embeddings if positions is None else positions, dtype=torch.float64)
    angles = torch.outer(t, inv_freq)  # [max_pos, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)
    cos = (angles.cos() * magnitude).to(dtype)
    # sin with the first half negated: rotate-half becomes roll(x) * signed_sin (see _rotate).
    half = config.head_dim // 2
    signed_sin = (torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1) * magnitude).to(dtype)
    return cos, signed_sin


class Layer(nn.Module):
    def __init__(self, config: LlamaConfig, qkv: Linear, o: Linear, gate_up: Linear, down: Linear,
                 attn_norm: torch.Tensor, mlp_norm: torch.Tensor, *, index: int = 0,
                 q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                 attn_out_norm: torch.Tensor | None = None, mlp_out_norm: torch.Tensor | None = None):
        super().__init__()
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.attn_norm = attn_norm  # [hidden], before attention
        self.mlp_norm = mlp_norm  # [hidden], before the MLP
        self.q_norm, self.k_norm = q_norm, k_norm  # [head_dim] each, or None (traits.qk_norm)
        self.attn_out_norm, self.mlp_out_norm = attn_out_norm, mlp_out_norm  # [hidden] or None (traits.sandwich_norms)
        traits = config.traits
        if traits.qk_norm and (q_norm is None or k_norm is None):
            raise ValueError(f"layer {index}: the family normalizes q and k heads, and the layer has no q/k norm")
        if traits.sandwich_norms and (attn_out_norm is None or mlp_out_norm is None):
            raise ValueError(f"layer {index}: the family normalizes attention and MLP outputs, and the layer has no such norms")
        self.window = traits.window(index)
        self.rope = 1 if self.window and traits.sliding_rope_theta else 0  # LlamaModel.rope's table
        self.eps = config.rms_norm_eps
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.intermediate = config.intermediate_size
        # The q/k head norms as column groups of the fused projection (``LayerOps.rms_norm_groups``
        # and a forward plan's steps): each q head, then each k head; none without them.
        self.qk_norm_groups: list[tuple[int, int, int, torch.Tensor]] = [] if q_norm is None else [
            (0, self.num_heads, self.head_dim, q_norm), (self.q_size, self.num_kv_heads, self.head_dim, k_norm)]


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, embed: Linear | torch.Tensor, layers: list[Layer], final_norm: torch.Tensor,
                 lm_head: Linear, dtype: torch.dtype, kernels: Kernels, *, quantization: str = "none",
                 rope_positions: int | None = None):
        """``embed``: the token embedding [vocab, hidden] whose rows are looked up (a tensor
        is taken as a dense one); ``rope_positions``: the rope tables' rows at first (None:
        every position of the model), grown when a forward reaches further."""
        super().__init__()
        self.config = config
        self.dtype = dtype
        # The linears' effective quantization (build.effective_quantization: none, file,
        # int8, int4): the MTP drafter quantizes its head to match, calibration keys on it.
        self.quantization = quantization
        self.kernels = kernels  # the ones its linears were made with (build_model); its MTP drafter's too
        self.ops = norm_cpu.LayerOps.for_dtype(kernels.norm_library, dtype)
        # bfloat16: our row-by-row attention where it is loaded and takes this shape.
        ours = attention_cpu.supports(dtype, config.num_heads, config.num_kv_heads, config.head_dim)
        self.attention_library = kernels.attention_library if ours else None
        self.embed = embed if isinstance(embed, Linear) else Linear(embed)  # [vocab, hidden]: rows looked up
        self.layers = layers
        self.final_norm = final_norm  # [hidden]
        self.lm_head = lm_head
        # An int4 copy of the head for rows read for their largest logit alone (``logits``;
        # models/build.py's argmax_screen), or None.
        self.argmax_screen: Linear | None = None
        traits = config.traits
        self.scale = 1.0 / math.sqrt(traits.query_pre_attn_scalar or config.head_dim)
        # Our kernel runs every layer it is loaded for: a sliding layer's window and Gemma 2's
        # soft-capped scores included (a windowed or capped layer on torch's path would round
        # a verify round's rows differently from a decode step's).
        self.kernel_layers = [self.attention_library is not None for _ in layers]
        # A forward of up to forward_plan.MAX_ROWS rows runs its layers as one C call where
        # every layer is our kernels' (forward_plan.py); plan_blocker says why not otherwise.
        self.plan_blocker = self._plan_blocker(kernels)
        self.plans = None if self.plan_blocker else forward_plan.ForwardPlans(
            layers, config, self.scale, self.final_norm, kernels.plan_library, kernels.norm_library,
            self.attention_library)
        self._make_rope(min(rope_positions or config.max_position_embeddings, config.max_position_embeddings))

    def _plan_blocker(self, kernels: Kernels) -> str | None:
        """Why this model's layers cannot run as a forward plan, or None where they can."""
        if kernels.plan_library is None or self.ops.lib is None or self.attention_library is None:
            return "the plan runner, our norms or our attention kernel is not loaded (or a float32 forward)"
        for layer in self.layers:
            if any(linear.op_steps(0, 0, 1, []) is None for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)):
                return "a layer's linear runs torch's kernel or has a bias"
        return None

    def _make_rope(self, positions: int) -> None:
        """The rope tables for positions [0, ``positions``): a model of 32k positions served
        at 2k keeps 2k rows, not 32k (Gemma 3: 64 MiB of tables otherwise)."""
        config, dtype = self.config, self.dtype
        self.cos, self.signed_sin = rope_tables(config, dtype, positions=positions)  # [positions, head_dim]
        # rope[layer.rope]: the global layers' tables, then the sliding layers' own.
        self.rope = [(self.cos, self.signed_sin)]
        if config.traits.sliding_rope_theta:
            self.rope.append(rope_tables(config, dtype, sliding=True, positions=positions))

    @property
    def nbytes(self) -> int:
        """Bytes of every weight and table the model holds (a tied head counted once)."""
        tensors = [self.final_norm, *(t for pair in self.rope for t in pair)]
        linears = {id(lin): lin for lin in (self.embed, self.lm_head, self.argmax_screen) if lin is not None}
        for layer in self.layers:
            linears.update({id(lin): lin for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)})
            tensors += [t for t in (layer.attn_norm, layer.mlp_norm, layer.q_norm, layer.k_norm, layer.attn_out_norm,
                                    layer.mlp_out_norm) if t is not None]
        return sum(lin.nbytes for lin in linears.values()) + sum(t.numel() * t.element_size() for t in tensors)

    def embedding_table(self) -> torch.Tensor:
        """float32 [vocab, hidden]: the whole token embedding, a fresh copy (the MTP head's)."""
        return self.embed.rows(torch.arange(self.config.vocab_size))

    def head_table(self) -> torch.Tensor:
        """float32 [vocab, hidden]: the whole output head's exact weights, a fresh copy."""
        return self.lm_head.rows(torch.arange(self.config.vocab_size))

    # -- the forward --------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """Run the batch, write its K/V into the cache, return hidden states [T, hidden]."""
        cfg = self.config
        max_kv = max(s + n for s, n in zip(batch.starts, batch.num_new, strict=True))
        if max_kv > cfg.max_position_embeddings:
            raise ValueError(f"position {max_kv} is beyond the model's {cfg.max_position_embeddings} positions")
        for parents, n in zip(batch.trees or (), batch.num_new, strict=False):
            if parents:
                draft_tree.check(parents)
                if len(parents) >= n or max(draft_tree.depths(parents)) >= min(
                        (w for w in map(cfg.traits.window, range(cfg.num_layers)) if w), default=cfg.max_position_embeddings):
                    raise ValueError("a draft tree needs a fed token before it and must be shallower than every window")
        for table, start, n in zip(batch.block_tables, batch.starts, batch.num_new, strict=True):
            # Before any kernel reads or writes past a table's end or the pool's.
            if len(table) * cache.block_size < start + n or max(table, default=0) >= cache.num_blocks or min(table, default=0) < 0:
                raise ValueError(f"a block table of {len(table)} blocks ({list(table)[:8]}...) does not hold "
                                 f"{start + n} positions in a pool of {cache.num_blocks} blocks of {cache.block_size}")
        if max_kv > self.cos.shape[0]:
            self._make_rope(min(max(max_kv, 2 * self.cos.shape[0]), cfg.max_position_embeddings))
        traits = cfg.traits
        kernel = self.attention_library if any(self.kernel_layers) else None
        attn = _AttentionPlan(batch, cfg, self.dtype, kernel, cache.block_size, need_torch=not all(self.kernel_layers))
        # Per rope table, the rows of this forward's positions, for the torch path (our
        # kernel rotates inside).
        tables = [] if attn.ours and all(self.kernel_layers) else [
            (cos[batch.positions].unsqueeze(1), sin[batch.positions].unsqueeze(1)) for cos, sin in self.rope]
        # The residual stream stays in float32 (it is only [T, hidden]); the linears run in
        # self.dtype. In bfloat16 this keeps near-tied logits in the float32 order.
        x = self.embed.rows(batch.input_ids)  # [T, hidden] float32
        if traits.embed_scale != 1.0:
            x = x * traits.embed_scale
        if self.plans is not None and all(self.kernel_layers) and self.plans.lock.acquire(blocking=False):
            try:
                plan = self.plans.get(len(batch.input_ids))
                if plan is not None:
                    return plan.run(x, attn, cache, self.rope)  # float32
            finally:
                self.plans.lock.release()
        ops = self.ops
        branch = None  # the last MLP's output, added to x by the next norm
        for i, layer in enumerate(self.layers):
            h = ops.add_rms_norm(x, branch, layer.attn_norm, layer.eps)
            qkv = layer.qkv(h)  # [T, q + 2 kv]
            if layer.qk_norm_groups:
                qkv = ops.rms_norm_groups(qkv, layer.qk_norm_groups, layer.eps).to(qkv.dtype)
            if self.kernel_layers[i]:
                cos, sin = self.rope[layer.rope]
                out = attn.rope_attend(qkv, cos, sin, cache.keys[i], cache.values[i], self.scale,
                                       window=layer.window, softcap=traits.attn_softcap)
            else:
                cos, sin = tables[layer.rope]
                # q and k heads sit side by side in the fused projection: rotate them in one go.
                qk = _rotate(qkv[:, : layer.q_size + layer.kv_size].view(-1, layer.num_heads + layer.num_kv_heads, layer.head_dim), cos, sin)
                q, k = qk.split([layer.num_heads, layer.num_kv_heads], dim=1)
                v = qkv[:, layer.q_size + layer.kv_size :].view(-1, layer.num_kv_heads, layer.head_dim)
                out = attn.attend(q, k, v, cache.keys[i], cache.values[i], self.scale,
                                  window=layer.window, softcap=traits.attn_softcap)  # [T, q_size]
            a = layer.o(out)
            if layer.attn_out_norm is not None:
                a = ops.rms_norm_groups(a, [(0, 1, cfg.hidden_size, layer.attn_out_norm)], layer.eps)
            h = ops.add_rms_norm(x, a, layer.mlp_norm, layer.eps)
            act = ops.gated_activation(layer.gate_up(h), layer.intermediate, traits.activation)
            branch = layer.down(act)
            if layer.mlp_out_norm is not None:
                branch = ops.rms_norm_groups(branch, [(0, 1, cfg.hidden_size, layer.mlp_out_norm)], layer.eps)
        return ops.final_norm(x, branch, self.final_norm, cfg.rms_norm_eps)  # float32

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, argmax_rows: Sequence[bool] | None = None) -> torch.Tensor:
        """[N, hidden] (float32) -> [N, vocab] float32 logits.

        A head that runs in bfloat16 (on its blocks, quantized, or dense bfloat16) returns
        coarse logits (bfloat16 inputs and output, 0.125 apart between 16 and 32): enough to
        find the candidates, not to rank near-ties. The top ``REFINE_TOP`` candidates of each
        row are recomputed exactly in float32 from the head's exact rows (``Linear.rows``:
        the file's block values, the float32 copy of a head quantized on load, or the dense
        bfloat16 values), so greedy choices are the float32 product of the hidden state and
        those rows, whichever kernel the tick used. Only a float32 head is exact as it is.

        ``argmax_rows[i]``: row i is read for its largest logit alone (``SamplingParams.
        argmax_only``); such rows find their candidates with ``argmax_screen`` where the model
        has one (``--argmax-screen``), the rest of the row staying its coarser values. A row's
        logits depend on its own flag only, never on the rows beside it.
        """
        screen = self.argmax_screen
        if screen is None or argmax_rows is None or not any(argmax_rows):
            return self._head_logits(hidden, self.lm_head)
        if all(argmax_rows):
            return self._head_logits(hidden, screen)
        screened = torch.tensor(argmax_rows, dtype=torch.bool)
        logits = torch.empty(hidden.shape[0], self.config.vocab_size, dtype=torch.float32)
        logits[screened] = self._head_logits(hidden[screened], screen)
        logits[~screened] = self._head_logits(hidden[~screened], self.lm_head)
        return logits

    def _head_logits(self, hidden: torch.Tensor, coarse_head: Linear) -> torch.Tensor:
        """``logits`` with the coarse pass on ``coarse_head`` (the head, or its screen) and
        the refinement from the head's exact rows."""
        head = self.lm_head
        cap = self.config.traits.final_softcap
        if coarse_head is head and head.quantized is None and head.dense.dtype == torch.float32:
            logits = F.linear(hidden.float(), head.dense)
        else:
            # [N, vocab]: its kernel, or its dense weight, in bfloat16; widened, with each row's candidates
            coarse, top = self.ops.top_logits(coarse_head(hidden), REFINE_TOP)  # [N, vocab] float32, [N, R]
            rows = head.rows(top.flatten()).view(*top.shape, -1)  # [N, R, hidden]
            logits = self.ops.refine_logits(coarse, top, hidden, rows)  # the candidates exact
        if cap:  # monotonic: the refined candidates stay the top ones
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.inference_mode()
    def exact_logits(self, hidden: torch.Tensor, block: int = 8192) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32: every logit exact, the float32 product of each
        row with every row of the head (``block`` head rows read at a time), where
        ``logits`` refines only each row's top candidates of a bfloat16 head (its coarse
        tail moved a row's normaliser by up to ~0.01)."""
        h = hidden.float()
        vocab = self.config.vocab_size
        out = torch.empty(h.shape[0], vocab, dtype=torch.float32)
        for start in range(0, vocab, block):
            end = min(start + block, vocab)
            torch.matmul(h, self.lm_head.rows(torch.arange(start, end)).T, out=out[:, start:end])
        cap = self.config.traits.final_softcap
        return torch.tanh(out / cap) * cap if cap else out


def _softcapped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                          cap: float) -> torch.Tensor:
    """Attention with scores -> cap * tanh(scores / cap) before the softmax (Gemma 2), in
    float32. q [B, kvh, R, d]; k, v [B, kvh, L, d]; mask [.., R, L] bool (True: seen)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v.float()).to(q.dtype)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
               cap: float) -> torch.Tensor:
    if cap:
        return _softcapped_attention(q, k, v, mask, scale, cap)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the Hugging Face (rotate-half) layout. x: [T, heads, head_dim].

    rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1.., +1..]; the signs live in
    ``signed_sin``. Three ops instead of seven: at one decode row each op is mostly
    dispatch, and this runs once per layer.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


class _AttentionPlan:
    """Index tensors and the masks for one forward, shared by every layer."""

    def __init__(self, batch: RaggedBatch, cfg: LlamaConfig, dtype: torch.dtype, attention_library: ctypes.CDLL | None,
                 block_size: int, *, need_torch: bool = True):
        """``attention_library``: our kernel, for the layers that run it (None: none do);
        ``block_size``: the cache's positions per block; ``need_torch``: whether some layer
        runs the torch path (``attend``)."""
        self.num_seqs = len(batch.block_tables)
        self.group = cfg.group_size
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.starts = batch.starts
        self.num_new = batch.num_new
        self.kv_len = max(s + n for s, n in zip(batch.starts, batch.num_new, strict=True))
        self.max_new = max(batch.num_new)
        total = sum(batch.num_new)
        # Each sequence's table cut to the blocks this forward reaches, padded with block 0
        # (never read: a row reads only its own positions) to one width.
        width = -(-self.kv_len // block_size)
        rows = [list(t[: -(-(s + n) // block_size)]) for t, s, n in zip(batch.block_tables, batch.starts, batch.num_new, strict=True)]
        self.tables = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32)  # [B, width]
        self.single = self.num_seqs == 1
        seq_of_token = (torch.zeros(total, dtype=torch.long) if self.single
                        else torch.repeat_interleave(torch.arange(self.num_seqs), torch.tensor(batch.num_new)))
        self._seq_of_token = seq_of_token
        self._block_size = block_size
        self.positions = batch.positions
        self.layout = TreeLayout.of(batch)
        self._masks: dict[int, torch.Tensor | None] = {}  # by window (0: none)
        # bfloat16: our row-by-row kernel (kernels/attention_x86.c), so that a position's
        # attention does not depend on the rows beside it; it needs no mask or padding.
        self.ours = attention_library is not None
        if self.ours:
            self.library = attention_library
            self.row_seq = seq_of_token.to(torch.int32).contiguous()
            if self.layout is None:
                self.row_len = (batch.positions + 1).to(torch.int32).contiguous()  # position p sees keys 0..p
                self.tree_rows = None
            else:
                self.row_len = self.layout.row_len
                self.tree_rows = self.layout.tree_rows(batch.positions)
            self.num_heads = cfg.num_heads
            self.q_scratch = torch.empty(total, cfg.num_heads, cfg.head_dim, dtype=dtype)  # shared by the layers
        if not need_torch:
            return
        self.gather_tables = self.tables.long()
        if self.single:
            return
        # Row of each token in the padded [B * max_new] query layout.
        offsets = torch.tensor([0] + list(batch.num_new[:-1])).cumsum(0)
        within = torch.arange(total) - offsets[self._seq_of_token]
        self.pad_index = self._seq_of_token * self.max_new + within  # [T]

    @functools.cached_property
    def _write_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each new token's key and value go (its position, or a tree node's slot), as
        (block, offset) [T] each: for the paths that write from Python (a forward plan's
        kernel computes them itself, so a plan's forward never makes these)."""
        slots = self.layout.slots.long() if self.layout is not None else self.positions
        return self.tables[self._seq_of_token, slots // self._block_size].long(), slots % self._block_size

    @property
    def write_blocks(self) -> torch.Tensor:
        return self._write_slots[0]

    @property
    def write_offsets(self) -> torch.Tensor:
        return self._write_slots[1]

    def mask(self, window: int) -> torch.Tensor | None:
        """The mask of the folded query rows (True: seen), made once per window per forward:
        query at position p sees keys <= p, and with a window only those > p - window."""
        if window not in self._masks:
            self._masks[window] = self._make_mask(window)
        return self._masks[window]

    def _make_mask(self, window: int) -> torch.Tensor | None:
        if self.layout is not None:
            return self._tree_mask(window)
        key_pos = torch.arange(self.kv_len)  # [L]
        if self.single:
            n, start = self.num_new[0], self.starts[0]
            if n == 1 and (not window or self.kv_len <= window):
                return None  # a decode step sees every key
            q_pos = start + torch.arange(n)[:, None]  # [n, 1]
            allowed = key_pos[None, :] <= q_pos
            if window:
                allowed &= key_pos[None, :] > q_pos - window
            return allowed.repeat_interleave(self.group, dim=0)  # [n * group, L]
        starts, num_new = torch.tensor(self.starts), torch.tensor(self.num_new)
        # Query t of sequence b (absolute position starts[b] + t) sees keys <= its position;
        # a padding row (t >= num_new[b]) sees what the sequence's last row sees.
        q_pos = starts[:, None] + torch.arange(self.max_new)[None, :]  # [B, max_new]
        limit = torch.minimum(q_pos, starts[:, None] + num_new[:, None] - 1)
        allowed = key_pos[None, None, :] <= limit[:, :, None]  # [B, max_new, L]
        if window:
            allowed &= key_pos[None, None, :] > limit[:, :, None] - window
        # [B, 1, max_new * group, L] matching the folded query rows.
        return allowed.repeat_interleave(self.group, dim=1).unsqueeze(1)

    def _tree_mask(self, window: int) -> torch.Tensor:
        """``_make_mask`` for a forward with draft trees: each row sees ``[0, row_len)`` (in
        its window, by its RoPE position), then its extra positions (``TreeLayout``)."""
        layout = self.layout
        assert layout is not None
        key_pos = torch.arange(self.kv_len)
        allowed = key_pos[None, :] < layout.row_len[:, None].long()  # [T, L]
        if window:
            allowed &= key_pos[None, :] > self.positions[:, None] - window
        rows = torch.repeat_interleave(torch.arange(len(layout.row_len)), layout.extra_start.diff().long())
        allowed[rows, layout.extra.long()] = True
        if self.single:
            return allowed.repeat_interleave(self.group, dim=0)  # [n * group, L]
        padded = allowed.new_zeros(self.num_seqs * self.max_new, self.kv_len)
        padded[self.pad_index] = allowed
        padding = torch.ones(len(padded), dtype=torch.bool)
        padding[self.pad_index] = False
        padded[padding, 0] = True  # a padding row (its output is dropped) sees one key: no empty softmax
        return padded.view(self.num_seqs, self.max_new, -1).repeat_interleave(self.group, dim=1).unsqueeze(1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, scale: float, *, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        """The torch path (SDPA, or an explicit softmax with ``softcap``): where our kernel
        does not run (it has ``rope_attend``). q: [T, heads, d]; k, v: [T, kv_heads, d];
        ``window``: keys seen per query (0: all). Writes k/v, returns [T, heads * d]."""
        g, kvh, d = self.group, self.num_kv_heads, self.head_dim
        mask = self.mask(window)
        self._write(k, v, k_cache, v_cache)
        keys = gather(k_cache, self.gather_tables, self.kv_len)  # [B, kvh, L, d]
        values = gather(v_cache, self.gather_tables, self.kv_len)
        if self.single:
            n = self.num_new[0]
            if n == 1:  # a decode step: the folded layout is q's own memory layout, no copies
                out = _attention(q.view(1, kvh, g, d), keys, values, mask, scale, softcap)
                return out.reshape(1, kvh * g * d)
            # [n, kvh * g, d] -> [1, kvh, n * g, d]: query heads of a KV group become rows.
            queries = q.view(n, kvh, g, d).permute(1, 0, 2, 3).reshape(1, kvh, n * g, d)
            out = _attention(queries, keys, values, mask, scale, softcap)
            return out.view(kvh, n, g, d).permute(1, 0, 2, 3).reshape(n, kvh * g * d)
        b, m = self.num_seqs, self.max_new
        padded = q.new_zeros(b * m, kvh * g, d)
        padded[self.pad_index] = q
        queries = padded.view(b, m, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, m * g, d)
        out = _attention(queries, keys, values, mask, scale, softcap)
        out = out.view(b, kvh, m, g, d).permute(0, 2, 1, 3, 4).reshape(b * m, kvh * g * d)
        return out[self.pad_index]

    def rope_attend(self, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, scale: float, *, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        """Our kernel only: RoPE on the fused projection's q and k, the cache write and the
        attention in one call (``attention_cpu.paged_rope_write_attention``; ``window`` and
        ``softcap`` as ``attend`` takes them). -> [T, heads * d]"""
        return attention_cpu.paged_rope_write_attention(self.library, qkv, cos, signed_sin, k_cache, v_cache, self.tables,
                                                        self.row_seq, self.row_len, self.num_heads, scale, self.q_scratch,
                                                        window=window, softcap=softcap, tree=self.tree_rows)

    def _write(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """This forward's keys and values into their blocks (k, v: [T, kv_heads, d])."""
        k_cache[self.write_blocks, :, self.write_offsets] = k
        v_cache[self.write_blocks, :, self.write_offsets] = v
