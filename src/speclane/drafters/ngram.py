"""Prompt-lookup drafting: propose what followed the last time the recent tokens appeared.

Searches, longest n-gram first, for the request's last ``n`` tokens earlier in its
own tokens (prompt + output) and in its ``prediction`` (OpenAI Predicted Outputs),
and proposes up to ``k`` tokens that followed the most recent match. Deterministic:
its draft distribution is one-hot, so verification needs no draft probabilities.

Resync (``resync_ngram``): a copy often differs from its source by one inserted token
("In winter, the storms" for "In winter the storms"). Then no n-gram ending at the newest
token matches, but the ``resync_ngram``+ tokens before it do, and what followed them in the
source is what the copy goes on with; without it, the copy decodes classically until two
new tokens match again. Off by default: on the drafts set's tuning half
(``benchmarks/tune_drafters.py --drafter ngram``) the resynchronised drafts were wrong
often enough that their verify rows cost more than they saved (estimated geomean 1.40x
with ``resync_ngram`` 3, 1.43x without; every category as high or higher without).
"""

from __future__ import annotations

from speclane.drafters.base import Draft
from speclane.request import Request


class NgramDrafter:
    name = "ngram"
    needs_hidden_states = False

    # min_ngram 2: a single repeated token is a poor predictor (4% acceptance on chat) and a
    # rejected round costs a verify; two matching tokens are worth a proposal.
    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, search_window: int = 4096, resync_ngram: int = 0):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram; got {min_ngram}, {max_ngram}")
        if resync_ngram and not 2 <= resync_ngram <= max_ngram:  # one matching token is chance
            raise ValueError(f"need resync_ngram 0 (off) or in 2..max_ngram; got {resync_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.search_window = search_window  # bound the per-round cost on long contexts
        self.resync_ngram = resync_ngram  # shortest match before an inserted token that resyncs; 0: never

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:  # its state is cheap
        if k <= 0:
            return Draft([])
        tokens = request.token_ids()[-self.search_window :]
        # The part of the prediction near where the output is now (the output follows it
        # roughly in order), so a long prediction costs no more than a long context.
        done = request.num_output_tokens
        prediction = request.prediction_token_ids[max(0, done - self.search_window // 2) : done + self.search_window // 2]
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            found = _lookup(prediction, tokens, tokens[-n:], k, len(tokens) - 1)
            if found:
                return Draft(found)
        # No match ends at the newest token: was it inserted into a copy? (module docstring)
        if not self.resync_ngram:
            return Draft([])
        for n in range(min(self.max_ngram, len(tokens) - 2), self.resync_ngram - 1, -1):
            found = _lookup(prediction, tokens, tokens[-n - 1 : -1], k, len(tokens) - 2)
            if found:
                return Draft(found)
        return Draft([])

    def finish(self, request: Request) -> None:  # learns nothing from finished requests
        return None

    def release(self, request_id: str) -> None:  # stateless
        return None


def _lookup(prediction: tuple[int, ...], tokens: tuple[int, ...], pattern: tuple[int, ...], k: int,
            history_limit: int) -> list[int]:
    """What followed ``pattern``: in the prediction (the text the user expects) first, then
    in the request's own tokens, where the pattern must end before ``history_limit``."""
    return _follow(prediction, pattern, k, len(prediction)) or _follow(tokens, pattern, k, history_limit)


def _follow(haystack: tuple[int, ...], pattern: tuple[int, ...], k: int, limit: int) -> list[int]:
    """Tokens after the last occurrence of ``pattern`` ending before ``limit``."""
    n = len(pattern)
    last = pattern[-1]
    end = min(limit, len(haystack))
    # Scan backwards for the pattern's last token, then check the rest.
    i = end - 1
    while i >= n - 1:
        if haystack[i] == last and tuple(haystack[i - n + 1 : i + 1]) == pattern:
            follow = haystack[i + 1 : i + 1 + k]
            if follow:
                return list(follow)
        i -= 1
    return []
