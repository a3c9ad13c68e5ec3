"""Engine logprobs -> OpenAI's two formats.

The engine reports, per generated token, its logprob and the k most likely tokens at
that position, from the model's own distribution (log-softmax of the raw logits, before
``logit_bias``, the penalties, the grammar's mask, temperature, top-k or top-p). Here token ids become
OpenAI's ``token`` strings and ``bytes``:

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}]}], "refusal": null}``;
- completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token:
  logprob}], "text_offset"}``, ``top_logprobs`` null with ``logprobs: 0``;
  ``text_offset`` counts characters from the start of the choice's text.

A token that is part of a UTF-8 character is written ``bytes:\\xe2\\x80`` (OpenAI's
convention) and its ``bytes`` are the raw bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speclane.request import TokenLogprob

if TYPE_CHECKING:
    from speclane.models.tokenizer import Tokenizer


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF = _byte_level_alphabet()


class TokenTexts:
    """``token`` strings and ``bytes`` of token ids, cached (one per server)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._compute(token_id)
        return found

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text, list(text.encode())
        piece = self._tokenizer.id_to_token(token_id) or ""
        if piece and all(ch in _BYTE_OF for ch in piece):
            raw = bytes(_BYTE_OF[ch] for ch in piece)
            try:
                return raw.decode(), list(raw)
            except UnicodeDecodeError:
                return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), list(raw)
        return text, list(text.encode())


def chat_logprobs(entries: Sequence[TokenLogprob], top: int, texts: TokenTexts) -> list[dict[str, Any]]:
    """``logprobs.content`` items for these tokens, each with its ``top`` alternatives."""
    items = []
    for entry in entries:
        token, raw = texts.get(entry.token_id)
        alternatives = []
        for token_id, logprob in entry.top[:top]:
            alt, alt_raw = texts.get(token_id)
            alternatives.append({"token": alt, "logprob": logprob, "bytes": alt_raw})
        items.append({"token": token, "logprob": entry.logprob, "bytes": raw, "top_logprobs": alternatives})
    return items


def completion_logprobs(entries: Sequence[TokenLogprob], top: int, texts: TokenTexts,
                        offset: int = 0) -> dict[str, Any]:
    """The legacy ``logprobs`` object for these tokens; ``offset``: characters before the first."""
    tokens, logprobs, offsets, tops = [], [], [], []
    for entry in entries:
        token = texts.get(entry.token_id)[0]
        tokens.append(token)
        logprobs.append(entry.logprob)
        offsets.append(offset)
        offset += len(token)
        tops.append(None if entry.logprob is None  # an echoed prompt's first token: nothing predicts it
                    else {texts.get(token_id)[0]: logprob for token_id, logprob in entry.top[:top]})
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops if top else None,
            "text_offset": offsets}
