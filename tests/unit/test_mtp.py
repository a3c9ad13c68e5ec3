"""The MTP drafter on a toy model: training matches drafting, the pipeline learns,
heads load only for their target, and drafting never changes greedy output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from speclane.config import EngineConfig
from speclane.drafters.mtp import MTPDrafter, load_mtp_drafter
from speclane.drafters.ngram import NgramDrafter
from speclane.engine.engine import LLMEngine
from speclane.kernels.select import Kernels
from speclane.models.mtp_head import MTPCache, MTPConfig, MTPHead
from speclane.models.mtp_kernel_step import KernelHead, drafting_head, supported
from speclane.models.mtp_store import MTPHeadError, load_head, save_head, target_fingerprint
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams
from speclane.training.capture import generate_samples
from speclane.training.objective import recursive_mask, recursive_outputs
from speclane.training.prompts import training_prompts
from speclane.training.train_mtp import train_head

VOCAB = 16
# hidden 128 (head_dim 32): the smallest toy whose head our attention kernel takes.
KERNEL_TOY = toy_config(vocab_size=VOCAB, hidden_size=128)
needs_kernel_head = pytest.mark.skipif(
    not supported(MTPConfig(128, 256, 4, 2, 16), Kernels.load("auto")), reason="our kernels do not build here")


def random_head(model, draft_vocab: int = 12, seed: int = 0) -> MTPHead:
    torch.manual_seed(seed)
    cfg = model.config
    head = MTPHead(MTPConfig(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, draft_vocab, window=64))
    head.vocab_ids.copy_(torch.randperm(cfg.vocab_size)[:draft_vocab])
    head.attach_target(model.embedding_table(), model.head_table())
    return head.eval()


def test_recursive_mask_matches_what_drafting_sees():
    # Step 3 at index 5 stands for the draft two positions after true entry 3: it sees
    # true entries 0..3, the step-2 entry at 4 and itself (step-3 entry at 5).
    m = recursive_mask(8, 3)
    assert m.shape == (8, 24)
    assert m[5, :8].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert m[5, 8:16].nonzero().flatten().tolist() == [4]
    assert m[5, 16:].nonzero().flatten().tolist() == [5]
    assert recursive_mask(4, 1).equal(torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_parallel_training_forward_equals_incremental_drafting():
    """Step s of the training forward at position p == the drafter's recursive entry there."""
    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)
    gen = torch.Generator().manual_seed(1)
    length = 12
    hidden = torch.randn(1, length, model.config.hidden_size, generator=gen)
    tokens = torch.randint(0, VOCAB, (length + 3,), generator=gen)
    positions = torch.arange(length)[None] + 7  # absolute positions need not start at 0
    batch = {"hidden": hidden, "next": tokens[1 : length + 1][None], "positions": positions}
    with torch.no_grad():
        outs = recursive_outputs(head, batch, steps=3)
    t = 6  # last true entry
    cache = MTPCache.empty(head.config, 7)
    o = head.extend(cache, hidden[0, : t + 1], tokens[1 : t + 2], positions[0, : t + 1])[-1:]
    torch.testing.assert_close(o, outs[0][0, t : t + 1], atol=1e-5, rtol=1e-5)
    for s in (2, 3):
        p = t + s - 1
        o = head.extend(cache, o, tokens[p + 1 : p + 2], positions[0, p : p + 1])
        torch.testing.assert_close(o, outs[s - 1][0, p : p + 1], atol=1e-5, rtol=1e-5)


def train_args(tmp: Path, **overrides) -> argparse.Namespace:
    values = dict(steps=80, batch_size=4, lr=3e-3, draft_steps=2, draft_vocab=12, held_out=0.2,
                  checkpoint_every=20, seed=0, precision="auto")
    values.update(overrides)
    return argparse.Namespace(**values)


