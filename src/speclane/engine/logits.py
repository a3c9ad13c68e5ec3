"""What happens to a sequence's logit rows between the forward and the choice of tokens.

In order, on the rows one sequence samples from (one per verified position of a round,
or the single decode row):
1. logprobs, if the request asks for them, are read from the raw rows: the model's own
   distribution, before bias, penalties, grammar or temperature (as vLLM reports them);
2. ``logit_bias`` is added; the repetition penalty divides (multiplies, where negative)
   the logits of the tokens in the prompt and the output, and the presence and frequency
   penalties are taken off for the tokens in the output; row i counts the first i drafts
   as output too (what it holds if they are accepted), so a verified position sees the
   penalties its decode step would;
3. the grammar's mask sets every token it does not allow at that position to -inf.

A row is processed identically whether it is a decode step or a verified draft
position, so constrained outputs stay identical with speculation on and off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclane.grammar.matcher import GrammarMatcher
from speclane.request import SamplingParams, TokenLogprob


def constrain(rows: torch.Tensor, params: SamplingParams, matcher: GrammarMatcher | None,
              draft: list[int], output: Sequence[int] = (), prompt: Sequence[int] = ()) -> None:
    """Apply bias, penalties and mask in place to ``rows`` [len(draft) + 1, V], row i
    continuing ``prompt``, ``output`` (the tokens generated so far) and then ``draft[:i]``
    (a chain)."""
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
        bias = torch.tensor([value for _, value in params.logit_bias], dtype=rows.dtype)
        rows[:, ids] += bias
    if params.repetition_penalty != 1.0:
        repeat_penalize(rows, params.repetition_penalty, [*prompt, *output], draft)
    if params.presence_penalty or params.frequency_penalty:
        penalize(rows, params.presence_penalty, params.frequency_penalty, output, draft)
    if matcher is not None:
        rows.masked_fill_(~matcher.masks(draft), float("-inf"))


def penalize(rows: torch.Tensor, presence: float, frequency: float, output: Sequence[int], draft: list[int]) -> None:
    """Take the penalties off ``rows`` in place: every row pays for the tokens in ``output``,
    row i also for ``draft[:i]``. Each row's penalty is one float32 expression of its own
    counts, the decode step's (no draft) included, so row i equals, bit for bit, the row
    its decode step would compute once ``draft[:i]`` is output."""
    draft = draft[: rows.shape[0] - 1]
    if not output and not draft:
        return
    ids, which = torch.unique(torch.tensor([*output, *draft], dtype=torch.long), return_inverse=True)
    counts = torch.bincount(which[: len(output)], minlength=len(ids)).to(rows.dtype).expand(rows.shape[0], -1).clone()
    for j, k in enumerate(which[len(output):].tolist()):
        counts[j + 1 :, k] += 1
    rows[:, ids] -= presence * (counts > 0).to(rows.dtype) + frequency * counts


def repeat_penalize(rows: torch.Tensor, penalty: float, seen: Sequence[int], draft: list[int]) -> None:
    """The repetition penalty in place: every row's logits of the tokens in ``seen``, row
    i's also of ``draft[:i]``, divided by ``penalty`` where positive, else multiplied."""
    def apply(view: torch.Tensor) -> torch.Tensor:
        return torch.where(view > 0, view / penalty, view * penalty)

    if seen:
        ids = torch.unique(torch.tensor(seen, dtype=torch.long))
        rows[:, ids] = apply(rows[:, ids])
    done = set(seen)
    for j, token in enumerate(draft[: rows.shape[0] - 1]):
        if token not in done:  # a token already penalised is not penalised twice
            rows[j + 1 :, token] = apply(rows[j + 1 :, token])
            done.add(token)


def token_logprobs(raw_rows: torch.Tensor, chosen: list[int], num_top: int) -> tuple[TokenLogprob, ...]:
    """Each chosen token's logprob and the ``num_top`` most likely tokens at its row."""
    logprobs = torch.log_softmax(raw_rows[: len(chosen)].float(), dim=-1)
    picked = logprobs[torch.arange(len(chosen)), torch.tensor(chosen, dtype=torch.long)].tolist()
    if num_top:
        values, ids = torch.topk(logprobs, num_top, dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    else:
        tops = [()] * len(chosen)
    return tuple(TokenLogprob(token, lp, top) for token, lp, top in zip(chosen, picked, tops, strict=True))
