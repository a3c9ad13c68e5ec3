"""The engine: one tick is plan, execute, update, emit.

``LLMEngine`` is synchronous and single-threaded in its ticking; ``add_request`` and
``abort_request`` may be called from other threads (the async front,
``engine/async_engine.py``) and take effect at the next tick boundary.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from speclane.config import EngineConfig, SchedulerConfig
from speclane.drafters.base import CostAware, Drafter
from speclane.drafters.registry import create_drafter
from speclane.engine import calibration
from speclane.engine.detokenizer import IncrementalDetokenizer
from speclane.engine.runner import ModelRunner
from speclane.engine.stats import EngineCounters, EngineObserver
from speclane.engine.threads import ThreadGovernor
from speclane.grammar.compiler import CompiledGrammar, GrammarCompiler
from speclane.grammar.spec import GrammarSpec
from speclane.models.build import build_model
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel
from speclane.models.loader import read_weights
from speclane.models.tokenizer import Tokenizer
from speclane.request import Request, SamplingParams, TokenLogprob, finish_reason
from speclane.scheduler.block_pool import KV_BLOCK_SIZE
from speclane.scheduler.counts import TenantTally
from speclane.scheduler.fairness import ChargeReport, ResetBatch
from speclane.scheduler.scheduler import Scheduler, default_kv_blocks

log = logging.getLogger(__name__)


@dataclass
class RequestOutput:
    """What one tick produced for one request: new text and tokens, and whether it ended."""

    request_id: str
    text: str  # new text since the previous output
    token_ids: list[int]  # new token ids since the previous output
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens read from the prefix cache
    speculative: dict[str, float | int] = field(default_factory=dict)
    error: str | None = None
    bad_request: bool = False  # ``error`` is the request's own to fix (its grammar), not the server's
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when the request asked
    # With prompt_logprobs, on the request's first output: the entries of prompt positions
    # 1, 2, ... (the first token has none).
    prompt_logprobs: list[TokenLogprob] | None = None

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output and the request's next one as one (a paced stream's chunk): the new
        text, tokens and logprobs of both; the counts and the end of the later."""
        logprobs = None if self.logprobs is None and later.logprobs is None else [*(self.logprobs or ()), *(later.logprobs or ())]
        return dataclasses.replace(later, text=self.text + later.text, token_ids=[*self.token_ids, *later.token_ids],
                                   logprobs=logprobs, prompt_logprobs=self.prompt_logprobs or later.prompt_logprobs)

    @property
    def usage(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": int(self.speculative.get("accepted_tokens", 0)),
                "rejected_prediction_tokens": int(self.speculative.get("draft_tokens", 0))
                - int(self.speculative.get("accepted_tokens", 0)),
            },
            "speculative": dict(self.speculative),
        }


def kv_pool_blocks(config: SchedulerConfig, default_blocks: int, bytes_per_block: int) -> int:
    """Blocks of the KV pool: ``default_blocks``, or as many as ``kv_cache_mib`` holds; a
    pool smaller than one block is a start-up error."""
    if not config.kv_cache_mib:
        return default_blocks
    fit = config.kv_cache_mib * 2**20 // bytes_per_block
    if fit < 1:
        raise ValueError(f"--kv-cache-mib {config.kv_cache_mib} holds no KV block: one of {KV_BLOCK_SIZE} positions "
                         f"needs {bytes_per_block / 2**20:.2f} MiB")
    return fit


def check_token_ids(vocab: int, prompt_token_ids: Sequence[int], prediction_token_ids: Sequence[int],
                    sampling: SamplingParams) -> None:
    """``ValueError`` naming the first token id outside ``[0, vocab)``."""
    bias_ids = [token for token, _ in sampling.logit_bias]
    for ids, what in ((prompt_token_ids, "prompt"), (prediction_token_ids, "prediction"), (bias_ids, "logit_bias"),
                      (sampling.stop_token_ids, "stop_token_ids")):
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"{what} token id {bad} is outside the vocabulary [0, {vocab})")


def load_tokenizer(source: object) -> Tokenizer:
    if isinstance(source, dict):
        return Tokenizer.from_gguf_metadata(source)
    return Tokenizer.from_hf_folder(source)  # type: ignore[arg-type]


