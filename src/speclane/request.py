"""Requests as the scheduler sees them: ids, token counts, status, lane accounting.

No torch here. A request is "computed up to ``num_computed_tokens``, wants up to
``num_tokens``": a prefill chunk, a decode step and a verified draft are all just
token counts (docs/design.md, "One tick").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


class RequestStatus(enum.IntEnum):
    """Ordered: every finished state compares greater than every live one."""

    WAITING = 0  # queued, not admitted (no KV yet)
    RUNNING = 1  # admitted: prefilling or decoding
    FINISHED_STOPPED = 10  # EOS or a stop string
    FINISHED_LENGTH = 11  # max_tokens or max_model_len
    FINISHED_ABORTED = 12  # cancelled by the client or the server
    FINISHED_ERROR = 13  # rejected or failed inside the engine

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


# The one map from a status to OpenAI's finish_reason.
FINISH_REASONS: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def finish_reason(status: RequestStatus) -> str | None:
    return FINISH_REASONS.get(status)


MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20  # OpenAI's cap on top_logprobs
MAX_LOGIT_BIAS = 300  # tokens a logit_bias may name (OpenAI: 300)
MAX_PENALTY = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0  # far past any useful value (1.1-1.3 is typical)
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_STOP_STRING_CHARS = 256


def _is_integer(value: object) -> bool:
    """An int, not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # vLLM's: no end-of-sequence token, stop token or stop string ends the answer before it
    # holds this many tokens (the stop tokens are masked out of the rows that come sooner).
    min_tokens: int = 0
    # None: no logprobs; k >= 0: each chosen token's logprob and the k most likely
    # alternatives, from the model's own distribution (before bias, penalties, grammar or temperature).
    logprobs: int | None = None
    # (token id, bias) pairs added to the logits before the grammar's mask and sampling.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI's penalties (-2 to 2), taken off the logit of every token the output holds so
    # far: ``presence_penalty`` once it appears, ``frequency_penalty`` per time it appears
    # (the prompt is not counted, as in OpenAI's and vLLM's).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's and llama.cpp's: the logit of every token in the prompt or the output so far
    # divided by this where positive, multiplied where negative (1: none).
    repetition_penalty: float = 1.0
    # Tokens less likely than min_p times the likeliest are not sampled (0: none).
    min_p: float = 0.0
    # vLLM's: None, or each prompt token's logprob (from the second on) and this many most
    # likely alternatives at its position, from the model's own distribution. Such a prompt
    # is computed whole: the prefix cache is not read for it.
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        self._check_types()
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in self.logit_bias))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1; got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it); got {self.top_k}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be from 0 to max_tokens ({self.max_tokens}); got {self.min_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63); got {self.seed}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop accepts at most {MAX_STOP_STRINGS} strings; got {len(self.stop)}")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_STRING_CHARS:
                raise ValueError(f"each stop string must have 1 to {MAX_STOP_STRING_CHARS} characters")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be 0 to {MAX_TOP_LOGPROBS} alternatives; got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"prompt_logprobs must be 0 to {MAX_TOP_LOGPROBS} alternatives; got {self.prompt_logprobs}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias accepts at most {MAX_LOGIT_BIAS} tokens; got {len(self.logit_bias)}")
        for token, bias in self.logit_bias:
            if token < 0 or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias: token {token} needs an id >= 0 and a bias in [-100, 100]; got {bias}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:  # NaN fails too
                raise ValueError(f"{name} must be from {-MAX_PENALTY} to {MAX_PENALTY}; got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}]; got {self.repetition_penalty}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1]; got {self.min_p}")

    def _check_types(self) -> None:
        """``ValueError`` for a value of the wrong type (the Python API's: a float seed or
        top_k would fail inside the engine's tick, a string temperature in a comparison)."""
        for name in ("max_tokens", "top_k", "min_tokens"):
            if not _is_integer(getattr(self, name)):
                raise ValueError(f"{name} must be an integer; got {getattr(self, name)!r}")
        for name in ("seed", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not _is_integer(getattr(self, name)):
                raise ValueError(f"{name} must be an integer or None; got {getattr(self, name)!r}")
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number; got {getattr(self, name)!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool; got {self.ignore_eos!r}")
        if not (isinstance(self.stop, str) or isinstance(self.stop, tuple | list)
                and all(isinstance(s, str) for s in self.stop)):
            raise ValueError(f"stop must be a string or a sequence of strings; got {self.stop!r}")
        if not (isinstance(self.stop_token_ids, tuple | list) and all(_is_integer(t) for t in self.stop_token_ids)):
            raise ValueError(f"stop_token_ids must be a sequence of integers; got {self.stop_token_ids!r}")
        if not (isinstance(self.logit_bias, tuple | list) and all(
                isinstance(pair, tuple | list) and len(pair) == 2 and _is_integer(pair[0]) and _is_number(pair[1])
                for pair in self.logit_bias)):
            raise ValueError(f"logit_bias must be a sequence of (token id, bias) pairs; got {self.logit_bias!r}")

    @property
    def penalized(self) -> bool:
        """Whether a presence, frequency or repetition penalty applies."""
        return bool(self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows float32; the limit is greedy anyway.
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def argmax_only(self) -> bool:
        """Whether a token is chosen from a row by its largest raw logit alone: greedy, with no
        logprobs, logit bias, penalties or held stops to read or move the rest of the row (a
        grammar is the request's, not its sampling's: the runner checks it)."""
        return (self.greedy and self.logprobs is None and not self.logit_bias and not self.penalized
                and self.min_tokens == 0)


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability and the most likely alternatives at its position."""

    token_id: int
    logprob: float | None  # None for a prompt's first token (completions' echo): nothing predicts it
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass
class SpecStats:
    """Per-request speculative accounting, reported as ``usage.speculative``."""

    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    grants: int = 0
    yields: int = 0
    preemptions: int = 0
    wait_ms: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        # Every output of every tick carries this: a shallow copy of the flat fields, not
        # dataclasses.asdict's recursive deep copy (~10x the time).
        return {**vars(self), "wait_ms": round(self.wait_ms, 3)}


@dataclass
class Request:
    request_id: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    arrival_s: float = 0.0
    priority: int = 0  # lower is more urgent (vLLM's convention)
    tenant: str = "anonymous"
    tenant_weight: float = 1.0
    speculative: bool = True
    prediction_token_ids: Sequence[int] = ()
    eos_token_ids: frozenset[int] = frozenset()
    # What the output must match: a compiled grammar (``speclane.grammar``), opaque here;
    # the runner keeps the request's matcher.
    grammar: object | None = None
    # Another request with the same prompt whose prompt KV this one reads from the prefix
    # cache instead of prefilling (``n`` > 1): admitted once that request has prefilled.
    prefill_source: str | None = None
    global_cache_scope: bool = False  # reads and writes the prefix cache's global scope

    status: RequestStatus = RequestStatus.WAITING
    error: str | None = None  # why it failed (FINISHED_ERROR), for its client
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int | None = None  # prompt tokens read from the prefix cache at the first admission
    spec: SpecStats = field(default_factory=SpecStats)
    first_token_s: float | None = None
    # With sampling.prompt_logprobs: the entries of prompt positions 1, 2, ... so far (the
    # first token has none), in prompt order, kept through preemption.
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        self.prediction_token_ids = tuple(self.prediction_token_ids)
        if not self.prompt_token_ids:
            raise ValueError("the prompt is empty: send at least one token")
        if not _is_integer(self.priority):
            raise ValueError(f"priority must be an integer; got {self.priority!r}")
        if not isinstance(self.tenant, str):
            raise ValueError(f"tenant must be a string; got {self.tenant!r}")
        if not (_is_number(self.tenant_weight) and 0 < self.tenant_weight < math.inf):
            raise ValueError(f"tenant_weight must be a number > 0; got {self.tenant_weight!r}")
        # A plain attribute: the scheduler reads it for every row of every tick.
        self.num_prompt_tokens = len(self.prompt_token_ids)

    # -- token counts -------------------------------------------------------------

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Asked for its prompt's logprobs and has not got them all yet."""
        return self.sampling.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def prefill_done(self) -> bool:
        """True once the whole prompt is in the cache."""
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def caught_up(self) -> bool:
        """True once every token but the last is in the cache: the request decodes. Past
        its prompt only once it is prefilled; a request recomputed after preemption catches
        up on its output too, in chunks within the tick's token budget, before it decodes."""
        return self.num_computed_tokens >= max(self.num_prompt_tokens, self.num_tokens - 1)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def token_ids(self) -> tuple[int, ...]:
        """All tokens so far (prompt + output), read-only."""
        return self.prompt_token_ids + tuple(self.output_token_ids)

    def token_at(self, index: int) -> int:
        n = self.num_prompt_tokens
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    def tokens_between(self, start: int, end: int) -> list[int]:
        n = self.num_prompt_tokens
        if end <= n:
            return list(self.prompt_token_ids[start:end])
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return list(self.prompt_token_ids[start:]) + self.output_token_ids[: end - n]