def toy_engine(model, drafter_object=None, **changes) -> LLMEngine:
    # Fixed K: these tests drive the drafter's state through yields and grants; on a toy
    # model the head's drafting dwarfs the forward, so adaptive K would rightly draft nothing.
    options = dict(dtype="float32", quantization="none", max_model_len=128, max_num_seqs=8, max_num_batched_tokens=512,
                   spec_adaptive_k=False)
    config = EngineConfig().replace(**{**options, **changes})
    return LLMEngine.from_parts(config, model, toy_tokenizer(VOCAB), drafter=drafter_object)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[object, Path, dict]:
    """A tiny end-to-end train-mtp: the toy target writes text, a head learns it."""
    out = tmp_path_factory.mktemp("mtp")
    model = toy_model(toy_config(vocab_size=VOCAB), seed=5)
    engine = toy_engine(model, spec_mode="off", prefix_cache=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, VOCAB, (6,), generator=gen).tolist() for _ in range(24)]
    samples = generate_samples(engine, prompts, out / "data", max_new_tokens=40, concurrency=8, log=lambda line: None)
    assert len(samples) == 24 and all(s.hidden.shape[0] == len(s.token_ids) - 1 for s in samples)
    path = train_head(model, "toy", samples, out, train_args(out))
    report = json.loads((out / "report.json").read_text())
    return model, path, report


def test_tiny_training_run_decreases_the_loss_and_writes_a_loadable_head(trained):
    model, path, report = trained
    first, final = report["training"]["first_loss"], report["training"]["final_loss"]
    assert final[0] < 0.8 * first[0], f"step-1 loss {first[0]:.3f} -> {final[0]:.3f}"
    assert final[1] < first[1]
    head = load_head(path, model, "toy")
    assert head.config.draft_vocab == 12
    assert report["acceptance"]["acceptance_per_position"][0] > 0.5  # chance is 1/12 on the toy
    assert report["acceptance"]["rounds"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_training_learns_in_either_precision_and_records_it(trained, tmp_path, precision):
    """bfloat16 autocast (what auto picks on a CPU with native bfloat16) learns like float32."""
    model, _, _ = trained
    engine = toy_engine(model, spec_mode="off", prefix_cache=False)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (6,), generator=gen).tolist() for _ in range(12)]
    samples = generate_samples(engine, prompts, tmp_path / "data", max_new_tokens=30, concurrency=6, log=lambda line: None)
    path = train_head(model, "toy", samples, tmp_path, train_args(tmp_path, steps=40, precision=precision))
    meta = json.loads((path / "config.json").read_text())["training"]
    assert meta["precision"] == precision
    assert meta["final_loss"][0] < 0.8 * meta["first_loss"][0]
    load_head(path, model, "toy")


def test_auto_precision_is_bf16_only_with_native_bfloat16():
    from speclane.kernels.build import missing_cpu_flags
    from speclane.training.train_mtp import use_bf16

    assert use_bf16("auto") == (not missing_cpu_flags("avx512bf16"))
    assert use_bf16("bf16") and not use_bf16("fp32")


def test_generate_samples_resumes_from_its_shards(tmp_path):
    model = toy_model(toy_config(vocab_size=VOCAB), seed=5)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    first = generate_samples(toy_engine(model, spec_mode="off", prefix_cache=False), prompts[:2], tmp_path, 5, 2, shard_size=1, log=lambda line: None)
    assert len(list(tmp_path.glob("shard-*.pt"))) == 2
    again = generate_samples(toy_engine(model, spec_mode="off", prefix_cache=False), prompts, tmp_path, 5, 2, shard_size=1, log=lambda line: None)
    assert len(first) == 2 and len(again) == 3  # only the third prompt was generated
    assert [s.token_ids[:3] for s in again] == prompts


def test_head_for_another_model_is_a_clear_error(trained, tmp_path):
    model, path, _ = trained
    other = toy_model(toy_config(vocab_size=VOCAB), seed=6)  # same shape, other weights
    with pytest.raises(MTPHeadError, match="trained for 'toy'.*embedding fingerprint"):
        load_head(path, other, "other")
    bigger = toy_model(toy_config(vocab_size=VOCAB, hidden_size=64), seed=5)
    with pytest.raises(MTPHeadError, match="hidden_size"):
        load_head(path, bigger, "bigger")


