"""Our Llama model against transformers, over ragged batches, and the KV cache's truncate.

The reference is transformers' ``LlamaForCausalLM`` loaded from the same GGUF file
(``gguf_file=``), float32 on both sides: it dequantizes and un-permutes the weights with
its own code, so a wrong RoPE permutation, norm or attention detail on our side shows up
as a logit difference of order 1-10, while two correct float32 implementations differ
only by accumulation order (measured: max abs 4.8e-5 on logits of magnitude ~30).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from slot_pool import SlotPool

import hf_gguf
from speclane.models import forward_plan
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch
from speclane.models.loader import resolve_model
from speclane.request import SamplingParams

pytestmark = pytest.mark.slow

# 40x the measured float32 noise (4.8e-5), still 500x below the smallest error a wrong
# permutation, scaling or mask produces (order 1).
LOGITS_ATOL = 2e-3
# Our own model against itself with different batch shapes: the same kernels in a
# different blocking, so the noise is smaller still.
RAGGED_ATOL = 1e-3

TEXT = (
    "The Roman Empire was the post-Republican state of ancient Rome. It is generally "
    "understood to mean the period and territory ruled by the Romans following Octavian's "
    "assumption of sole rule under the Principate in 27 BC. It included territory around "
    "the Mediterranean in Europe, North Africa, and Western Asia, and was ruled by emperors."
)
GREEDY_PROMPTS = [
    "The three most important inventions of the twentieth century are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest,",
]


@pytest.fixture(scope="module")
def hf_model():
    """transformers' LlamaForCausalLM from the same GGUF, float32."""
    model = hf_gguf.model(resolve_model("smollm2-135m-instruct"))
    assert type(model).__name__ == "LlamaForCausalLM"
    return model


@pytest.fixture(scope="module")
def model(llm_f32) -> LlamaModel:
    return llm_f32.engine.model


def new_cache(model: LlamaModel, num_slots: int = 4, max_len: int = 160) -> SlotPool:
    return SlotPool(model.config, num_slots, max_len, model.dtype)


def forward(model: LlamaModel, cache: SlotPool, rows: Sequence[tuple[int, int, Sequence[int]]]) -> list[torch.Tensor]:
    """One ragged forward of ``(slot, start, new token ids)`` rows; logits per row [n, vocab]."""
    logits = model.logits(model(cache.batch(rows), cache))
    return list(logits.split([len(tokens) for _, _, tokens in rows]))


def alone(model: LlamaModel, tokens: Sequence[int]) -> torch.Tensor:
    """Logits of every position of ``tokens`` run as the only sequence in a fresh cache."""
    return forward(model, new_cache(model, 1), [(0, 0, tokens)])[0]


def prompt_ids(llm, text: str) -> list[int]:
    return llm.tokenizer.encode(text)


# -- against transformers --------------------------------------------------------------------
def test_logits_match_transformers(llm_f32, model, hf_model):
    ids = prompt_ids(llm_f32, TEXT)[:60]
    assert len(ids) == 60
    ours = alone(model, ids)
    with torch.inference_mode():
        theirs = hf_model(torch.tensor([ids])).logits[0].float()
    assert ours.shape == theirs.shape == (60, model.config.vocab_size)
    assert theirs.abs().max() > 10  # the scale the tolerance is measured against
    diff = (ours - theirs).abs().max().item()
    assert diff < LOGITS_ATOL, f"max abs logit difference {diff:.3g} (float32 noise is ~5e-5)"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_greedy_continuations_match_transformers(llm_f32, hf_model):
    lengths = []
    for text in GREEDY_PROMPTS:
        # Token ids, not text: transformers' GGUF tokenizer splits some digit/space runs
        # differently from the model's own tokenizer (see test_tokenizer.py).
        ids = prompt_ids(llm_f32, text)
        with torch.inference_mode():
            out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=32, do_sample=False)
        theirs = out[0, len(ids):].tolist()
        [ours] = llm_f32.generate([ids], SamplingParams(max_tokens=32))
        assert ours.token_ids == theirs, f"prompt {text!r}: {ours.text!r} vs {llm_f32.tokenizer.decode(theirs)!r}"
        lengths.append(len(ours.token_ids))
    assert max(lengths) == 32  # not a trivial comparison of early stops


