"""One tree of frozen configuration dataclasses, and every ``SPECLANE_*`` variable.

Every engine option (``docs/api.md``) is a field here, validated in ``__post_init__``
with a ``ValueError`` that names the field and the allowed values. Command-line
flags and ``SPECLANE_*`` environment variables are generated from these fields
(``add_arguments`` / ``from_namespace``), never written twice. The deployment
settings without a flag (cache folders, the shutdown grace) are ``RuntimeEnv``, read
by ``runtime_env``. Nothing here reads the environment at import time, and this
module imports nothing of speclane: it is the bottom layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

DTYPES = ("bfloat16", "float32")
QUANTIZATIONS = ("auto", "int8", "int4", "none")
KERNELS = ("auto", "native", "torch")  # kernels/select.py
MATMUL_INPUTS = ("bfloat16", "int8")  # kernels/select.py
HEAD_INPUTS = ("auto", *MATMUL_INPUTS)  # kernels/select.py
ARGMAX_SCREENS = ("int4", "off")  # models/build.py's argmax_screen
SPEC_MODES = ("slice", "burst", "off")
FAIRNESS_MODES = ("tenant", "request")
# ``--drafter`` names; ``drafters/registry.py`` builds each (and asserts it covers these).
DRAFTERS = ("none", "ngram", "suffix", "mtp", "auto")
# `speclane serve --stream-interval-ms`: a stream's chunks at most this often
# (engine/stream_mailbox.read_stream). 20 ms is 50 chunks a second, smoother than a reader
# can tell; a stream that ticks faster sends the tokens of about 20 ms as one chunk, one
# wake-up of the server's event loop and of its client where there would be several, each
# preempting one of the engine's decoding threads on a small machine (every OpenMP barrier
# then waits for it). One stream of the default model over HTTP against the engine alone,
# 10 shuffled runs (benchmarks/http_vs_engine.py --intervals 0,10,20,40, its own prompt):
# 0.89x / 0.95x / 0.97x / 0.97x with 128 / 64 / 37 / 22 chunks for 128 tokens; 20 is the
# shortest interval at the plateau. `bench vs-llama-cpp` reports it on another prompt.
DEFAULT_STREAM_INTERVAL_MS = 20.0
# `speclane serve --stream-pace-streams`: with more streams open than this, each stream's
# interval grows with their number (engine/stream_mailbox.paced_interval_s), so the server's
# chunks a second stay about what this many streams at --stream-interval-ms send. At 16
# streams a chunk a tick each was 16 wake-ups of the server's loop and of its clients per
# ~35 ms tick, on the two cores the engine decodes on. The default model, openai-SDK
# streams of 128 tokens, paced at 4 against never: the client's CPU 0.74x / 0.65x at 8 / 16
# streams (3 runs each), aggregate tok/s 1.07x at 8 (7 alternated runs, 0.98-1.19x) and
# 1.01x / 1.16x at 16 in two sets of runs (0.87-1.77x: this machine's drift).
DEFAULT_STREAM_PACE_STREAMS = 4


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:  # NaN too
        raise ValueError(f"{name} must be >= {low}; got {value}")


@dataclass(frozen=True)
class StreamPacing:
    """How often a streamed response sends a chunk (`speclane serve --stream-interval-ms`,
    `--stream-pace-streams`; ``engine/stream_mailbox.paced_interval_s``). The default
    instance paces nothing: an engine outside ``serve`` sends a chunk per tick."""

    interval_ms: float = 0.0
    pace_streams: int = 0  # 0: the interval never grows with the streams open

    def __post_init__(self) -> None:
        _at_least("--stream-interval-ms", self.interval_ms, 0)
        _at_least("--stream-pace-streams", self.pace_streams, 0)


SERVE_PACING = StreamPacing(DEFAULT_STREAM_INTERVAL_MS, DEFAULT_STREAM_PACE_STREAMS)  # `speclane serve`'s


def _check_types(section: object) -> None:
    """``ValueError`` for a field whose value is not of its declared type (from the Python
    API: flags and the environment are parsed by type): a bool is only a bool, an int only
    an int, a float a finite int or float, a str a str."""
    hints = _field_types(type(section))
    for f in fields(section):  # type: ignore[arg-type]
        hint, value = hints[f.name], getattr(section, f.name)
        if hint is bool:
            ok = isinstance(value, bool)
        elif hint is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif hint is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        elif hint is str:
            ok = isinstance(value, str)
        else:
            continue  # a nested section, checked by its own __post_init__
        if not ok:
            kind = {float: "a finite number", int: "an integer", bool: "a bool", str: "a string"}[hint]
            raise ValueError(f"{f.name} must be {kind}; got {value!r}")


@functools.cache
def _field_types(section: type) -> dict[str, Any]:
    return get_type_hints(section)


@dataclass(frozen=True)
class ModelConfig:
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "model name, .gguf file, HF folder or HF repo id"})
    dtype: str = field(default="bfloat16", metadata={"help": "activation and dequantized weight dtype"})
    quantization: str = field(default="auto", metadata={"help": "auto: run a GGUF's own values (its blocks, F32/F16/BF16) and a folder's float weights on our kernels, quantize nothing on load; int8, int4: quantize the other weights on load; none"})
    max_model_len: int = field(default=2048, metadata={"help": "prompt + completion tokens"})
    num_threads: int = field(default=0, metadata={"help": "torch CPU threads; 0 = torch's default"})
    adapt_threads: bool = field(default=True, metadata={
        "help": "run on as many of the threads as other processes leave cores free (checked every half second while "
                "decoding, and before the first tick after an idle second; a busy neighbour otherwise stalls every "
                "thread at each barrier)"})
    kernels: str = field(default="auto", metadata={
        "help": "auto: our C kernels where they build here, else torch's ops; native: ours or a start-up error; torch: torch's ops"})
    matmul_inputs: str = field(default="bfloat16", metadata={
        "help": "what our int4 and int8-group matmuls multiply the weights by: bfloat16 (exact products on each "
                "group's grid) or int8 (each group of 32 inputs rounded to 8 bits, as llama.cpp does: faster at several "
                "rows, further from float32; docs/design.md has both)"})
    narrow_weights: bool = field(default=True, metadata={
        "help": "keep a GGUF weight whose values fit 5 or 6 bits (Q5_0, Q5_1, Q5_K, Q6_K) in that many bits a value, "
                "decoded in registers by the int8-group kernel (the same results): the resident memory of a Q5/Q6-heavy "
                "file near its size; --no-narrow-weights keeps a byte a value"})
    head_inputs: str = field(default="auto", metadata={
        "help": "what the output head's coarse pass on our int4 and int8-group kernels multiplies its weights by "
                "(each row's top 32 logits are recomputed in float32 either way): int8 (faster at several rows), "
                "bfloat16, or auto: int8 where the int8-input kernels run and no AMX tile kernel does (always int8 "
                "under --matmul-inputs int8)"})
    argmax_screen: str = field(default="int4", metadata={
        "help": "int4: the rows of greedy requests without logprobs, logit bias, penalties or a grammar (only the "
                "largest logit matters to them) find their top 32 candidates with an int4 copy of an int8 or bfloat16 "
                "output head (a bit over half its bytes), recomputed in float32 from the head's exact rows as every row "
                "is; off: they read the head as other rows do"})

    def __post_init__(self) -> None:
        _check_types(self)
        _choice("dtype", self.dtype, DTYPES)
        _choice("argmax_screen", self.argmax_screen, ARGMAX_SCREENS)
        _choice("matmul_inputs", self.matmul_inputs, MATMUL_INPUTS)
        _choice("head_inputs", self.head_inputs, HEAD_INPUTS)
        _choice("quantization", self.quantization, QUANTIZATIONS)
        _choice("kernels", self.kernels, KERNELS)
        _at_least("max_model_len", self.max_model_len, 16)
        _at_least("num_threads", self.num_threads, 0)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=16, metadata={"help": "requests decoding at once"})
    max_queue: int = field(default=256, metadata={"help": "requests waiting for admission before 'queue full'"})
    # 64: on a CPU a tick's cost grows with its rows from a few rows on, so a larger budget
    # buys little prefill speed and stalls every decoding stream for the whole chunk
    # (docs/benchmarks.md, "concurrency"), and prompts arriving together reach their first
    # token one after another instead of all at the end of one long tick.
    max_num_batched_tokens: int = field(default=64, metadata={
        "help": "tokens per tick (prefill chunks + decode + verify); prompts wait while decode and verify rows "
                "fill it, so keep it above --max-num-seqs plus the lane's drafts"})
    enable_chunked_prefill: bool = field(default=True, metadata={
        "help": "split long prompts across ticks; without it a prompt longer than --max-num-batched-tokens "
                "waits for a tick with nothing else to run"})
    kv_cache_mib: int = field(default=0, metadata={
        "help": "KV pool size in MiB, in blocks of 16 positions; requests wait (or are preempted and recomputed) "
                "when it is full; 0 = room for max-num-seqs requests of max-model-len tokens"})
    prefix_cache: bool = field(default=True, metadata={
        "help": "keep full KV blocks of finished and running requests for later requests of the same tenant "
                "with the same prefix (their prefill is skipped)"})

    def __post_init__(self) -> None:
        _check_types(self)
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("kv_cache_mib", self.kv_cache_mib, 0)
        _at_least("max_queue", self.max_queue, 0)
        _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 8)


@dataclass(frozen=True)
class LaneConfig:
    drafter: str = field(default="auto", metadata={
        "help": "none; ngram (prompt lookup); suffix (the request's text and its tenant's recent outputs); mtp (the MTP head); "
                "auto (per round, the suffix drafter's proposal or the MTP head's where the model has one, whichever is "
                "expected to give the most tokens per millisecond)"})
    num_draft_tokens: int = field(default=4, metadata={
        "help": "K, draft tokens per round (with adaptive K, the most beside other requests)"})
    lone_draft_tokens: int = field(default=8, metadata={
        "help": "with adaptive K, the most draft tokens per round of the engine's one request (nothing else decoding, "
                "prefilling or waiting: its extra rows delay no one); never fewer than --num-draft-tokens"})
    spec_mode: str = field(default="slice", metadata={"help": "slice: one round per tick beside everyone's decode; burst: the holder runs alone until it finishes (a baseline); off"})
    spec_adaptive_k: bool = field(default=True, metadata={
        "help": "choose each round's drafts by the tick's expected goodput: fewer than K (even 0), or up to "
                "--lone-draft-tokens for a lone request; off: K every round"})
    spec_slots: int = field(default=1, metadata={"help": "requests that may hold the lane at once"})
    spec_grant_rounds: int = field(default=8, metadata={"help": "rounds per grant; 0 = hold for the whole generation"})
    spec_grant_ms: float = field(default=0.0, metadata={"help": "wall-clock budget of a grant in ms; 0 = none"})
    spec_skip_cap: int = field(default=2, metadata={"help": "a priority whose waiters were passed over this many times is granted next"})
    spec_preempt: bool = field(default=True, metadata={"help": "a more urgent waiter preempts a holder at a round boundary"})
    fairness: str = field(default="tenant", metadata={"help": "tenant: fair between tenants; request: round-robin between requests"})
    mtp_head: str = field(default="", metadata={"help": "path of an MTP head (default: the one shipped for the model)"})
    mtp_min_draft_prob: float = field(default=0.0, metadata={"help": "MTP stops drafting a round when its confidence falls below this"})
    mtp_lookup: bool = field(default=True, metadata={
        "help": "MTP drafts a round by prompt lookup (as ngram does) where the recent tokens appeared before, by its head elsewhere"})
    suffix_cache_tokens: int = field(default=8192, metadata={
        "help": "suffix and auto drafters: tokens of each tenant's recent outputs kept to draft from (oldest evicted first); "
                "0 = the request's own text only"})
    suffix_tree_branches: int = field(default=1, metadata={
        "help": "suffix and auto drafters: continuations drafted per node where several were seen before, a draft tree "
                "verified in one forward within the round's K rows; 1 = a chain"})

    def __post_init__(self) -> None:
        _check_types(self)
        _choice("drafter", self.drafter, DRAFTERS)
        _choice("spec_mode", self.spec_mode, SPEC_MODES)
        _choice("fairness", self.fairness, FAIRNESS_MODES)
        for name in ("num_draft_tokens", "lone_draft_tokens"):
            _at_least(name, getattr(self, name), 1)
            if getattr(self, name) > 16:
                raise ValueError(f"{name} must be <= 16; got {getattr(self, name)}")
        _at_least("spec_slots", self.spec_slots, 1)
        _at_least("spec_grant_rounds", self.spec_grant_rounds, 0)
        _at_least("spec_grant_ms", self.spec_grant_ms, 0)
        _at_least("spec_skip_cap", self.spec_skip_cap, 1)
        _at_least("suffix_cache_tokens", self.suffix_cache_tokens, 0)
        _at_least("suffix_tree_branches", self.suffix_tree_branches, 1)
        if not 0 <= self.mtp_min_draft_prob < 1:
            raise ValueError(f"mtp_min_draft_prob must be in [0, 1); got {self.mtp_min_draft_prob}")

    @property
    def max_draft_tokens(self) -> int:
        """The most drafts any round takes: a lone request's with adaptive K (slice mode), else K."""
        if self.spec_adaptive_k and self.spec_mode == "slice":
            return max(self.num_draft_tokens, self.lone_draft_tokens)
        return self.num_draft_tokens

    @property
    def speculation_enabled(self) -> bool:
        return self.spec_mode != "off" and self.drafter != "none"


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lane: LaneConfig = field(default_factory=LaneConfig)

    def start_up_warnings(self) -> list[str]:
        """Settings that are valid but work against each other (the engine logs them when it starts)."""
        scheduler, lane = self.scheduler, self.lane
        drafts = lane.spec_slots * lane.num_draft_tokens if lane.speculation_enabled else 0
        if scheduler.max_num_batched_tokens >= scheduler.max_num_seqs + drafts:
            return []
        beside = f" plus the lane's drafts ({lane.spec_slots} x {lane.num_draft_tokens})" if drafts else ""
        return [f"--max-num-batched-tokens {scheduler.max_num_batched_tokens} is below --max-num-seqs "
                f"{scheduler.max_num_seqs}{beside}: with every slot decoding, the decode and verify rows fill "
                "each tick and a new prompt's prefill waits for a stream to finish"]

    def replace(self, **changes: Any) -> EngineConfig:
        """Copy with flat field changes, e.g. ``cfg.replace(spec_mode="off", dtype="float32")``."""
        parts = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in changes.items():
            for part_name, part in parts.items():
                if key in {f.name for f in fields(part)}:
                    parts[part_name] = dataclasses.replace(part, **{key: value})
                    break
            else:
                raise ValueError(f"unknown engine option {key!r}")
        return EngineConfig(**parts)

    @classmethod
    def from_flat(cls, **options: Any) -> EngineConfig:
        return cls().replace(**options)