def test_corrupt_or_missing_head_is_a_clear_error(trained, tmp_path):
    model, path, _ = trained
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((path / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:200])
    with pytest.raises(MTPHeadError, match="corrupt"):
        load_head(broken, model, "toy")
    with pytest.raises(MTPHeadError, match="no MTP head at"):
        load_head(tmp_path / "nowhere", model, "toy")
    with pytest.raises(MTPHeadError, match="no MTP head is shipped.*train-mtp"):
        load_mtp_drafter(model, EngineConfig().model.__class__(model="toy-without-head"))


def test_save_load_roundtrip_keeps_the_drafts(tmp_path):
    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)
    path = save_head(head, tmp_path / "h", target_fingerprint(model, "toy"))
    loaded = load_head(path, model, "toy")
    x = torch.randn(5, model.config.hidden_size)
    cache_a, cache_b = MTPCache.empty(head.config, 0), MTPCache.empty(head.config, 0)
    nxt, pos = torch.tensor([1, 2, 3, 4, 5]), torch.arange(5)
    a = head.draft_logits(head.extend(cache_a, x, nxt, pos)).argmax(-1)
    b = loaded.draft_logits(loaded.extend(cache_b, x, nxt, pos)).argmax(-1)
    assert (a == b).float().mean() >= 0.8  # bfloat16 storage: near-ties may flip, most may not


def generate(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 24) -> dict[str, list[int]]:
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, sp)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for out in engine.run_until_done():
        tokens[out.request_id].extend(out.token_ids)
    assert engine.scheduler.kv.num_holders == 0 and engine.scheduler.kv.num_available_blocks == engine.cache.num_blocks
    return tokens


@pytest.mark.parametrize("lookup", [False, True], ids=["head", "lookup+head"])
@pytest.mark.parametrize("grant_rounds", [0, 1])
def test_greedy_with_mtp_equals_classic_including_forced_yields(trained, grant_rounds, lookup):
    """grant_rounds=1 with one slot: every request yields after each round and waits while
    the others draft, so each grant re-seeds the head from positions decoded classically.
    With lookup, rounds drafted by lookup leave the head's positions pending in between."""
    model, path, _ = trained
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 3, 9, 3, 9], [2, 2, 8], [11, 12, 13, 14, 15]]
    off = generate(toy_engine(model, spec_mode="off"), prompts)
    drafter = MTPDrafter(load_head(path, model, "toy"), VOCAB, lookup=NgramDrafter() if lookup else None)
    engine = toy_engine(model, drafter, drafter="mtp", spec_mode="slice", spec_slots=1, num_draft_tokens=3,
                        spec_grant_rounds=grant_rounds)
    assert generate(engine, prompts) == off
    assert engine.counters.accepted_tokens > 0
    if not lookup:  # some drafts were rejected (lookup's on this looping text: all accepted)
        assert engine.counters.draft_tokens > engine.counters.accepted_tokens
    assert not drafter.states, "finished requests leave no drafter state behind"
    if lookup:  # the toy's text repeats itself: both ways of drafting were used
        assert 0 < drafter.lookup_proposals < drafter.proposals


def test_lookup_drafts_a_repeated_ngram_and_the_head_catches_up_after():
    """A round whose last tokens appeared before is drafted by lookup: what followed them,
    with the head not run (its positions stay pending; no timing for adaptive K). The next
    round without a match catches the head up on all of them at once: the same drafts as
    a head-only drafter that caught up round by round."""
    from speclane.request import Request

    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)
    with_lookup, head_only = MTPDrafter(head, VOCAB, lookup=NgramDrafter()), MTPDrafter(head, VOCAB)
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(30, model.config.hidden_size, generator=gen)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    requests = {}
    for name, drafter in (("lookup", with_lookup), ("head", head_only)):
        request = Request(request_id=name, prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=16, temperature=0))
        request.output_token_ids.extend([11, 12, 1, 2])  # ends with "1 2": seen at the prompt's start
        drafter.observe(request, 0, hidden[:13])
        requests[name] = request
    draft = with_lookup.propose(requests["lookup"], 3)
    assert draft.token_ids == [3, 4, 5] and draft.catch_up_ms is None
    assert with_lookup.lookup_proposals == 1
    assert "lookup" not in with_lookup.states or with_lookup.states["lookup"].cache is None
    head_only.propose(requests["head"], 3)  # the head-only drafter drafts this round itself
    for name, drafter in (("lookup", with_lookup), ("head", head_only)):
        requests[name].output_token_ids.extend([13, 14])  # no match for "13 14" anywhere
        drafter.observe(requests[name], 13, hidden[13:15])
    a, b = with_lookup.propose(requests["lookup"], 3), head_only.propose(requests["head"], 3)
    assert with_lookup.lookup_proposals == 1 and len(a.token_ids) == 3
    assert with_lookup.states["lookup"].cache.end == head_only.states["head"].cache.end == 15
    assert a.token_ids == b.token_ids


