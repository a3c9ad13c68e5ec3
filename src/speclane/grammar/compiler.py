"""Grammar specs -> compiled grammars, once per distinct grammar (an LRU cache).

Compiling validates the grammar against the served tokenizer and builds llguidance's
matcher for it; a request then gets its own matcher as a copy of that one (cheap).
``compile`` is thread-safe and meant to run off the engine's tick: the server calls it
in the worker thread that tokenizes the request, so a new schema costs its client
latency, never the batch's.

JSON output is compact and fixed in its spacing (``", "`` between items, ``": "`` after
keys, no other whitespace): flexible whitespace lets a small model wander into endless
newlines, and a fixed layout forces more tokens, which forced-token drafting sends
through the lane's verify for free (``engine/runner.py``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import llguidance

from speclane.grammar.matcher import GrammarMatcher
from speclane.grammar.spec import GrammarSpec

if TYPE_CHECKING:
    from speclane.models.tokenizer import Tokenizer

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
DEFAULT_CACHE_SIZE = 256


class GrammarError(ValueError):
    """The grammar is invalid or uses something the engine does not support; the message says what."""


class CompiledGrammar:
    """A validated grammar; ``new_matcher`` gives each request its own matcher."""

    def __init__(self, spec: GrammarSpec, template: llguidance.LLMatcher, vocab_size: int,
                 eos_token_ids: list[int]) -> None:
        self.spec = spec
        self._template = template
        self.vocab_size = vocab_size
        self._eos = eos_token_ids

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy(), self.vocab_size, self._eos)


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        # Built once (a few hundred ms): llguidance's view of the vocabulary, ids past the
        # tokenizer's own (a model's padded vocabulary) never allowed.
        self._eos = sorted(tokenizer.eos_token_ids)
        self._tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=self._eos)
        self.vocab_size = vocab_size
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        with self._lock:
            cached = self._cache.get(spec.key)
            if cached is not None:
                self._cache.move_to_end(spec.key)
                self.hits += 1
                return cached
        compiled = CompiledGrammar(spec, self._build(spec), self.vocab_size, self._eos)  # outside the lock: may be slow
        with self._lock:
            self.misses += 1
            self._cache[spec.key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    def _build(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        # Building the matcher validates the grammar: one construction, not a separate
        # validate_grammar pass that builds it a second time.
        matcher = llguidance.LLMatcher(self._tokenizer, _grammar_text(spec), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {_NAMES[spec.kind]}: {_first_line(matcher.get_error())}")
        warnings = matcher.get_grammar_warnings()
        if warnings and spec.kind == "json_schema":
            # A keyword llguidance would ignore changes what "valid" means: refuse, never
            # constrain to a looser schema than the client sent.
            raise GrammarError(f"unsupported JSON schema: {_first_line(warnings[0])}")
        return matcher


_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
          "choice": "choice list", "lark": "grammar"}


def _grammar_text(spec: GrammarSpec) -> str:
    try:
        if spec.kind in ("json_schema", "json_object"):
            return llguidance.LLMatcher.grammar_from_json_schema(spec.source, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        if spec.kind == "choice":
            options = json.loads(spec.source)
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(option, ensure_ascii=False) for option in options))
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    except ValueError as exc:
        raise GrammarError(f"invalid {_NAMES[spec.kind]}: {_first_line(str(exc))}") from None


def _first_line(message: str) -> str:
    """The engine's message on one line, short enough for an error response."""
    text = " ".join(line.strip() for line in message.strip().splitlines() if line.strip())
    return text[:500] if text else "rejected by the grammar engine"
