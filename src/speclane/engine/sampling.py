"""Sampling and lossless verification of draft tokens.

Randomness is a function of (request seed, token position) only: the noise used to
sample the token at position ``i`` of a request is drawn from a generator seeded
with ``mix(seed, i)``. So a request's output never depends on which other requests
share its batch, nor on whether it decoded classically or inside a speculative round.

Sampling uses the exponential race (``argmax p / E`` with ``E ~ Exp(1)``), the same
distribution as multinomial sampling from ``p`` but a pure function of the noise.

Verification (docs/design.md, "Losslessness"):
- a deterministic drafter (n-gram: draft probability q is one-hot) — accept a draft
  token while it equals the token the target samples (or its argmax when greedy) at
  that position, then emit the target's own token there. Equivalent in distribution
  to the rejection rule with one-hot q (accept x with probability p(x), else sample
  from p without x), and token-for-token identical to classic decoding.
- a draft tree (deterministic drafts only, ``draft_tree.py``): the same walk from the
  root, following at each node the child that holds the target's token; each row's token
  is drawn with the noise of its depth's position, so the output is again token for
  token classic decoding's.
- a drafter with probabilities q (MTP): accept x with probability min(1, p(x)/q(x));
  on rejection sample from max(p - q, 0) renormalised; if all K are accepted, sample
  a bonus token from p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speclane import draft_tree
from speclane.request import SamplingParams

_MASK64 = (1 << 64) - 1


def _mix(seed: int, position: int, stream: int = 0) -> int:
    """splitmix64 of (seed, position, stream) -> a 63-bit generator seed."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + stream * 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def _uniform(seed: int, position: int, size: int, stream: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_mix(seed, position, stream))
    return torch.rand(size, generator=gen, dtype=torch.float32)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[N, V] float32 logits -> [N, V] the distribution we sample from (temperature, top-k,
    top-p, min-p)."""
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)  # keep the smallest nucleus
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.min_p > 0.0:
        floor = params.min_p * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < floor, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_at(probs: torch.Tensor, seed: int, position: int) -> int:
    """One token from ``probs`` [V] with the noise of ``position``."""
    # Exp(1) noise. torch.rand draws multiples of 2**-24 from [0, 1), so u = 0 comes up
    # about once in 17 million draws (a few times per thousand 49k-token rows): it would
    # make E = 0 and p / E infinite, or NaN where p = 0 (a token the grammar forbids),
    # which argmax then picks. u = 0 stands for its bin [0, 2**-24): take the bin's middle.
    uniform = _uniform(seed, position, probs.shape[-1]).clamp_min_(2.0**-25)
    exp_noise = -torch.log1p(-uniform)
    return int(torch.argmax(probs / exp_noise))


@dataclass
class Verdict:
    token_ids: list[int]  # accepted drafts + the target's own next token
    num_accepted: int
    path: list[int] | None = None  # the accepted drafts' indices in the draft (None: 0 .. num_accepted - 1)

    def __post_init__(self) -> None:
        if self.path is None:
            self.path = list(range(self.num_accepted))


def choose_tokens(
    logits: torch.Tensor,  # [n, V] float32: target logits at the n positions fed for sampling
    params: SamplingParams,
    seed: int,
    first_position: int,  # sequence index of the token sampled from logits[0]
    draft: list[int],  # n - 1 draft tokens (empty for a classic step)
    draft_probs: torch.Tensor | None = None,  # [n - 1, V] the drafter's q, or None (one-hot)
    argmax: list[int] | None = None,  # greedy: the n rows' argmax, if the caller took it for a whole tick
    parents: tuple[int, ...] | None = None,  # a draft tree's parents (draft_tree.py), or None: a chain
) -> Verdict:
    """Verify ``draft`` against the target and return the tokens to append. Row 0 of
    ``logits`` is the last fed token's, row j + 1 draft token j's."""
    if draft_probs is not None and draft:
        if parents is not None:
            raise ValueError("a draft tree must be deterministic (no draft probabilities)")
        return _rejection_rule(probabilities(logits, params), draft, draft_probs, seed, first_position)
    greedy = params.greedy
    if greedy:
        targets = argmax if argmax is not None else torch.argmax(logits, dim=-1).tolist()
    else:
        probs = probabilities(logits, params)

    def target(row: int, depth: int) -> int:
        return targets[row] if greedy else sample_at(probs[row], seed, first_position + depth)

    path, tokens = draft_tree.accept(draft, parents, target)
    return Verdict(tokens, len(path), path)


def _rejection_rule(probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor, seed: int, first_position: int) -> Verdict:
    # p: target, q: draft. q(x) >= p(x) is accepted with probability p/q; otherwise always.
    for i, token in enumerate(draft):
        p_x = float(probs[i, token])
        q_x = float(draft_probs[i, token])
        u = float(_uniform(seed, first_position + i, 1, stream=1))
        if q_x > 0 and u < min(1.0, p_x / q_x):
            continue
        residual = (probs[i] - draft_probs[i]).clamp(min=0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else probs[i]
        return Verdict(draft[:i] + [sample_at(residual, seed, first_position + i)], i)
    bonus = sample_at(probs[len(draft)], seed, first_position + len(draft))
    return Verdict(list(draft) + [bonus], len(draft))