def test_engine_mtp_lookup_follows_the_config(trained):
    model, path, _ = trained
    for flag in (True, False):
        drafter = load_mtp_drafter(model, EngineConfig().model.__class__(model="toy"), mtp_head=str(path), lookup=flag)
        assert (drafter.lookup is not None) == flag
    assert EngineConfig().lane.mtp_lookup  # served with lookup unless --no-mtp-lookup


def test_drafter_reseeds_after_waiting_past_its_window():
    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)  # window 64
    drafter = MTPDrafter(head, VOCAB)
    prompts = [list(range(1, 15)) * 7]  # 98 tokens: longer than the window
    off = generate(toy_engine(model, spec_mode="off"), prompts, max_tokens=8)
    engine = toy_engine(model, drafter, drafter="mtp", spec_mode="slice", num_draft_tokens=2, max_num_batched_tokens=16)
    assert generate(engine, prompts, max_tokens=8) == off
    assert engine.counters.draft_tokens > 0


def test_drafter_catch_up_uses_only_the_last_window_positions():
    from speclane.request import Request

    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)  # window 64
    drafter = MTPDrafter(head, VOCAB)
    gen = torch.Generator().manual_seed(2)
    request = Request(request_id="a", prompt_token_ids=torch.randint(1, VOCAB, (100,), generator=gen).tolist(),
                      sampling=SamplingParams(max_tokens=8, temperature=0))
    request.output_token_ids.append(3)
    hidden = torch.randn(100, model.config.hidden_size, generator=gen)
    for start in range(0, 100, 10):  # prefill chunks of 10, as the runner reports them
        drafter.observe(request, start, hidden[start : start + 10])
    draft = drafter.propose(request, 3)
    state = drafter.states["a"]
    assert (state.cache.first, state.cache.end) == (36, 100)  # entries of positions 36..99, nothing speculative
    assert not state.pending
    # The same drafts as a head seeded directly with those 64 positions.
    tokens = list(request.token_ids())
    cache = MTPCache.empty(head.config, 36)
    out = head.extend(cache, hidden[36:], torch.tensor(tokens[37:101]), torch.arange(36, 100))[-1:]
    from speclane.drafters.mtp import draft_recursively

    assert draft.token_ids == draft_recursively(head, cache, out, 99, 3).token_ids


