"""The MTP draft head: one transformer block on the target's own hidden states.

DeepSeek-V3-style multi-token prediction, drafted recursively (as in FastMTP):

    entry p:  x = fc([norm(h_p) ; norm(embed(token_{p+1}))])      h_p: the target's final hidden at p
              o_p = block(x)  (causal attention over earlier entries, RoPE at position p)
              logits of token_{p+2} = head(final_norm(o_p))

``h_p`` comes from the target for every position it has computed. To draft K tokens
after the last computed position t, entry t gives draft 1; entry t+1 is built from
``o_t`` in place of the target's (not yet computed) ``h_{t+1}`` and the draft token,
and gives draft 2; and so on, with the same weights.

The output head is the target's own (tied) head restricted to the ``draft_vocab``
most frequent tokens of the training text: drafting a token over 8k rows instead of
49k is what makes a draft cheap next to a target step on a 135M model.

The block's own KV cache (``MTPCache``) holds the entries of computed positions; it
survives between rounds so each round only adds the positions verified since.

``MTPHead`` is the torch reference, in float32: what ``speclane train-mtp`` trains, what the
tests compare against, and how a head drafts for a target that runs none of our kernels.
A head drafting for a target on our kernels runs ``mtp_kernel_step.KernelHead`` over it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MTPConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    draft_vocab: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    window: int = 256  # entries the block attends to (older ones are dropped)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class StepOutput:
    """A draft step: the block's outputs of its new entries, and the last one's draft logits."""

    out: torch.Tensor  # [n, H] float32
    best: int  # the index of the logits' maximum (the first of equal maxima)
    logits: torch.Tensor | None = None  # [draft_vocab] float32, where the caller asked for them


@dataclass
class MTPCache:
    """One request's block K/V: entries for positions ``[first, first + len)``."""

    keys: torch.Tensor  # [n, kv_heads, head_dim]
    values: torch.Tensor
    first: int = 0

    @property
    def end(self) -> int:
        return self.first + self.keys.shape[0]

    def truncate(self, end: int) -> None:
        keep = max(0, end - self.first)
        self.keys, self.values = self.keys[:keep], self.values[:keep]

    def keep_last(self, window: int) -> None:
        """Drop entries older than the attention window."""
        drop = max(0, self.keys.shape[0] - window)
        self.first += drop
        self.keys, self.values = self.keys[drop:], self.values[drop:]

    @classmethod
    def empty(cls, config: MTPConfig, first: int) -> MTPCache:
        shape = (0, config.num_kv_heads, config.head_dim)
        return cls(torch.zeros(shape), torch.zeros(shape), first)


