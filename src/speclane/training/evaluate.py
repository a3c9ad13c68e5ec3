"""Held-out acceptance of an MTP head, measured the way the engine drafts.

On a held-out sample (the target's own greedy text), speculation is replayed round by
round: the head catches up on the true positions and drafts K tokens with
``catch_up_and_draft`` (the drafter's own code), and the drafts are checked against
the text — which is what greedy verification would accept, since the text *is* the
target's greedy output. The next round starts after the accepted tokens plus the
target's own token.
"""

from __future__ import annotations

import torch

from speclane.drafters.mtp import catch_up_and_draft
from speclane.models.mtp_head import MTPHead
from speclane.training.samples import Sample


@torch.inference_mode()
def acceptance_report(head: MTPHead, samples: list[Sample], num_draft_tokens: int, min_draft_prob: float = 0.0) -> dict:
    k = num_draft_tokens
    tried = [0] * k
    accepted = [0] * k
    rounds = 0
    total_accepted = 0
    for s in samples:
        tokens = s.token_ids
        n_pos = s.hidden.shape[0]  # positions with hidden states: 0 .. n_pos - 1
        last = s.num_prompt_tokens - 1  # the first round drafts after the prompt
        cache = head.new_cache(0)
        hidden = s.hidden.float()
        while last + 2 < len(tokens) and last < n_pos:
            run = catch_up_and_draft(head, cache, hidden[cache.end : last + 1], tokens, k, min_draft_prob)
            a = 0
            for j, token in enumerate(run.token_ids):
                if last + 2 + j >= len(tokens):
                    break
                tried[j] += 1
                if token != tokens[last + 2 + j]:
                    break
                accepted[j] += 1
                a += 1
            rounds += 1
            total_accepted += a
            last += a + 1
    per_position = [round(accepted[j] / tried[j], 3) if tried[j] else 0.0 for j in range(k)]
    return {
        "num_draft_tokens": k,
        "acceptance_per_position": per_position,
        "mean_accepted": total_accepted / max(rounds, 1),
        "tokens_per_round": (total_accepted + rounds) / max(rounds, 1),
        "rounds": rounds,
    }