# -- ragged batches --------------------------------------------------------------------------
def test_ragged_prefill_of_three_prompts_equals_each_alone(llm_f32, model):
    ids = prompt_ids(llm_f32, TEXT)
    seqs = [ids[:7], ids[5:28], ids[20:61]]
    cache = new_cache(model)
    together = forward(model, cache, [(2, 0, seqs[0]), (0, 0, seqs[1]), (3, 0, seqs[2])])
    for tokens, logits in zip(seqs, together, strict=True):
        reference = alone(model, tokens)
        assert (logits - reference).abs().max().item() < RAGGED_ATOL
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_ragged_mix_of_decode_row_prefill_chunk_and_multi_token_row(llm_f32, model):
    """One forward holding a decode step, a prefill chunk (not from position 0) and a
    4-token row (a speculative verify) gives each sequence its own logits."""
    ids = prompt_ids(llm_f32, TEXT)
    a, b, c = ids[:8], ids[10:33], ids[15:60]
    assert [len(a), len(b), len(c)] == [8, 23, 45]
    cache = new_cache(model)
    forward(model, cache, [(0, 0, a[:7]), (1, 0, b[:10]), (2, 0, c[:41])])  # a ragged prefill
    mixed = forward(model, cache, [
        (0, 7, a[7:]),  # decode row: one token
        (1, 10, b[10:]),  # prefill chunk: 13 tokens starting at position 10
        (2, 41, c[41:]),  # multi-token row: 4 tokens
    ])
    assert [len(x) for x in mixed] == [1, 13, 4]
    for tokens, start, logits in zip((a, b, c), (7, 10, 41), mixed, strict=True):
        reference = alone(model, tokens)[start:]
        assert (logits - reference).abs().max().item() < RAGGED_ATOL
        assert torch.equal(logits.argmax(-1), reference.argmax(-1))


def test_single_sequence_prefilled_in_chunks_equals_one_pass(llm_f32, model):
    ids = prompt_ids(llm_f32, TEXT)[:40]
    cache = new_cache(model, 1)
    parts = [forward(model, cache, [(0, start, ids[start:end])])[0]
             for start, end in ((0, 16), (16, 32), (32, 39), (39, 40))]
    reference = alone(model, ids)
    assert (torch.cat(parts) - reference).abs().max().item() < RAGGED_ATOL


# -- the KV cache ----------------------------------------------------------------------------
def test_truncate_then_redecode_equals_never_writing_the_dropped_positions(llm_f32, model):
    ids = prompt_ids(llm_f32, TEXT)
    prompt, other = ids[:20], ids[:50]
    reference_cache = new_cache(model)
    x = int(forward(model, reference_cache, [(0, 0, prompt)])[0][-1].argmax())
    y = int(forward(model, reference_cache, [(0, 20, [x])])[0][-1].argmax())
    reference = forward(model, reference_cache, [(0, 21, [y])])[0][-1]  # never saw any junk

    cache = new_cache(model)
    forward(model, cache, [(0, 0, prompt), (1, 0, other)])
    junk = [17, 4000, 123, 9]
    forward(model, cache, [(0, 20, [x, *junk])])  # a verify row whose four drafts are rejected
    # Re-decode from the verified length 21 beside a longer sequence, so that this forward's
    # key range covers the dropped positions 21..24 of slot 0, still holding stale keys:
    # they must not be seen.
    got = forward(model, cache, [(0, 21, [y]), (1, 50, [x])])[0][-1]
    assert (got - reference).abs().max().item() < RAGGED_ATOL
    assert int(got.argmax()) == int(reference.argmax())

    # Control: had the drafts stayed in the cache, the answer would differ.
    polluted_cache = new_cache(model)
    forward(model, polluted_cache, [(0, 0, prompt)])
    forward(model, polluted_cache, [(0, 20, [x, *junk])])
    polluted = forward(model, polluted_cache, [(0, 25, [y])])[0][-1]
    assert (polluted - reference).abs().max().item() > 0.1


# -- the default model answers ----------------------------------------------------------------
CAPITAL_QUESTION = "What is the capital of France?"


def test_float32_model_answers_the_capital_of_france(llm_f32):
    [answer] = llm_f32.generate([CAPITAL_QUESTION], SamplingParams(max_tokens=16), chat=True)
    assert "Paris" in answer.text, answer.text


def test_default_model_answers_the_capital_of_france(llm_default):
    [answer] = llm_default.generate([CAPITAL_QUESTION], SamplingParams(max_tokens=16), chat=True)
    assert "Paris" in answer.text, answer.text


def _hidden(model: LlamaModel, cache: SlotPool, slot: int, start: int, tokens: Sequence[int]) -> torch.Tensor:
    """Final hidden states [n, hidden] of one forward of ``tokens`` at ``start`` in ``slot``."""
    return model(cache.batch([(slot, start, tokens)]), cache)


