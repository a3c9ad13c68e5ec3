"""Streaming token ids -> text for one request, with stop strings.

The engine feeds each generated token to the request's `IncrementalDetokenizer` and sends
the returned text to the client. Two things make this more than `decode(token)`:

* A byte-level BPE token can hold part of a UTF-8 character (an emoji is often 2-4 tokens).
  Text is released only once it no longer ends in U+FFFD, so no client ever sees a broken
  character. Decoding uses vLLM's prefix/read offsets: each step decodes only the few tokens
  since the last clean boundary, never the whole output.
* Stop strings can span tokens. Text that might be the start of a stop string is held back
  until it is decided; when one completes, the text before it is released, nothing after it
  ever is, and the step says `stopped` so the engine can finish the request.

Invariant: the concatenation of every piece returned (by `add`, `extend` and `flush`) equals
`tokenizer.decode(output ids)` cut before the first stop string to complete (one that
completes within the first `min_tokens` tokens does not count).

This module does no I/O and imports no torch; it needs only a `decode(ids, skip_special_tokens)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

# How many prompt tokens to decode along with the output. Byte-level BPE does not need
# them, but tokenizers whose decoder drops a leading space (sentencepiece) need context to
# decode the first output token with its space, as vLLM does.
_NUM_PROMPT_CONTEXT_TOKENS = 5

_REPLACEMENT_CHAR = "\ufffd"


class SupportsDecode(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class DetokStep:
    """What one `add` / `extend` / `flush` call produced."""

    text: str  # new text for the client; may be "" while a character or stop string is pending
    stopped: bool = False  # a stop string completed: finish the request, feed no more tokens
    stop_string: str | None = None  # which stop string, when stopped
    num_tokens: int = 1  # token ids consumed by this call (extend stops at the stopping one)


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, one token at a time."""

    def __init__(
        self,
        tokenizer: SupportsDecode,
        prompt_token_ids: Sequence[int],
        stop: Iterable[str] = (),
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self.stop: tuple[str, ...] = tuple(stop)
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        # Every proper prefix of a stop string: a pending text ending in one of these may
        # still become a stop string, so that ending is held back.
        self._stop_prefixes = frozenset(s[:i] for s in self.stop for i in range(1, len(s)))
        self._max_prefix_len = max((len(p) for p in self._stop_prefixes), default=0)
        # min_tokens: a stop string counts where it completes after the first min_tokens
        # tokens (vLLM's rule), even where it starts within them.
        self._min_tokens = min_tokens

        # Decoding window, as vLLM: ids[prefix_offset:read_offset] is text already released
        # (or prompt context), ids[read_offset:] is not yet released. Both offsets sit on
        # clean character boundaries.
        context = list(prompt_token_ids[-_NUM_PROMPT_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = self._decode(context)
        if self._prefix_text.endswith(_REPLACEMENT_CHAR):
            # The prompt ends inside a character: its tail is no clean boundary, so decode
            # the output on its own.
            self._ids, self._read_offset, self._prefix_text = [], 0, ""

        self._pending = ""  # decoded text not yet released: a possible stop-string start
        self._pieces: list[str] = []
        self._num_output_tokens = 0
        self._finished = False
        self.stop_string: str | None = None

    # ---- public ---------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True once a stop string completed or `flush` was called."""
        return self._finished

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    @property
    def output_text(self) -> str:
        """All text released so far."""
        return "".join(self._pieces)

    @property
    def num_output_tokens(self) -> int:
        """Output token ids consumed (those after a stop string are not)."""
        return self._num_output_tokens

    def add(self, token_id: int) -> DetokStep:
        """Feed one generated token; return the text it releases."""
        self._check_open()
        self._ids.append(token_id)
        self._num_output_tokens += 1
        return self._release(self._decode_new(final=False))

    def extend(self, token_ids: Iterable[int]) -> DetokStep:
        """Feed several tokens (a verified speculative round). Stops at the token that
        completes a stop string; `num_tokens` says how many were consumed."""
        self._check_open()
        texts: list[str] = []
        num_tokens = 0
        for token_id in token_ids:
            step = self.add(token_id)
            texts.append(step.text)
            num_tokens += 1
            if step.stopped:
                return DetokStep("".join(texts), True, step.stop_string, num_tokens)
        return DetokStep("".join(texts), num_tokens=num_tokens)

    def flush(self) -> DetokStep:
        """The request ended for another reason (EOS, length, abort): release what is held,
        including an unfinished character (as U+FFFD, as a full decode would show it)."""
        if self._finished:
            return DetokStep("", self.stopped, self.stop_string, num_tokens=0)
        step = self._release(self._decode_new(final=True), final=True)
        self._finished = True
        return DetokStep(step.text, step.stopped, step.stop_string, num_tokens=0)

    # ---- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(
                "this request's detokenizer has finished (stop string or flush); "
                "no more tokens may be added"
            )

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _decode_new(self, final: bool) -> str:
        """Text of the tokens since the read offset, or "" while it ends mid-character."""
        if self._read_offset == len(self._ids):
            return ""
        # Decoding from the prefix offset (not the read offset) keeps the context a decoder
        # may need for the first new token (a leading space, a merged character).
        new_text = self._decode(self._ids[self._prefix_offset :])
        if not final and (
            len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT_CHAR)
        ):
            # Nothing yet (a skipped special token), or the last character is incomplete.
            return ""
        delta = new_text[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        return delta

    def _release(self, delta: str, final: bool = False) -> DetokStep:
        """Add decoded text to the pending text; release what cannot start a stop string."""
        if not self.stop:
            self._emit(delta)
            return DetokStep(delta)
        if not delta and not final:
            return DetokStep("")
        pending = self._pending + delta
        # A stop string can only start inside the pending text: every released character was
        # checked not to begin one. The first to complete (smallest end) wins. Within the
        # first min_tokens tokens none completes, but a possible start is held all the same:
        # a stop string that starts there and completes after them counts.
        best: tuple[int, int, str] | None = None
        for stop in self.stop if self._num_output_tokens > self._min_tokens else ():
            start = pending.find(stop)
            if start >= 0:
                candidate = (start + len(stop), start, stop)
                if best is None or candidate < best:
                    best = candidate
        if best is not None:
            _, start, stop = best
            text = pending[:start]
            self._pending = ""
            self._emit(text)
            self.stop_string = stop
            self._finished = True
            return DetokStep(text, stopped=True, stop_string=stop)
        hold = 0 if final else self._stop_prefix_suffix_len(pending)
        text = pending[: len(pending) - hold]
        self._pending = pending[len(pending) - hold :]
        self._emit(text)
        return DetokStep(text)

    def _stop_prefix_suffix_len(self, text: str) -> int:
        """Length of the longest ending of `text` that is a proper prefix of a stop string."""
        for length in range(min(self._max_prefix_len, len(text)), 0, -1):
            if text[-length:] in self._stop_prefixes:
                return length
        return 0

    def _emit(self, text: str) -> None:
        if text:
            self._pieces.append(text)
