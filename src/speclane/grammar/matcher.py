"""One request's grammar state: which tokens may come next, forced tokens, masks per draft position.

The runner owns one ``GrammarMatcher`` per constrained request (``engine/runner.py``):
- before a forward it trims the request's draft to the prefix the grammar allows and
  extends it with the tokens the grammar forces (``draft``);
- after the forward it masks every row it samples from with the mask of the state
  that row continues (``masks``: the state after the drafts before it), so a verified
  position is constrained exactly as in plain decoding;
- then it advances over the tokens kept (``consume``); rejected drafts never enter
  the state, because ``draft`` and ``masks`` walk a copy of it. (A copy, not consume
  and roll back: a draft may end with an end-of-sequence token, which llguidance
  cannot roll back.)
"""

from __future__ import annotations

import llguidance
import numpy as np
import torch


class GrammarMatcher:
    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._eos = eos_token_ids
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a consumed token it did not allow), else None."""
        return self._matcher.get_error() or None if self._matcher.is_error() else None

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete: only an end-of-sequence token may follow."""
        return self._matcher.is_stopped()

    def allowed(self) -> torch.Tensor:
        """[vocab] bool: the tokens allowed next (only end-of-sequence tokens once stopped).
        A matcher in an error state allows only end-of-sequence tokens too: the request
        ends rather than sampling from an empty distribution."""
        return _allowed(self._matcher, self._bits, self.vocab_size, self._eos)

    def masks(self, draft: list[int]) -> torch.Tensor:
        """[len(draft) + 1, vocab] bool: the allowed tokens at each verified position of a
        round drafting ``draft`` (row i: after the first i drafts). Leaves the state as it was."""
        rows = [self.allowed()]
        if draft:
            probe = self._matcher.deep_copy()  # not consume + rollback: an end-of-sequence draft cannot roll back
            for token in draft:
                if not probe.consume_token(token):
                    raise AssertionError(f"draft token {token} was not allowed by the grammar")
                rows.append(_allowed(probe, self._bits, self.vocab_size, self._eos))
        return torch.stack(rows)

    def draft(self, proposed: list[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens: the longest allowed prefix of ``proposed``, then the
        tokens the grammar forces from there. Leaves the state as it was."""
        kept = list(proposed[: self._matcher.validate_tokens(list(proposed[:k]))]) if proposed else []
        probe = self._matcher.deep_copy()
        if kept and not probe.consume_tokens(kept):
            raise AssertionError("validated draft tokens were refused")
        while len(kept) < k and not probe.is_stopped():
            forced = probe.compute_ff_tokens()[: k - len(kept)]
            if not forced or not probe.consume_tokens(forced):
                break
            kept.extend(forced)
        return kept

    def consume(self, tokens: list[int] | tuple[int, ...]) -> bool:
        """Advance over tokens the runner chose (each allowed by its row's mask). A complete
        grammar takes any of the model's end-of-sequence tokens (llguidance's own check
        knows one; a request with ``ignore_eos`` goes on choosing them)."""
        for token in tokens:
            if self._matcher.is_stopped() and token in self._eos:
                continue
            if not self._matcher.consume_token(token):
                return False
        return True


def _allowed(matcher: llguidance.LLMatcher, bits: np.ndarray, vocab_size: int, eos: list[int]) -> torch.Tensor:
    matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    if matcher.is_error() or not bits.any():  # on the 32x smaller bit words
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[eos] = True
        return mask
    return torch.from_numpy(np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].view(np.bool_))