def test_default_model_rows_do_not_depend_on_their_neighbours(our_kernels, llm_default):
    """bfloat16 activations + int4 weights (the default): a position's hidden state is the
    same bits whether it is decoded alone, verified among K+1 positions or prefilled with the
    whole prompt, and beside another sequence in a ragged tick. Our int4 and attention
    kernels compute each row alone; with torch's int4 kernel and SDPA this test fails.
    It is what makes greedy speculation token-exact in the default configuration."""
    model = llm_default.engine.model
    tokens = prompt_ids(llm_default, TEXT)[:40]
    prompt, tail = tokens[:28], tokens[28:]
    cache = new_cache(model, num_slots=4, max_len=64)
    for slot in (0, 1, 3):
        _hidden(model, cache, slot, 0, prompt)
    decoded = torch.cat([_hidden(model, cache, 0, 28 + i, [t]) for i, t in enumerate(tail)])
    verified = torch.cat([_hidden(model, cache, 1, 28 + i, tail[i : i + 5]) for i in range(0, len(tail), 5)])
    prefilled = _hidden(model, cache, 2, 0, tokens)[28:]
    ragged = model(cache.batch([(3, 28, tail[:4]), (0, 5, tail[:1])]), cache)[:4]  # slot 0 re-decodes position 5 beside it (not compared)
    assert torch.equal(verified, decoded)
    assert torch.equal(prefilled, decoded)
    assert torch.equal(ragged, decoded[:4])


def test_default_model_positions_do_not_depend_on_the_block_layout(our_kernels, llm_default):
    """The same sequence through two block tables, its blocks in order and shuffled in a
    pool holding another sequence, prefilled in one pass or in chunks that end mid-block,
    decoded alone or beside the other sequence: the same logits, bit for bit."""
    model = llm_default.engine.model
    c = model.config
    tokens = prompt_ids(llm_default, TEXT)[:45]
    cache = KVCache(c.num_layers, 12, 16, c.num_kv_heads, c.head_dim, model.dtype)
    in_order, shuffled, other = [0, 1, 2], [9, 4, 7], [3, 11, 5]

    def run(table, start, new, beside=None):
        rows = [(table, start, new)] + ([beside] if beside else [])
        ids = [t for _, _, n in rows for t in n]
        positions = [p for _, st, n in rows for p in range(st, st + len(n))]
        batch = RaggedBatch(torch.tensor(ids), torch.tensor(positions), [r[0] for r in rows], [r[1] for r in rows],
                            [len(r[2]) for r in rows])
        return model.logits(model(batch, cache))[: len(new)]

    whole = run(in_order, 0, tokens)
    parts = torch.cat([run(shuffled, 0, tokens[:21]), run(shuffled, 21, tokens[21:37], (other, 0, tokens[:30])),
                       *(run(shuffled, p, tokens[p : p + 1], (other, 30 + p - 37, tokens[30 + p - 37 : 31 + p - 37]))
                         for p in range(37, 45))])
    assert model.attention_library is not None and model.dtype == torch.bfloat16
    assert torch.equal(parts, whole)
    with pytest.raises(ValueError, match="does not hold"):
        run(shuffled[:2], 0, tokens[:33])


def test_quantized_head_picks_the_float32_argmax(llm_default):
    """The default head's coarse pass on its Q8_0 blocks + float32 refinement of its top
    candidates gives the float32 head's argmax (and its exact logit) at every position of
    real text."""
    model = llm_default.engine.model
    assert model.lm_head.quantized is not None
    text = TEXT + " " + " ".join(GREEDY_PROMPTS)
    tokens = prompt_ids(llm_default, text)
    cache = new_cache(model, num_slots=1, max_len=len(tokens) + 1)
    hidden = model(cache.batch([(0, 0, tokens)]), cache)
    refined = model.logits(hidden)
    exact = hidden.float() @ model.head_table().T
    assert len(tokens) > 60
    assert torch.equal(refined.argmax(-1), exact.argmax(-1))
    torch.testing.assert_close(refined.max(-1).values, exact.max(-1).values, atol=1e-4, rtol=1e-5)