def test_a_decode_ticks_rows_stay_views_of_it_and_a_tick_with_a_prompt_chunk_is_copied():
    """The runner hands the drafter one tensor per tick (``observe_tick``). A decode tick's
    rows stay views of it until the catch-up (no copy per request and tick); a tick with a
    prompt chunk (a span over SHARED_SPAN_ROWS rows) is copied per request, the window's
    rows only, so that no view keeps the chunk alive. The drafts are those of a drafter fed
    each request's rows one by one."""
    from speclane.drafters.mtp import SHARED_SPAN_ROWS
    from speclane.request import Request

    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)  # window 64
    shared, one_by_one = MTPDrafter(head, VOCAB), MTPDrafter(head, VOCAB)
    gen = torch.Generator().manual_seed(5)
    size = model.config.hidden_size
    prompt_len = 100
    requests = {rid: Request(request_id=rid, prompt_token_ids=torch.randint(1, VOCAB, (prompt_len,), generator=gen).tolist(),
                             sampling=SamplingParams(max_tokens=8, temperature=0)) for rid in ("a", "b", "c")}

    def tick_of(spans, tick):
        shared.observe_tick(spans, tick)
        for request, start, row, rows in spans:
            one_by_one.observe(request, start, tick[row : row + rows].clone())

    chunk = torch.randn(2 * prompt_len, size, generator=gen)  # both prompts in one prefill tick
    tick_of([(requests["a"], 0, 0, prompt_len), (requests["b"], 0, prompt_len, prompt_len)], chunk)
    for rid in ("a", "b"):
        (start, rows_of, row, rows), = shared.states[rid].pending
        assert (start, row, rows) == (prompt_len - 64, 0, 64) and rows_of.shape[0] == 64  # a copy of its window
        assert rows_of.untyped_storage().data_ptr() != chunk.untyped_storage().data_ptr()
    for step in range(3):  # decode ticks of both requests: one row each
        for rid in ("a", "b"):
            requests[rid].output_token_ids.append(int(torch.randint(1, VOCAB, (1,), generator=gen)))
        tick = torch.randn(2, size, generator=gen)
        tick_of([(requests["a"], prompt_len + step, 0, 1), (requests["b"], prompt_len + step, 1, 1)], tick)
        assert all(shared.states[rid].pending[-1][1] is tick for rid in ("a", "b"))  # views, no copy
    # A decode tick beside a prompt chunk (request c's first SHARED_SPAN_ROWS + 1 tokens):
    # every request copies its rows.
    for rid in ("a", "b"):
        requests[rid].output_token_ids.append(int(torch.randint(1, VOCAB, (1,), generator=gen)))
    mixed = torch.randn(2 + SHARED_SPAN_ROWS + 1, size, generator=gen)
    tick_of([(requests["a"], prompt_len + 3, 0, 1), (requests["b"], prompt_len + 3, 1, 1),
             (requests["c"], 0, 2, SHARED_SPAN_ROWS + 1)], mixed)
    assert all(shared.states[rid].pending[-1][1].untyped_storage().data_ptr() != mixed.untyped_storage().data_ptr()
               for rid in ("a", "b", "c"))
    for rid in ("a", "b"):
        requests[rid].output_token_ids.append(3)  # the token after the last decoded position
        a, b = shared.propose(requests[rid], 3), one_by_one.propose(requests[rid], 3)
        assert a.token_ids == b.token_ids and len(a.token_ids) == 3
        assert shared.states[rid].cache.end == one_by_one.states[rid].cache.end == prompt_len + 4


def test_a_seeding_proposal_reports_no_catch_up_time_and_a_later_one_does():
    """Adaptive K learns a round's catch-up from the drafter's own split of its time; the
    first round catches up on the whole context once: it reports itself seeded, the
    catch-up its seed's time, a first round's cost rather than a round's (Draft.seeded)."""
    from speclane.request import Request

    model = toy_model(toy_config(vocab_size=VOCAB))
    drafter = MTPDrafter(random_head(model), VOCAB)
    gen = torch.Generator().manual_seed(3)
    request = Request(request_id="a", prompt_token_ids=torch.randint(1, VOCAB, (20,), generator=gen).tolist(),
                      sampling=SamplingParams(max_tokens=8, temperature=0))
    request.output_token_ids.append(3)
    hidden = torch.randn(22, model.config.hidden_size, generator=gen)
    drafter.observe(request, 0, hidden[:20])
    seeded = drafter.propose(request, 2)
    assert len(seeded.token_ids) == 2 and seeded.seeded and seeded.catch_up_ms > 0
    request.output_token_ids.append(4)  # the round verified position 20 (and the token after it)
    drafter.observe(request, 20, hidden[20:21])
    later = drafter.propose(request, 2)
    assert len(later.token_ids) == 2 and later.catch_up_ms is not None and later.catch_up_ms > 0 and not later.seeded
    assert drafter.states["a"].cache.end == 21


def test_held_out_chat_prompts_are_not_training_prompts():
    from speclane.bench.prompts import CHAT_PROMPTS, SPEEDUP_TASKS

    training = set(training_prompts())
    assert len(training) > 1000
    assert not training & set(CHAT_PROMPTS)
    assert not training & {prompt for prompt, _ in SPEEDUP_TASKS.values()}