def return_freed_memory() -> None:
    """Hands the heap's free pages back to the system (glibc's ``malloc_trim``). Loading a
    model unpacks each weight's values before packing them; glibc keeps what was freed
    resident, and an engine over SmolLM2-135M Q4_K_M grew by 377 MiB where its model holds
    105 (132 MiB after the trim, its 16 MiB KV pool included). Nothing where the C library
    has no such call."""
    gc.collect()  # what only a cycle held
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, *, clock: Callable[[], float] = time.monotonic,
                 observer: EngineObserver | None = None):
        config = config or EngineConfig()
        if config.model.num_threads:
            torch.set_num_threads(config.model.num_threads)
        weights = read_weights(config.model.model)
        model = build_model(weights, config.model)
        tokenizer = load_tokenizer(weights.tokenizer_source)
        del weights  # the file's unpacked values, now packed into the model
        self._setup(config, model, tokenizer, clock, observer, drafter=None)
        return_freed_memory()  # the loader's, the drafter's and the calibration's

    @classmethod
    def from_parts(cls, config: EngineConfig, model: LlamaModel, tokenizer: Tokenizer, *,
                   drafter: Drafter | None = None, clock: Callable[[], float] = time.monotonic,
                   observer: EngineObserver | None = None) -> LLMEngine:
        """An engine over an already built model (tests with toy models, benchmarks)."""
        engine = cls.__new__(cls)
        engine._setup(config, model, tokenizer, clock, observer, drafter=drafter)
        return engine

    def _setup(self, config: EngineConfig, model: LlamaModel, tokenizer: Tokenizer, clock: Callable[[], float],
               observer: EngineObserver | None, drafter: Drafter | None) -> None:
        self.config = config
        self.clock = clock
        for warning in config.start_up_warnings():
            log.warning("%s", warning)
        threads = torch.get_num_threads()
        self.thread_governor = ThreadGovernor(threads) if config.model.adapt_threads and threads > 1 else None
        self.tokenizer = tokenizer
        self.model = model
        mc = self.model.config
        self.max_model_len = min(config.model.max_model_len, mc.max_position_embeddings)
        kv_dtype = torch.float32 if config.model.dtype == "float32" else torch.bfloat16
        blocks = kv_pool_blocks(config.scheduler, default_kv_blocks(config.scheduler, config.lane, self.max_model_len),
                                KVCache.bytes_per_block(mc.num_layers, KV_BLOCK_SIZE, mc.num_kv_heads, mc.head_dim, kv_dtype))
        self.cache = KVCache(mc.num_layers, blocks, KV_BLOCK_SIZE, mc.num_kv_heads, mc.head_dim, kv_dtype)
        log.info("KV pool: %.0f MiB, %d blocks of %d positions (%s), prefix cache %s", self.cache.bytes / 2**20, blocks,
                 KV_BLOCK_SIZE, str(kv_dtype).removeprefix("torch."), "on" if config.scheduler.prefix_cache else "off")
        if drafter is None and config.lane.speculation_enabled:
            drafter = create_drafter(config.lane.drafter, model=self.model, model_config=config.model,
                                     mtp_head=config.lane.mtp_head, min_draft_prob=config.lane.mtp_min_draft_prob,
                                     lookup=config.lane.mtp_lookup, suffix_cache_tokens=config.lane.suffix_cache_tokens,
                                     suffix_tree_branches=config.lane.suffix_tree_branches)
        self.drafter = drafter if config.lane.speculation_enabled else None
        lane = config.lane if self.drafter is not None else dataclasses.replace(config.lane, spec_mode="off")
        step_cost = None
        if self.drafter is not None and lane.spec_mode == "slice" and lane.spec_adaptive_k:
            # Widest tick: every slot decoding plus every lane slot verifying K drafts, or
            # a lone stream verifying its deeper round.
            max_rows = max(config.scheduler.max_num_seqs + lane.spec_slots * lane.num_draft_tokens,
                           1 + lane.max_draft_tokens)
            step_cost = calibration.step_cost(self.model, self.cache, max_rows)
            if isinstance(self.drafter, CostAware):  # auto scores its proposals per millisecond
                self.drafter.use_step_cost(step_cost.ms)
        self.scheduler = Scheduler(config.scheduler, lane, self.max_model_len, num_kv_blocks=blocks, step_cost=step_cost,
                                   cheap_starts=getattr(self.drafter, "cheap_starts", False))
        self.runner = ModelRunner(self.model, self.cache, self.drafter)
        self.counters = EngineCounters(generated_by_tenant=TenantTally(names=self.scheduler.tenant_names))
        self.counters.refresh(self.scheduler)  # the gauges (KV pool, queues) are true before the first tick
        self.observer = observer
        self._lock = threading.Lock()
        self._pending_aborts: list[str] = []
        self._detoks: dict[str, IncrementalDetokenizer] = {}
        self._last_token_s: dict[str, float] = {}
        self._prompt_logprobs_due: set[str] = set()  # asked for them; its first output carries them
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()

    @property
    def kv_pool(self) -> dict[str, object]:
        """The KV pool's size (``GET /health``): its MiB, its blocks and their positions, the
        dtype and whether the prefix cache is on."""
        cache = self.cache
        return {"mib": round(cache.bytes / 2**20, 1), "blocks": cache.num_blocks, "block_size": cache.block_size,
                "dtype": str(cache.dtype).removeprefix("torch."), "prefix_cache": self.config.scheduler.prefix_cache}

    # -- requests -------------------------------------------------------------------------
    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.tokenizer.eos_token_ids

    @property
    def grammars(self) -> GrammarCompiler:
        """The grammar compiler and its cache, built on first use (it reads the whole vocabulary)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.model.config.vocab_size)
            return self._grammars

    def compile_grammar(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile (or find in the cache) ``spec``; raises ``GrammarError`` naming the problem.
        Thread-safe: call it off the engine thread, as the server does."""
        return self.grammars.compile(spec)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        priority: int = 0,
        tenant: str = "anonymous",
        tenant_weight: float = 1.0,
        speculative: bool = True,
        prediction_token_ids: Sequence[int] = (),
        grammar: CompiledGrammar | GrammarSpec | None = None,
        prefill_source: str | None = None,
        global_cache_scope: bool = False,
    ) -> Request:
        """Queue a request. Raises ``ValueError`` (bad input, an invalid grammar) or ``QueueFullError``.

        ``grammar``: the output must match it (a spec is compiled here, on the caller's thread).
        ``prefill_source``: a queued request with the same prompt whose prompt KV this one
        reads through the prefix cache once it has prefilled (the ``n`` sequences of one prompt).
        ``global_cache_scope``: read and write the prefix cache's global scope, not the tenant's.
        """
        sampling = sampling or SamplingParams()
        if isinstance(grammar, GrammarSpec):
            grammar = self.compile_grammar(grammar)
        check_token_ids(self.model.config.vocab_size, prompt_token_ids, prediction_token_ids, sampling)
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling=sampling,
            arrival_s=self.clock(),
            priority=priority,
            tenant=tenant,
            tenant_weight=tenant_weight,
            speculative=speculative,
            prediction_token_ids=prediction_token_ids,
            eos_token_ids=self.eos_token_ids,
            grammar=grammar,
            prefill_source=prefill_source,
            global_cache_scope=global_cache_scope,
        )
        with self._lock:
            source = self.scheduler.get(prefill_source) if prefill_source is not None else None
            if source is None or source.prompt_token_ids != request.prompt_token_ids:
                request.prefill_source = None  # nothing to share: prefill as usual
            self.scheduler.add_request(request, request.arrival_s)
            self._detoks[request_id] = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, sampling.stop,
                                                            min_tokens=sampling.min_tokens)
            if sampling.prompt_logprobs is not None:
                self._prompt_logprobs_due.add(request_id)
        return request

    def abort_request(self, request_id: str) -> None:
        """Cancel; takes effect (KV freed, lane passed on) at the next tick boundary."""
        with self._lock:
            self._pending_aborts.append(request_id)

    def exchange_lane_service(self, remote: dict[str, float] | None, active_elsewhere: set[str] | None = None,
                              since: int = 0, resets: Sequence[ResetBatch] = ()) -> ChargeReport:
        """Take the lane service the other replicas charged per tenant (``remote``, cumulative;
        None: nothing new), the tenants with requests there (None: unchanged) and the tenants
        whose remote service restarts from zero (``resets``), and return what this engine
        charged or dropped after version ``since`` (0: every tenant's) with the version now
        (replicas, ``cluster/``; ``scheduler/fairness.py``). Any thread: the lane changes
        under the engine's lock, between ticks' scheduling."""
        with self._lock:
            if remote or active_elsewhere is not None or resets:
                self.scheduler.lane.set_remote_service(remote or {}, active_elsewhere, resets)
            return self.scheduler.lane.charged_service(since)

    def has_unfinished(self) -> bool:
        with self._lock:
            return self.scheduler.has_unfinished() or bool(self._pending_aborts)

    # -- one tick -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        with self._lock:
            now = self.clock()
            for rid in self._pending_aborts:
                request = self.scheduler.abort_request(rid, now)
                if request is not None:
                    outputs.append(self._final_output(request, ""))
            self._pending_aborts.clear()
            plan = self.scheduler.schedule(now)
        self.runner.release(plan.released_request_ids)  # aborted (or left) since the last tick
        if plan.is_empty:
            if plan.preempted_request_ids:
                self.runner.release(plan.preempted_request_ids, preempted=True)
            with self._lock:
                self.counters.refresh(self.scheduler)  # gauges stay true when idle
            if self.observer is not None:
                self.observer.on_idle()
            return outputs
        self._follow_free_cores()
        started = time.perf_counter()
        result = self.runner.execute(plan)
        with self._lock:
            now = self.clock()
            events = self.scheduler.update(plan, result, now)
            outputs.extend(self._emit(events, now, {seq.request_id: seq.logprobs for seq in result.seqs}))
            self.counters.record_tick(self.scheduler, time.perf_counter() - started)
            released = self.scheduler.take_released()  # finished this tick: free drafter state now
        self.runner.release(released)
        if self.thread_governor is not None and not self.scheduler.has_unfinished():
            self.thread_governor.idle()  # the counters of an idle stretch start here
        if self.observer is not None:
            self.observer.on_tick(time.perf_counter() - started)
        return outputs

    def _emit(self, events, now: float, logprobs: dict[str, tuple[TokenLogprob, ...]]) -> list[RequestOutput]:
        outputs = []
        for event in events:
            request = event.request
            rid = request.request_id
            detok = self._detoks[rid]
            kept_before = request.num_output_tokens - len(event.new_token_ids)
            step = detok.extend(event.new_token_ids)
            text = step.text
            new_ids = event.new_token_ids[: step.num_tokens]
            if step.stopped:
                self.scheduler.stop_at(request, kept_before + step.num_tokens, now)
            finished = request.is_finished
            if finished and not step.stopped:
                text += detok.flush().text
            self.counters.record_tokens(request.tenant, len(new_ids))
            if self.observer is not None and new_ids:
                last = self._last_token_s.get(rid)
                if last is None:
                    self.observer.on_first_token(now - request.arrival_s)
                else:
                    self.observer.on_token_gap((now - last) / len(new_ids), len(new_ids))
            self._last_token_s[rid] = now
            # The runner's logprobs cover the tokens it chose; the kept ones are a prefix.
            kept_logprobs = list(logprobs.get(rid, ())[: len(new_ids)]) if request.sampling.logprobs is not None else None
            if finished:
                outputs.append(self._final_output(request, text, new_ids, kept_logprobs))
            else:
                outputs.append(self._output(request, text, new_ids, False, kept_logprobs))
        return outputs

    def _output(self, request: Request, text: str, new_ids: list[int], finished: bool,
                logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            text=text,
            token_ids=new_ids,
            finished=finished,
            finish_reason=finish_reason(request.status) if finished else None,
            prompt_tokens=request.num_prompt_tokens,
            completion_tokens=request.num_output_tokens,
            cached_tokens=request.num_cached_tokens or 0,
            speculative=request.spec.as_dict(),
            logprobs=logprobs if request.sampling.logprobs is not None else None,
            prompt_logprobs=self._take_prompt_logprobs(request),
            error=request.error if finished else None,
            bad_request=finished and request.error is not None,
        )

    def _take_prompt_logprobs(self, request: Request) -> list[TokenLogprob] | None:
        """Once, on the request's first output: its prompt logprobs, if it has them all (an
        abort before its first token may leave them partial: None then)."""
        if request.request_id not in self._prompt_logprobs_due:
            return None
        self._prompt_logprobs_due.discard(request.request_id)
        return None if request.needs_prompt_logprobs else list(request.prompt_logprobs)

    def _follow_free_cores(self) -> None:
        """Between ticks, on the engine thread (the thread whose OpenMP regions run the forward)."""
        threads = self.thread_governor.update() if self.thread_governor is not None else None
        if threads is not None:
            log.info("threads: %d (other processes keep %s of %d cores busy)", threads,
                     "some" if threads < self.thread_governor.max_threads else "none", self.thread_governor.cores)
            torch.set_num_threads(threads)

    def _final_output(self, request: Request, text: str, new_ids: list[int] | None = None,
                      logprobs: list[TokenLogprob] | None = None) -> RequestOutput:
        self._detoks.pop(request.request_id, None)
        self._last_token_s.pop(request.request_id, None)
        self.runner.finish(request)  # before its release: a drafter may keep its output for the tenant
        if self.observer is not None:
            self.observer.on_finish(request)
        return self._output(request, text, new_ids or [], True, logprobs or [])

    # -- whole generations (offline use and tests) ---------------------------------------
    def run_until_done(self) -> list[RequestOutput]:
        outputs = []
        while self.has_unfinished():
            outputs.extend(self.step())
        return outputs
