"""The serving engine with the real model: continuous batching changes nothing a request
sees, stop strings and max_tokens stop exactly, the async front streams and aborts, and
nothing leaks.

Exactness holds in float32 (``llm_f32``): a batched forward and a single-row forward run
the same maths in a different blocking (noise ~3e-5 on logits), far below any margin
that decides a token here. The default configuration's kernels (bfloat16, int4 for
narrow batches, float32 dense copies for wide ones) change with the batch width, so its
batched == alone test is separate, and marked as an expected failure until the kernels
agree (see its reason).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import weakref
from collections.abc import Sequence

import pytest

from speclane.engine.async_engine import AsyncEngine
from speclane.engine.engine import LLMEngine
from speclane.request import Request, SamplingParams
from speclane.scheduler.plan import RunnerResult, SchedulerPlan, SeqResult

pytestmark = pytest.mark.slow

STORY = (
    "In the spring of 1887, a young cartographer named Elena left her village in the "
    "mountains to map the river delta for the royal survey. She carried a brass compass, "
    "three notebooks, a letter from her teacher and a small loaf of bread. The first week "
    "she followed the river through pine forests and narrow gorges, sleeping in barns and "
    "trading sketches for soup. In the second week the valley opened into wide marshes "
    "full of herons, and the river split into a hundred channels that changed with the "
    "tide. Elena learned to read the water by its colour, to wait for the morning fog to "
    "lift, and to measure distances by counting her steps between the old stone markers."
)
PROMPT_LENGTHS = (3, 9, 17, 30, 44, 58, 75, 96)  # 332 tokens in all: more than one tick's budget


def prompts_of(llm, lengths: Sequence[int] = PROMPT_LENGTHS) -> list[list[int]]:
    ids = llm.tokenizer.encode(STORY)
    assert len(ids) >= max(lengths)
    return [ids[:n] for n in lengths]


def run_together(engine: LLMEngine, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> tuple[list[list[int]], list[str], int]:
    """All requests in one continuous batch; (token ids, text, most requests running at once)."""
    rids = [f"together-{i}" for i in range(len(prompts))]
    for rid, prompt, sp in zip(rids, prompts, params, strict=True):
        engine.add_request(rid, prompt, sp)
    tokens: dict[str, list[int]] = {rid: [] for rid in rids}
    texts: dict[str, str] = {rid: "" for rid in rids}
    most_running = 0
    while engine.has_unfinished():
        outputs = engine.step()
        most_running = max(most_running, engine.scheduler.num_running + sum(o.finished for o in outputs))
        for out in outputs:
            tokens[out.request_id] += out.token_ids
            texts[out.request_id] += out.text
    return [tokens[r] for r in rids], [texts[r] for r in rids], most_running


def run_alone(llm, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> tuple[list[list[int]], list[str]]:
    results = [llm.generate([list(p)], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    return [r.token_ids for r in results], [r.text for r in results]


# -- batched == alone ----------------------------------------------------------------------
def test_eight_concurrent_greedy_requests_equal_each_alone_float32(llm_f32):
    prompts = prompts_of(llm_f32)
    params = [SamplingParams(max_tokens=12)] * len(prompts)
    alone_tokens, alone_texts = run_alone(llm_f32, prompts, params)
    tokens, texts, most_running = run_together(llm_f32.engine, prompts, params)
    assert most_running == 8
    assert tokens == alone_tokens
    assert texts == alone_texts
    assert all(texts)


def test_seeded_sampled_request_is_the_same_alone_or_beside_seven_others_float32(llm_f32):
    prompts = prompts_of(llm_f32)
    seeded = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=1234)
    others = [SamplingParams(max_tokens=16, temperature=1.0)] * 4 + [SamplingParams(max_tokens=16)] * 3
    [alone], [alone_text] = run_alone(llm_f32, prompts[4:5], [seeded])
    order = [*prompts[:4], prompts[4], *prompts[5:]]
    tokens, texts, most_running = run_together(llm_f32.engine, order, [*others[:4], seeded, *others[4:]])
    assert most_running == 8
    assert tokens[4] == alone and texts[4] == alone_text
    # The seed matters (the test would not notice a request ignoring it otherwise).
    [other_seed], _ = run_alone(llm_f32, prompts[4:5], [SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=99)])
    assert other_seed != alone


# -- stop strings and max_tokens -----------------------------------------------------------
def stream(engine: LLMEngine, prompt: Sequence[int], sampling: SamplingParams, rid: str = "stream"):
    engine.add_request(rid, prompt, sampling)
    outputs = []
    while engine.has_unfinished():
        outputs += [o for o in engine.step() if o.request_id == rid]
    assert outputs and outputs[-1].finished and sum(o.finished for o in outputs) == 1
    return outputs


def test_a_stop_string_in_the_middle_is_not_emitted_and_nothing_past_it_is_streamed(llm_f32):
    prompt = llm_f32.tokenizer.encode(STORY[:200])
    [full] = llm_f32.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))
    text = full.text
    # A stop string across a token boundary: the last 2 characters of token 9 and the
    # first 3 characters after it.
    boundary = len(llm_f32.tokenizer.decode(full.token_ids[:10]))
    stop = text[boundary - 2 : boundary + 3]
    assert len(stop) == 5 and text.find(stop) == boundary - 2, (text, stop)

    outputs = stream(llm_f32.engine, prompt, SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)))
    streamed = "".join(o.text for o in outputs)
    assert streamed == text[: boundary - 2]
    assert outputs[-1].finish_reason == "stop"
    assert all(stop not in o.text for o in outputs)
    # Tokens are kept up to the one that completed the stop string, none past it.
    tokens = [t for o in outputs for t in o.token_ids]
    assert tokens == full.token_ids[: len(tokens)] and 10 <= len(tokens) <= 11
    assert outputs[-1].completion_tokens == len(tokens)


def test_a_stop_string_at_the_very_start_gives_empty_text(llm_f32):
    prompt = llm_f32.tokenizer.encode(STORY[:200])
    [full] = llm_f32.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))
    outputs = stream(llm_f32.engine, prompt, SamplingParams(max_tokens=24, stop=(full.text[:2],)))
    assert "".join(o.text for o in outputs) == "" and outputs[-1].finish_reason == "stop"


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_max_tokens_gives_exactly_that_many_tokens(llm_f32, max_tokens: int):
    prompt = llm_f32.tokenizer.encode(STORY[:120])
    outputs = stream(llm_f32.engine, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert sum(len(o.token_ids) for o in outputs) == max_tokens
    assert outputs[-1].completion_tokens == max_tokens and outputs[-1].finish_reason == "length"


def test_max_model_len_stops_the_completion(llm_f32):
    limit = llm_f32.engine.max_model_len
    prompt = (llm_f32.tokenizer.encode(STORY) * 20)[: limit - 3]
    outputs = stream(llm_f32.engine, prompt, SamplingParams(max_tokens=100, ignore_eos=True))
    assert sum(len(o.token_ids) for o in outputs) == 3
    assert outputs[-1].finish_reason == "length"


# -- the default configuration -------------------------------------------------------------
def test_default_config_eight_concurrent_greedy_requests_equal_each_alone(llm_default):
    prompts = prompts_of(llm_default)
    params = [SamplingParams(max_tokens=12)] * len(prompts)
    alone_tokens, _ = run_alone(llm_default, prompts, params)
    tokens, _, most_running = run_together(llm_default.engine, prompts, params)
    assert most_running == 8
    differ = [i for i in range(8) if tokens[i] != alone_tokens[i]]
    assert not differ, f"prompts {differ} differ batched vs alone in the default config"


# -- the async front -----------------------------------------------------------------------
async def _collect(stream):
    return [out async for out in stream]


def wait_idle(engine: LLMEngine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished() or engine.scheduler.kv.num_holders:
        assert time.monotonic() < deadline, "the engine did not free the aborted request"
        time.sleep(0.01)


def test_async_engine_streams_and_abort_frees_the_slot(llm_f32):
    engine = llm_f32.engine
    prompt = llm_f32.tokenizer.encode(STORY[:150])
    [offline] = llm_f32.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))
    front = AsyncEngine(engine)

    async def scenario():
        # 1. A stream delivers the offline text piece by piece.
        outputs = await _collect(await front.generate(prompt, SamplingParams(max_tokens=10, ignore_eos=True)))
        assert len(outputs) == 10 and outputs[-1].finished and outputs[-1].finish_reason == "length"
        assert "".join(o.text for o in outputs) == offline.text

        # 2. abort(request_id) ends a stream with finish_reason "abort"; a neighbour is unaffected.
        long = await front.generate(prompt, SamplingParams(max_tokens=500, ignore_eos=True), request_id="long")
        neighbour = asyncio.ensure_future(_collect(
            await front.generate(prompt, SamplingParams(max_tokens=10, ignore_eos=True))))
        first = await long.__anext__()
        assert not first.finished
        front.abort("long")
        rest = [out async for out in long]
        assert rest[-1].finished and rest[-1].finish_reason == "abort"
        assert sum(len(o.token_ids) for o in [first, *rest]) < 500
        assert "".join(o.text for o in await neighbour) == offline.text

        # 3. A client that goes away (closes its stream) aborts the request.
        gone = await front.generate(prompt, SamplingParams(max_tokens=500, ignore_eos=True), request_id="gone")
        await gone.__anext__()
        await gone.aclose()

    try:
        asyncio.run(scenario())
        wait_idle(engine)
        assert front.num_streams == 0 and front.error is None
    finally:
        front.shutdown()
    assert engine.scheduler.kv.num_holders == 0 and not engine._detoks


def test_async_duplicate_request_id_does_not_orphan_the_live_stream(llm_f32):
    front = AsyncEngine(llm_f32.engine)

    async def scenario():
        live = await front.generate([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), request_id="dup")
        with pytest.raises(ValueError, match="already in use"):
            await front.generate([1, 2, 3], SamplingParams(max_tokens=3), request_id="dup")
        registered = front.num_streams == 1
        if not registered:  # the stream would hang: end its request instead of waiting
            front.abort("dup")
            await live.aclose()
            return False
        outputs = await asyncio.wait_for(_collect(live), 60)
        return outputs[-1].finish_reason == "length"

    try:
        ok = asyncio.run(scenario())
        wait_idle(llm_f32.engine)
    finally:
        front.shutdown()
    assert ok, "the first stream of a duplicated id was unregistered"


def test_a_rejected_prompt_leaves_no_orphan_requests(llm_f32):
    engine = llm_f32.engine
    with pytest.raises(ValueError, match="max-model-len"):
        llm_f32.generate(["hello", [1] * engine.max_model_len], SamplingParams(max_tokens=2))
    orphans = [*engine.scheduler.waiting, *engine.scheduler.running]
    for rid in orphans:
        engine.abort_request(rid)
    engine.run_until_done()
    assert not orphans


def test_a_generate_interrupted_mid_batch_leaves_nothing_for_the_next(llm_f32, monkeypatch):
    """An interrupt (or an engine error) during the batch's ticks aborts its requests: the
    next generate runs alone and gives what it gives on a clean engine."""
    engine = llm_f32.engine
    expected = llm_f32.generate(["Name three colours."], SamplingParams(max_tokens=8))[0].token_ids
    real_step, ticks = engine.step, [0]

    def interrupted() -> list:
        ticks[0] += 1
        if ticks[0] == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm_f32.generate(["Write a long story.", "Count to fifty."], SamplingParams(max_tokens=200))
    monkeypatch.setattr(engine, "step", real_step)
    assert not engine.has_unfinished()
    assert llm_f32.generate(["Name three colours."], SamplingParams(max_tokens=8))[0].token_ids == expected


# -- nothing leaks -------------------------------------------------------------------------
class FakeRunner:
    """Stands in for the model: random real token ids (so the detokenizer and stop strings
    work on text), EOS now and then. Keeps no reference to plans or requests."""

    def __init__(self, rng: random.Random, token_ids: Sequence[int], eos: int):
        self.rng = rng
        self.token_ids = list(token_ids)
        self.eos = eos
        self.released: set[str] = set()
        self.ran: set[str] = set()

    def release(self, request_ids: Sequence[str]) -> None:
        self.released.update(request_ids)

    def finish(self, request: Request) -> None:
        pass  # no drafter keeps outputs here

    def execute(self, plan: SchedulerPlan) -> RunnerResult:
        results = []
        self.ran.update(seq.request_id for seq in plan.seqs)
        for seq in plan.seqs:
            token = self.eos if self.rng.random() < 0.05 else self.rng.choice(self.token_ids)
            results.append(SeqResult(seq.request_id, (token,) if seq.sample else ()))
        return RunnerResult(tuple(results))


def test_1000_random_events_through_the_engine_leave_nothing_behind(llm_f32):
    engine = llm_f32.engine
    rng = random.Random(7)
    words = llm_f32.tokenizer.encode(STORY)
    real_runner = engine.runner
    fake = engine.runner = FakeRunner(rng, words, llm_f32.tokenizer.eos_token_id)
    refs: list[weakref.ref[Request]] = []
    live: list[str] = []
    finished = rejected = 0
    try:
        for event in range(1000):
            kind = rng.choices(["add", "abort", "step"], weights=[3, 1, 4])[0]
            if kind == "add":
                rid = f"random-{event}"
                sampling = SamplingParams(max_tokens=rng.randint(1, 12), stop=rng.choice([(), ("the",), (" a", "er")]))
                try:
                    refs.append(weakref.ref(engine.add_request(rid, words[: rng.randint(1, 40)], sampling)))
                    live.append(rid)
                except Exception:  # the queue is full
                    rejected += 1
            elif kind == "abort" and live:
                engine.abort_request(rng.choice(live))
            else:
                finished += sum(o.finished for o in engine.step())
        for rid in live:
            engine.abort_request(rid)
        engine.run_until_done()
    finally:
        engine.runner = real_runner
    assert finished > 50 and len(refs) > 200
    # Every request that ever ran (held a KV slot) was released to the runner: no drafter
    # state can outlive it. (A request aborted while still queued never reached the runner.)
    assert fake.ran <= fake.released <= set(live)
    assert len(fake.ran) > 200
    assert engine.scheduler.kv.num_holders == 0 and not engine.scheduler.has_unfinished()
    assert not engine._detoks and not engine._last_token_s and not engine._pending_aborts
    gc.collect()
    alive = [ref() for ref in refs if ref() is not None]
    assert not alive, f"{len(alive)} request objects are still referenced, e.g. {alive[0].request_id}"


def test_a_new_engines_gauges_are_true_before_its_first_tick(llm_f32):
    """What /metrics reads of an engine that has served nothing (a replica just started or
    restarted): its whole KV pool free, nothing running; not zeros until a first request."""
    engine = LLMEngine.from_parts(llm_f32.engine.config, llm_f32.engine.model, llm_f32.engine.tokenizer)
    snapshot = engine.counters.snapshot()
    assert snapshot["kv_blocks_total"] == engine.scheduler.kv.pool.num_blocks > 0
    assert snapshot["kv_blocks_free"] == snapshot["kv_blocks_total"] and snapshot["running"] == 0