SECTIONS: tuple[type, ...] = (ModelConfig, SchedulerConfig, LaneConfig)


@dataclass(frozen=True)
class ClusterConfig:
    """``speclane serve`` across engine replicas (Ray actors, ``speclane/cluster/``)."""

    replicas: int = field(default=1, metadata={
        "help": "engine replicas; above 1 they run as Ray actors (pip install speclane[cluster]) behind one "
                "endpoint, each with cores / replicas torch threads unless --num-threads says otherwise"})
    ray_address: str = field(default="", metadata={"help": "join this Ray cluster instead of starting a local one"})
    counter_sync_ms: float = field(default=50.0, metadata={
        "help": "how often the replicas' lanes exchange each tenant's lane service (the cluster-wide fair lane)"})
    affinity_slack: int = field(default=2, metadata={
        "help": "a conversation stays on the replica holding its cached prefix unless that replica runs this "
                "many more requests than the least loaded one"})
    health_timeout_s: float = field(default=10.0, metadata={
        "help": "a replica that answers no poll for this long is drained: its requests end with an error"})

    def __post_init__(self) -> None:
        _check_types(self)
        _at_least("replicas", self.replicas, 1)
        _at_least("counter_sync_ms", self.counter_sync_ms, 1.0)
        _at_least("affinity_slack", self.affinity_slack, 0)
        _at_least("health_timeout_s", self.health_timeout_s, 0.5)


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def flag(name: str) -> str:
    """The command-line flag of a config field (or any option): ``max_model_len`` -> ``--max-model-len``."""
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, sections: tuple[type, ...] = SECTIONS) -> None:
    """Add one ``--flag`` per config field; defaults come from the dataclass."""
    for section in sections:
        hints = get_type_hints(section)
        group = parser.add_argument_group(section.__name__)
        for f in fields(section):
            option = flag(f.name)
            kind = hints[f.name]
            described = f.metadata.get("help", "")
            default = "" if "(default:" in described else f"default: {f.default if f.default != '' else 'none'}; "
            help_text = f"{described} ({default}env SPECLANE_{f.name.upper()})"
            help_text = help_text.replace("%", "%%")  # argparse formats help with %
            if kind is bool:
                group.add_argument(option, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            else:
                group.add_argument(option, dest=f.name, type=kind, default=None, help=help_text)


_KIND_WORDS = {int: "an integer", float: "a number"}


def _from_env(section: type, env: Mapping[str, str]) -> dict[str, Any]:
    hints = get_type_hints(section)
    values: dict[str, Any] = {}
    for f in fields(section):
        raw = env.get(f"SPECLANE_{f.name.upper()}")
        if raw is None:
            continue
        kind = hints[f.name]
        try:
            values[f.name] = _parse_bool(raw) if kind is bool else kind(raw)
        except ValueError as exc:
            reason = exc if kind is bool else f"not {_KIND_WORDS.get(kind, kind.__name__)}: {raw!r}"
            raise ValueError(f"SPECLANE_{f.name.upper()}: {reason}") from None
    return values


def from_namespace(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> EngineConfig:
    """Build the config: dataclass defaults < SPECLANE_* environment < command-line flags."""
    parts = {name: section_from_namespace(section, args, env)
             for name, section in (("model", ModelConfig), ("scheduler", SchedulerConfig), ("lane", LaneConfig))}
    return EngineConfig(**parts)


def section_from_namespace(section: type, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Any:
    """One section (e.g. ``ClusterConfig``): defaults < SPECLANE_* environment < flags."""
    values = _from_env(section, os.environ if env is None else env)
    for f in fields(section):
        flag_value = getattr(args, f.name, None)
        if flag_value is not None:
            values[f.name] = flag_value
    return section(**values)


@dataclass(frozen=True)
class RuntimeEnv:
    """Deployment settings that come from the environment alone, without a flag: where
    speclane keeps its caches (converted weights, step-cost calibrations, compiled kernels)
    and how long a stopping server drains.

    ``runtime_env`` reads them (the one place besides ``from_namespace`` that reads a
    ``SPECLANE_*`` variable; the kernels are a flag, ``--kernels``). The code that
    needs one of them takes it as an argument (``read_weights(env=)``, ``serve(env=)``, a
    folder for ``calibration.step_cost``), and reads ``runtime_env()`` at that call when
    given none: a variable set after import (a test's monkeypatch, a parent
    process's environment) still applies, to the ``LLM`` API as to the CLI.
    """

    weight_cache_dir: Path | None  # SPECLANE_CACHE_DIR; None: SPECLANE_NO_WEIGHT_CACHE=1 (models/weight_cache.py)
    calibration_dir: Path  # SPECLANE_CALIBRATION_DIR (engine/calibration.py)
    kernel_dir: Path  # SPECLANE_KERNEL_DIR: the compiled C kernels (kernels/build.py)
    # SPECLANE_SHUTDOWN_GRACE_S as set (None: unset), parsed by ``shutdown_grace_s`` where a
    # server stops: a bad value fails ``speclane serve``, not every command.
    shutdown_grace: str | None

    def shutdown_grace_s(self, default: float) -> float:
        """Seconds a stopping server lets requests finish: the variable, else ``default``."""
        raw = self.shutdown_grace
        try:
            seconds = float(raw) if raw else default
        except ValueError:
            seconds = math.nan
        if not 0 <= seconds < math.inf:
            raise ValueError(f"SPECLANE_SHUTDOWN_GRACE_S must be a number of seconds >= 0; got {raw!r}")
        return seconds


def runtime_env(env: Mapping[str, str] | None = None) -> RuntimeEnv:
    """The ``RuntimeEnv`` of ``env`` (default: the process environment, read now)."""
    env = os.environ if env is None else env
    home_cache = Path.home() / ".cache" / "speclane"
    weights_off = env.get("SPECLANE_NO_WEIGHT_CACHE", "") in ("1", "true", "yes")
    return RuntimeEnv(
        weight_cache_dir=None if weights_off else Path(env.get("SPECLANE_CACHE_DIR", home_cache / "weights")),
        calibration_dir=Path(env.get("SPECLANE_CALIBRATION_DIR", home_cache / "calibration")),
        kernel_dir=Path(env.get("SPECLANE_KERNEL_DIR", home_cache / "kernels")),
        shutdown_grace=env.get("SPECLANE_SHUTDOWN_GRACE_S"),
    )