def test_the_argmax_screen_picks_the_float32_argmax_and_leaves_other_rows_alone(llm_default):
    """Rows read for their largest logit alone find their candidates on the head's int4
    copy (``--argmax-screen int4``, the default): at every position of real text the
    argmax and its logit are still the float32 head's; a row's logits depend on its own
    flag only; rows without the flag are the head's as they were."""
    model = llm_default.engine.model
    assert model.argmax_screen is not None and model.argmax_screen.nbytes < 0.7 * model.lm_head.nbytes
    text = TEXT + " " + " ".join(GREEDY_PROMPTS)
    tokens = prompt_ids(llm_default, text)
    cache = new_cache(model, num_slots=1, max_len=len(tokens) + 1)
    hidden = model(cache.batch([(0, 0, tokens)]), cache)
    rows = len(tokens)
    screened = model.logits(hidden, [True] * rows)
    exact = hidden.float() @ model.head_table().T
    assert torch.equal(screened.argmax(-1), exact.argmax(-1))
    torch.testing.assert_close(screened.max(-1).values, exact.max(-1).values, atol=1e-4, rtol=1e-5)
    plain = model.logits(hidden)
    assert not torch.equal(screened, plain)  # the tail is the int4 copy's estimate
    mixed = [i % 3 == 0 for i in range(rows)]
    both = model.logits(hidden, mixed)
    flags = torch.tensor(mixed)
    assert torch.equal(both[flags], screened[flags]) and torch.equal(both[~flags], plain[~flags])
    assert torch.equal(model.logits(hidden, [False] * rows), plain)


def test_forward_plan_gives_the_python_loops_bits(our_kernels, llm_default):
    """The default model runs forwards of up to forward_plan.MAX_ROWS rows as one C call
    (forward_plan.py): a decode row, a 5-row verify, a ragged tick of two sequences and a
    draft tree give the same hidden states, bit for bit, as the Python layer loop."""
    model = llm_default.engine.model
    assert model.plan_blocker is None and model.plans is not None
    tokens = prompt_ids(llm_default, TEXT)[:40]
    c = model.config
    cache = KVCache(c.num_layers, 16, 16, c.num_kv_heads, c.head_dim, model.dtype)
    model(RaggedBatch(torch.tensor(tokens[:30]), torch.arange(30), [[0, 1, 2]], [0], [30]), cache)
    model(RaggedBatch(torch.tensor(tokens[:20]), torch.arange(20), [[5, 6]], [0], [20]), cache)
    batches = {
        "decode": RaggedBatch(torch.tensor(tokens[30:31]), torch.tensor([30]), [[0, 1, 2]], [30], [1]),
        "verify": RaggedBatch(torch.tensor(tokens[30:35]), torch.arange(30, 35), [[0, 1, 2]], [30], [5]),
        "ragged": RaggedBatch(torch.tensor(tokens[30:33] + tokens[20:21]), torch.tensor([30, 31, 32, 20]),
                              [[0, 1, 2], [5, 6]], [30, 20], [3, 1]),
        # fed token at 30, then a tree: two children of it, a grandchild under the first
        "tree": RaggedBatch(torch.tensor(tokens[30:34]), torch.tensor([30, 31, 31, 32]), [[0, 1, 2]], [30], [4],
                            trees=[(-1, -1, 0)]),
    }
    plans = model.plans
    try:
        for name, batch in batches.items():
            model.plans = None
            loop = model(batch, cache)
            model.plans = plans
            runs = plans.get(len(batch.input_ids)).runs
            planned = model(batch, cache)
            assert plans.get(len(batch.input_ids)).runs == runs + 1, name
            assert torch.equal(planned, loop), name
    finally:
        model.plans = plans
    with pytest.raises(ValueError, match="a plan of 4 rows given 1"):
        plans.get(4).run(torch.zeros(1, c.hidden_size), None, cache, model.rope)


def test_forward_plans_keep_a_batchs_widths_and_drop_the_least_recently_used(our_kernels, llm_default):
    """A batch of 16 streams ending one by one, drafts beside them, passes through more than
    16 widths: each width's plan is built once and reused while the model keeps
    forward_plan.KEPT_PLANS of them, the least recently used dropped first."""
    plans = llm_default.engine.model.plans
    widths = list(range(1, 21))
    first = {rows: plans.get(rows) for rows in widths}
    assert all(plans.get(rows) is first[rows] for rows in widths)  # 20 widths: all kept
    for rows in range(21, 21 + forward_plan.KEPT_PLANS - len(widths)):
        plans.get(rows)
    assert plans.get(21 + forward_plan.KEPT_PLANS) is not None  # one width more: width 1, the oldest, goes
    assert plans.get(2) is first[2] and plans.get(1) is not first[1]
