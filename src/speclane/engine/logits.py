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
3. the grammar's mask sets every token it does not allow at that position to -inf;
4. ``min_tokens``: a row whose token would come before the answer holds that many tokens
   may not choose a stop token (end-of-sequence, unless ``ignore_eos``, and
   ``stop_token_ids``), except where the grammar allows nothing else (its end wins).

A row is processed identically whether it is a decode step or a verified draft
position, so constrained outputs stay identical with speculation on and off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from speclane.grammar.matcher import GrammarMatcher
from speclane.request import SamplingParams, TokenLogprob


@dataclass(frozen=True)
class HeldStops:
    """``min_tokens`` for one round: the stop tokens and how many of its first rows may not
    choose them."""

    token_ids: tuple[int, ...]
    num_rows: int

    @staticmethod
    def of(params: SamplingParams, eos_token_ids: Iterable[int], num_output: int) -> HeldStops | None:
        """For a request with ``num_output`` tokens so far (row i chooses token ``num_output + i``);
        None where no row is held."""
        stops = tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(sorted(eos_token_ids)))
        num_rows = params.min_tokens - num_output
        return HeldStops(stops, num_rows) if num_rows > 0 and stops else None


def constrain(rows: torch.Tensor, params: SamplingParams, matcher: GrammarMatcher | None,
              draft: list[int], history: TokenHistory | None = None, held: HeldStops | None = None) -> None:
    """Apply bias, penalties and masks in place to ``rows`` [len(draft) + 1, V], row i
    continuing the request's tokens (``history``, up to date: needed where ``params``
    penalise) and then ``draft[:i]`` (a chain)."""
    if params.logit_bias:
        ids = torch.tensor([token for token, _ in params.logit_bias], dtype=torch.long)
        bias = torch.tensor([value for _, value in params.logit_bias], dtype=rows.dtype)
        rows[:, ids] += bias
    if params.penalized:
        if history is None:
            raise ValueError("penalties need the request's token history")
        penalize(rows, params, history, draft)
    if matcher is not None:
        rows.masked_fill_(~matcher.masks(draft), float("-inf"))
    if held is not None:
        hold_stops(rows, held, grammar=matcher is not None)


def hold_stops(rows: torch.Tensor, held: HeldStops, *, grammar: bool) -> None:
    """Mask the stop tokens out of the first ``held.num_rows`` rows; where a grammar has
    left a row nothing but stops, the row keeps them (an answer the grammar ends)."""
    ids = torch.tensor(held.token_ids, dtype=torch.long)
    for row in rows[: held.num_rows]:
        kept = row[ids].clone()
        row[ids] = float("-inf")
        if grammar and not torch.isfinite(row).any():
            row[ids] = kept


class TokenHistory:
    """A penalised request's tokens over the whole vocabulary, kept up to date a tick at a
    time (``update``), so a long prompt is read once, not at every tick: ``seen`` marks the
    prompt's and the output's tokens (the repetition penalty), ``counts`` the output's
    (presence and frequency)."""

    def __init__(self, vocab_size: int) -> None:
        self.seen = torch.zeros(vocab_size, dtype=torch.bool)
        self.counts = torch.zeros(vocab_size, dtype=torch.float32)
        self._num_prompt: int | None = None
        self._num_output = 0

    def update(self, prompt: Sequence[int], output: Sequence[int]) -> TokenHistory:
        """Take in what is new since the last call (the output only grows while it runs)."""
        if self._num_prompt is None:
            self.seen[torch.tensor(list(prompt), dtype=torch.long)] = True
            self._num_prompt = len(prompt)
        new = output[self._num_output:]
        if new:
            ids = torch.tensor(list(new), dtype=torch.long)
            self.seen[ids] = True
            self.counts.index_add_(0, ids, torch.ones(len(ids)))
            self._num_output = len(output)
        return self


def penalize(rows: torch.Tensor, params: SamplingParams, history: TokenHistory, draft: list[int]) -> None:
    """The penalties in place: every row pays for ``history``'s tokens, row i also for
    ``draft[:i]``. Each row's logit of a token is one float32 expression of that row's own
    mark or count of it, and a token the row does not pay for is left as it is (a later
    draft's, in an earlier row), the decode step's the same expression with no drafts, so
    row i equals, bit for bit, the row its decode step computes once ``draft[:i]`` is
    output. Only the tokens the history or the draft holds are read."""
    n = rows.shape[0]
    drafted = torch.tensor(draft[: n - 1], dtype=torch.long)
    if params.repetition_penalty != 1.0:
        ids, marks = _per_row(history.seen, drafted, n)
        p = params.repetition_penalty
        view = rows[:, ids]
        rows[:, ids] = torch.where(marks > 0, torch.where(view > 0, view / p, view * p), view)
    if params.presence_penalty or params.frequency_penalty:
        ids, counts = _per_row(history.counts, drafted, n)
        view = rows[:, ids]
        penalty = params.presence_penalty * (counts > 0).to(rows.dtype) + params.frequency_penalty * counts
        rows[:, ids] = torch.where(counts > 0, view - penalty, view)  # x - (-0.0) would turn -0.0 into +0.0


def _per_row(tally: torch.Tensor, drafted: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens ``tally`` (a vocabulary-wide mark or count) holds or the draft drafts,
    sorted, and [n, tokens]: each row's count of them, row i with ``drafted[:i]`` added."""
    ids = torch.unique(torch.cat([tally.nonzero().flatten(), drafted]))
    counts = tally[ids].to(torch.float32).expand(n, -1).clone()
    for j, column in enumerate(torch.searchsorted(ids, drafted).tolist()):
        counts[j + 1 :, column] += 1.0
    return ids, counts


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