def test_the_chat_questions_avoid_the_held_out_prompts_subjects():
    """Not only the held-out questions themselves: none of their subjects either (the
    committed question list is of the same kind of short question)."""
    from speclane.training.prompts import chat_questions, instruction_prompts

    subjects = ("france", "paris", "sleep", "recursion", "haiku", "autumn", "tuple", "water cycle", "bakery", "sky",
                "boil", "egg", "compiler", "planet", "cinderella", "photosynthesis", "metaphor", "minutes", "prime",
                "healthy habit")
    questions = chat_questions()
    assert len(questions) == len({q.lower() for q in questions}) >= 2400
    assert not set(questions) & set(instruction_prompts())  # each prompt from one source
    assert [q for q in questions if any(subject in q.lower() for subject in subjects)] == []
    mix = training_prompts(400)
    assert sum(q in set(questions) for q in mix) == 200  # half of any prefix


class SlowDrafter(MTPDrafter):
    """The MTP drafter made slow (40 ms per proposal), to see drafting time reach the lane."""

    def propose(self, request, k, may_seed=True):
        import time

        time.sleep(0.04)
        return super().propose(request, k, may_seed)


def test_drafting_time_counts_against_the_grant_ms_budget():
    """With --spec-grant-ms 60 and no round budget, a holder whose drafting alone takes 40 ms
    must yield after its second round (the forward of a toy model takes well under 10 ms)."""
    model = toy_model(toy_config(vocab_size=VOCAB))
    drafter = SlowDrafter(random_head(model), VOCAB)
    engine = toy_engine(model, drafter, drafter="mtp", spec_mode="slice", spec_slots=1, spec_grant_rounds=0,
                        spec_grant_ms=60.0, num_draft_tokens=2)
    # 20 tokens each: enough ticks that 8 rounds happen however the grants fall (at 12, a
    # slow machine now and then saw 7 rounds in 10 ticks).
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"r{i}", [1 + i, 2, 3], sp)
    engine.run_until_done()
    c = engine.counters
    assert c.lane_yields >= 2 and c.slice_rounds >= 8
    assert c.slice_rounds <= 2 * c.lane_grants, f"{c.slice_rounds} rounds in {c.lane_grants} grants"


def test_a_head_drafts_on_the_kernels_only_where_they_take_it():
    """``drafting_head``: the torch reference itself under torch's kernels, or for a head
    whose shape our attention kernel does not take (head_dim 8)."""
    head = random_head(toy_model(toy_config(vocab_size=VOCAB)), draft_vocab=16)
    assert drafting_head(head, Kernels.load("auto")) is head
    kernel_sized = random_head(toy_model(KERNEL_TOY), draft_vocab=16)
    assert drafting_head(kernel_sized, Kernels.load("torch")) is kernel_sized


@needs_kernel_head
def test_int4_drafting_kernels_keep_greedy_output_and_mostly_the_drafts():
    """The engine drafts on our kernels (``KernelHead``: int4 matmuls) when the target is
    quantized. Output stays that of classic decoding; drafts mostly agree with the float32
    reference's."""
    model = toy_model(KERNEL_TOY)
    dense = random_head(model, draft_vocab=16)
    fast = drafting_head(random_head(model, draft_vocab=16), Kernels.load("auto"))
    assert isinstance(fast, KernelHead) and set(fast.linears) == {"fc", "qkv", "o", "gate_up", "down", "head"}
    x = torch.randn(6, model.config.hidden_size)
    nxt, pos = torch.tensor([1, 2, 3, 4, 5, 6]), torch.arange(6)
    with torch.inference_mode():
        a = dense.draft_logits(dense.extend(dense.new_cache(0), x, nxt, pos))
        b = fast.draft_logits(fast.extend(fast.new_cache(0), x, nxt, pos))
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.5
    assert not torch.equal(a, b)  # the int4 path really ran
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 3, 9, 3, 9]]
    off = generate(toy_engine(model, spec_mode="off"), prompts)
    engine = toy_engine(model, MTPDrafter(fast, VOCAB), drafter="mtp", spec_mode="slice", spec_slots=3, num_draft_tokens=3)
    assert generate(engine, prompts) == off
    assert engine.counters.draft_tokens > 0