class MTPHead(nn.Module):
    def __init__(self, config: MTPConfig):
        super().__init__()
        self.config = config
        h, i = config.hidden_size, config.intermediate_size
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.embed_norm = nn.Parameter(torch.ones(h))
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(h, q + 2 * kv, bias=False)
        self.o = nn.Linear(q, h, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * i, bias=False)
        self.down = nn.Linear(i, h, bias=False)
        self.final_norm = nn.Parameter(torch.ones(h))
        # Draft vocabulary: token ids of the head's rows (saved with the head).
        self.register_buffer("vocab_ids", torch.zeros(config.draft_vocab, dtype=torch.long))
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cos_table: torch.Tensor | None = None  # drafting's rotation tables (``_rotation``)
        self._sin_table: torch.Tensor | None = None
        # Shared with the target, never trained or saved: its embedding and head rows.
        self.embed: torch.Tensor | None = None  # [vocab, hidden]
        self.head_weight: torch.Tensor | None = None  # [draft_vocab, hidden]

    def attach_target(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Share the target's (frozen, float32) embedding and output head."""
        self.embed = embed.float()
        self.head_weight = head.float()[self.vocab_ids]

    def new_cache(self, first: int) -> MTPCache:
        """An empty cache whose first entry will be position ``first``."""
        return MTPCache.empty(self.config, first)

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "head":
            return x @ self.head_weight.T
        return getattr(self, name)(x)

    # -- pieces ---------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # float32 (under training's bfloat16 autocast x may be bfloat16; the norm is not).
        return F.rms_norm(x.float(), (x.shape[-1],), weight, self.config.rms_norm_eps)

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        """[..., T] -> float32 rotation angles [..., T, d] (computed in float64, then rounded)."""
        angles = positions.double()[..., None] * self.inv_freq
        return torch.cat([angles, angles], dim=-1).float()

    def _rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [..., T, 1, d] at ``positions``. Drafting reads them from a table
        that grows by doubling (the same float32 values as computing them each time)."""
        if torch.is_grad_enabled() or self.training:
            angles = self._angles(positions).unsqueeze(-2)
            return angles.cos(), angles.sin()
        needed = int(positions.max()) + 1
        if self._cos_table is None or self._cos_table.shape[0] < needed:
            size = max(needed, 2 * (0 if self._cos_table is None else self._cos_table.shape[0]), 1024)
            angles = self._angles(torch.arange(size, device=positions.device))
            self._cos_table, self._sin_table = angles.cos(), angles.sin()
        return self._cos_table[positions].unsqueeze(-2), self._sin_table[positions].unsqueeze(-2)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [..., T, heads, d] rotated at ``positions`` [..., T] (rotate-half layout)."""
        cos, sin = self._rotation(positions)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def inputs(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Entry inputs from hidden states [..., H] and the ids of the tokens after them."""
        e = F.embedding(next_tokens, self.embed)
        return self._linear("fc", torch.cat([self._norm(hidden, self.hidden_norm), self._norm(e, self.embed_norm)], dim=-1))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [.., T, heads, d], k and v [.., T, kv_heads, d] of entry inputs x [.., T, H]."""
        cfg = self.config
        d = cfg.head_dim
        qkv = self._linear("qkv", self._norm(x, self.attn_norm))
        q, k, v = qkv.split([cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d], dim=-1)
        q = self._rope(q.unflatten(-1, (cfg.num_heads, d)), positions)
        k = self._rope(k.unflatten(-1, (cfg.num_kv_heads, d)), positions)
        return q, k, v.unflatten(-1, (cfg.num_kv_heads, d))

    def finish(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention of q [.., T, heads, d] over keys/values [.., S, kv, d] (mask [T, S] or
        [.., T, S], True = may attend), then the MLP: the block's output [.., T, H]."""
        group = self.config.num_heads // self.config.num_kv_heads
        qh = q.transpose(-3, -2)  # [.., heads, T, d]
        kh = keys.transpose(-3, -2).repeat_interleave(group, dim=-3)
        vh = values.transpose(-3, -2).repeat_interleave(group, dim=-3)
        if mask.dim() == 3:
            mask = mask[:, None]
        attn = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=1.0 / math.sqrt(self.config.head_dim))
        return self._after_attention(x, attn.transpose(-3, -2).flatten(-2))

    def _after_attention(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The output projection and the MLP, with their residuals: the block's output."""
        x = x + self._linear("o", attn)
        h = self._norm(x, self.mlp_norm)
        gate, up = self._linear("gate_up", h).chunk(2, dim=-1)
        return x + self._linear("down", F.silu(gate) * up)

    def _attend_new(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Attention of the n newest entries' q [n, heads, d] over all S entries' keys and
        values [S, kv_heads, d], each new entry seeing the entries up to itself: [n, heads * d].

        ``finish``'s computation for one request, without its general machinery: the query
        heads of a kv group become rows of one matrix product (no repeated K/V, no mask
        tensor for SDPA's fallback path), so a draft step's attention is two small bmm's."""
        n, heads, d = q.shape
        kv_heads, group, total = keys.shape[1], heads // keys.shape[1], keys.shape[0]
        qg = q.reshape(n, kv_heads, group, d).permute(1, 0, 2, 3).reshape(kv_heads, n * group, d)
        scores = torch.bmm(qg, keys.permute(1, 2, 0)) * (1.0 / math.sqrt(d))  # [kv, n * group, S]
        if n > 1:  # entry i (query rows i * group ..) may not see the entries after it
            later = torch.arange(total)[None, :] > (total - n + torch.arange(n))[:, None]  # [n, S]
            scores = scores.masked_fill(later.repeat_interleave(group, dim=0), float("-inf"))
        out = torch.bmm(torch.softmax(scores, dim=-1), values.transpose(0, 1))  # [kv, n * group, d]
        return out.reshape(kv_heads, n, group, d).permute(1, 0, 2, 3).reshape(n, heads * d)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Block outputs [.., H] -> logits over the draft vocabulary [.., draft_vocab]."""
        return self._linear("head", self._norm(out, self.final_norm))

    @torch.inference_mode()
    def logits_of(self, out: torch.Tensor) -> StepOutput:
        """The draft logits of the last of the block outputs ``out`` [n, H], and their argmax."""
        logits = self.draft_logits(out[-1:])[0]
        return StepOutput(out, int(torch.argmax(logits)), logits)

    @torch.inference_mode()
    def step(self, cache: MTPCache, hidden: torch.Tensor, next_tokens: list[int],
             want_logits: bool = True) -> StepOutput:
        """A draft step: ``extend`` the cache by the positions after ``cache.end`` (hidden
        states [n, H] and the tokens after them), then ``logits_of`` the new entries.
        ``want_logits``: the drafter's interface (``KernelHead.step`` may skip the logits'
        copy); here they come at no extra cost."""
        positions = torch.arange(cache.end, cache.end + hidden.shape[0])
        return self.logits_of(self.extend(cache, hidden, torch.tensor(next_tokens), positions))

    def draft_greedy(self, cache: MTPCache, hidden: torch.Tensor, next_tokens: list[int],
                     k: int) -> tuple[list[int], float] | None:
        """A greedy round in one call: the drafter's interface (``KernelHead.draft_greedy``);
        the torch reference has none, so None: the drafter drafts step by step."""
        return None

    # -- inference: extend one request's cache -------------------------------------------
    @torch.inference_mode()
    def extend(self, cache: MTPCache, hidden: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Add entries for ``positions`` (consecutive, starting at ``cache.end``); returns o [n, H].

        The cache grows; the caller trims it to the window (``keep_last``) once a round's
        speculative entries are gone, so drafting never pushes true entries out.
        """
        x = self.inputs(hidden, next_tokens)
        q, k, v = self.project(x, positions)
        cache.keys = torch.cat([cache.keys, k])
        cache.values = torch.cat([cache.values, v])
        # Entry i (position end + i) sees every cached entry and new entries <= i.
        return self._after_attention(x, self._attend_new(q, cache.keys, cache.values))
