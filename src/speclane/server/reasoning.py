"""A reasoning model's thinking apart from its answer: ``<think>...</think>`` -> ``reasoning_content``.

Qwen3, QwQ and DeepSeek-R1's distillations think before they answer, inside one
``<think>...</think>`` block at the start of the reply (or with the ``<think>`` already in
the prompt: their templates may open it after the generation prompt). A chat answer carries
that text as ``message.reasoning_content`` (``delta.reasoning_content`` when streamed, as
vLLM's reasoning parsers, llama.cpp's server and DeepSeek's API send it) and only what
follows ``</think>`` as ``content``, where tool calls are parsed too.

``speclane serve --reasoning-parser``: ``auto`` (the default) reads replies so where the
model's chat template writes ``<think>``; ``think`` for every model; ``none`` leaves the
tags in ``content``. The split is text-level and streams: ``ReasoningSplitter`` holds back
only what may be the start of a tag. A reply that starts with anything but ``<think>``
(after whitespace) is all content, and so is everything after the first ``</think>``; a
reply cut short while thinking is all reasoning.

``usage.completion_tokens_details.reasoning_tokens`` counts a thinking reply's tokens up to
the one that ends its ``</think>`` (by its id where the tokenizer has that tag as one token,
as Qwen3's and DeepSeek-R1's do, ``think_end_token``; else by decoding the reply's tokens
once, when the tag has come), and all of them where the reply never closes it.
"""

from __future__ import annotations

import re
from typing import Protocol

from speclane.server.tools import partial_tag

OPEN, CLOSE = "<think>", "</think>"


class SupportsEncode(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

REASONING_PARSERS = ("auto", "think", "none")
_ENDS_OPEN = re.compile(re.escape(OPEN) + r"\s*$")


def template_thinks(template: str | None) -> bool:
    """Whether a chat template writes thinking blocks (Qwen3's, QwQ's, DeepSeek-R1's)."""
    return template is not None and OPEN in template


def reads_reasoning(parser: str, template: str | None) -> bool:
    """Whether replies are split, for ``--reasoning-parser`` ``parser``."""
    if parser not in REASONING_PARSERS:
        raise ValueError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}; got {parser!r}")
    return parser == "think" or parser == "auto" and template_thinks(template)


def think_end_token(tokenizer: SupportsEncode) -> int | None:
    """The id of ``</think>`` where the tokenizer writes it as one token, else None."""
    ids = tokenizer.encode(CLOSE, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open ``<think>`` (the reply starts in it)."""
    return _ENDS_OPEN.search(prompt) is not None


class ReasoningSplitter:
    """Splits one reply, fed as it streams, into (reasoning, content) pieces."""

    def __init__(self, *, thinking: bool = False) -> None:
        # "start": nothing but whitespace yet; "thinking"; "answer": everything is content.
        self._state = "thinking" if thinking else "start"
        self.thought = thinking  # the reply has been inside a thinking block
        self._held = ""  # text that may begin a tag (or, at the start, whitespace before one)
        self._strip = thinking  # drop the whitespace that opens the reasoning or the answer

    @property
    def closed(self) -> bool:
        """The reply thought and has closed its thinking block."""
        return self.thought and self._state == "answer"

    def feed(self, text: str) -> tuple[str, str]:
        text = self._held + text
        self._held = ""
        reasoning = content = ""
        while text:
            if self._state == "start":
                stripped = text.lstrip()
                if not stripped or OPEN.startswith(stripped):
                    self._held = text  # whitespace, or part of "<think>": wait for more
                    return reasoning, content
                if stripped.startswith(OPEN):
                    self._state, self._strip, text = "thinking", True, stripped[len(OPEN):]
                    self.thought = True
                else:
                    self._state = "answer"
            elif self._state == "thinking":
                if self._strip:
                    text = text.lstrip()
                    self._strip = not text
                    if not text:
                        return reasoning, content
                end = text.find(CLOSE)
                if end < 0:
                    keep = partial_tag(text, CLOSE)
                    reasoning += text[: len(text) - keep]
                    self._held = text[len(text) - keep:]
                    return reasoning, content
                reasoning += text[:end]
                self._state, self._strip, text = "answer", True, text[end + len(CLOSE):]
            else:
                if self._strip:
                    text = text.lstrip()
                    self._strip = not text
                content += text
                text = ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held back, once the reply has ended."""
        held, self._held = self._held, ""
        if self._state == "thinking":
            return held, ""
        if self._state == "start" and not held.strip():
            return "", ""  # a reply of whitespace alone
        return "", held