@pytest.mark.parametrize("quantized", [False, pytest.param(True, marks=needs_kernel_head)])
def test_min_draft_prob_ends_a_round_at_the_first_unsure_draft(quantized):
    """--mtp-min-draft-prob: a draft whose probability under the head is below the floor is
    not proposed, nor anything after it; with no floor every draft is the head's argmax.
    ``quantized``: the head on our kernels (``KernelHead``), else the torch reference."""
    from speclane.drafters.mtp import draft_recursively

    model = toy_model(KERNEL_TOY if quantized else toy_config(vocab_size=VOCAB))
    head = random_head(model, draft_vocab=16, seed=3)  # int4 needs rows in multiples of 16
    if quantized:
        head = KernelHead(head, Kernels.load("auto"))
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(6, model.config.hidden_size, generator=gen)
    tokens = torch.randint(1, VOCAB, (7,), generator=gen)

    def run(floor: float):
        cache = head.new_cache(0)
        out = head.extend(cache, hidden, tokens[1:], torch.arange(6))[-1:]
        return draft_recursively(head, cache, out, 5, 3, min_draft_prob=floor).token_ids

    # The confidence of each draft of the unfloored round, recomputed step by step.
    drafts = run(0.0)
    cache = head.new_cache(0)
    out = head.extend(cache, hidden, tokens[1:], torch.arange(6))[-1:]
    confidences = []
    for j, token in enumerate(drafts):
        with torch.inference_mode():  # as drafting runs
            probs = torch.softmax(head.draft_logits(out)[0], dim=-1)
        index = int(probs.argmax())
        assert int(head.vocab_ids[index]) == token
        confidences.append(float(probs[index]))
        out = head.extend(cache, out, torch.tensor([token]), torch.tensor([6 + j]))
    assert len(drafts) == 3
    assert run(1.01) == []
    for floor in (confidences[0] * 0.999, min(confidences) * 0.999, max(confidences) * 1.001):
        expected = []
        for token, confidence in zip(drafts, confidences, strict=True):
            if confidence < floor:
                break
            expected.append(token)
        assert run(floor) == expected, floor


def test_training_follow_ups_and_prompts_are_not_in_the_drafts_set():
    """The follow-up turns a GPU job asks (``FOLLOW_UPS``) and the training prompts are none
    of the drafters' evaluation set's user turns, in either half."""
    from speclane.bench import drafts_set
    from speclane.training.prompts import FOLLOW_UPS

    asked = {m["content"] for p in drafts_set.load() for m in p.messages if m["role"] == "user"}
    assert len(asked) > 100
    assert not set(FOLLOW_UPS) & asked
    assert not set(training_prompts()) & asked


def test_a_round_that_may_not_seed_drafts_by_lookup_or_not_at_all_and_keeps_the_positions():
    """``may_seed`` False (the scheduler priced the round without the head's seed): no head
    pass over the context; a lookup still drafts; the pending positions wait, and the next
    round that may seed drafts what a head seeded at once would have."""
    from speclane.request import Request

    model = toy_model(toy_config(vocab_size=VOCAB))
    head = random_head(model)
    gen = torch.Generator().manual_seed(5)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    hidden = torch.randn(12, model.config.hidden_size, generator=gen)  # positions 0..11: all but the last token
    drafters, requests = {}, {}
    for name in ("waited", "at_once"):
        drafters[name] = MTPDrafter(head, VOCAB, lookup=NgramDrafter())
        requests[name] = Request(request_id=name, prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=16, temperature=0))
        requests[name].output_token_ids.extend([11, 12, 13])  # "12 13": nowhere before, no lookup match
        drafters[name].observe(requests[name], 0, hidden)
    waited = drafters["waited"]
    assert waited.needs_seed("waited")
    assert waited.propose(requests["waited"], 3, may_seed=False).token_ids == []
    assert waited.states["waited"].cache is None and waited.states["waited"].pending_rows == 12
    lookup_request = Request(request_id="l", prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=16, temperature=0))
    lookup_request.output_token_ids.extend([1, 2])  # "1 2": the prompt's start
    assert waited.propose(lookup_request, 3, may_seed=False).token_ids == [3, 4, 5]
    seeded, at_once = waited.propose(requests["waited"], 3), drafters["at_once"].propose(requests["at_once"], 3)
    assert seeded.seeded and len(seeded.token_ids) == 3 and seeded.token_ids == at_once.token_ids
    assert waited.states["waited"].cache.end == 12 and not waited.states["waited"].pending
