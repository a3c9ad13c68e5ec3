"""Our row-by-row attention kernel (kernels/attention_x86.c): maths, row invariance, its two builds."""

import pytest
import torch

from speclane.kernels import attention_cpu, build
from speclane.kernels.select import Kernels

LIB = Kernels.load("auto").attention_library  # the build a model gets by default
pytestmark = pytest.mark.skipif(LIB is None, reason="no AVX2 CPU or no C compiler here")

HEADS, KV_HEADS, HEAD_DIM, SLOTS, MAX_LEN = 9, 3, 64, 3, 300


def _cache(seed: int = 0):
    torch.manual_seed(seed)
    keys = torch.randn(SLOTS, KV_HEADS, MAX_LEN, HEAD_DIM).bfloat16()
    values = torch.randn(SLOTS, KV_HEADS, MAX_LEN, HEAD_DIM).bfloat16()
    return keys, values


def _reference(q, keys, values, slot, length, scale, window=0, softcap=0.0):
    """float64 softmax attention of one query row [heads, d] over the first `length` keys
    (the last `window` of them with a window), scores soft-capped with a `softcap`."""
    group = HEADS // KV_HEADS
    first = max(0, length - window) if window else 0
    k = keys[slot, :, first:length].double().repeat_interleave(group, dim=0)  # [heads, L, d]
    v = values[slot, :, first:length].double().repeat_interleave(group, dim=0)
    scores = (k @ q.double().unsqueeze(-1)).squeeze(-1) * scale  # [heads, L]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    weights = torch.softmax(scores, dim=-1)
    return (weights.unsqueeze(-1) * v).sum(1).reshape(-1)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 64, 201, MAX_LEN])
def test_matches_float64_softmax_attention(length):
    keys, values = _cache()
    q = torch.randn(1, HEADS, HEAD_DIM).bfloat16()
    scale = HEAD_DIM**-0.5
    got = attention_cpu.attention(LIB, q, keys, values, torch.tensor([1], dtype=torch.int32),
                                  torch.tensor([length], dtype=torch.int32), scale)
    expected = _reference(q[0], keys, values, 1, length, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (1, HEADS * HEAD_DIM)
    torch.testing.assert_close(got[0].double(), expected, rtol=2**-7, atol=2e-3)


@pytest.mark.parametrize(("length", "window"), [(1, 4), (4, 4), (5, 4), (9, 8), (201, 64), (MAX_LEN, 17)])
def test_a_window_sees_the_last_window_keys(length, window):
    """A sliding layer's query at position length - 1 sees keys (length - 1 - window, length - 1]."""
    keys, values = _cache(6)
    q = torch.randn(1, HEADS, HEAD_DIM).bfloat16()
    got = attention_cpu.attention(LIB, q, keys, values, torch.tensor([2], dtype=torch.int32),
                                  torch.tensor([length], dtype=torch.int32), 0.125, window=window)
    torch.testing.assert_close(got[0].double(), _reference(q[0], keys, values, 2, length, 0.125, window),
                               rtol=2**-7, atol=2e-3)
    if length > window:  # the keys before the window are never read
        keys[2, :, : length - window] = float("nan")
        again = attention_cpu.attention(LIB, q, keys, values, torch.tensor([2], dtype=torch.int32),
                                        torch.tensor([length], dtype=torch.int32), 0.125, window=window)
        assert torch.equal(again, got)


def test_soft_capped_scores_match_the_reference():
    """Gemma 2's cap: scores -> cap * tanh(score / cap), with and without a window; the
    scores are scaled up so that the cap changes the weights."""
    keys, values = _cache(7)
    q = (torch.randn(1, HEADS, HEAD_DIM) * 3).bfloat16()
    for window in (0, 9):
        got = attention_cpu.attention(LIB, q, keys, values, torch.tensor([0], dtype=torch.int32),
                                      torch.tensor([40], dtype=torch.int32), 0.5, window=window, softcap=5.0)
        expected = _reference(q[0], keys, values, 0, 40, 0.5, window, softcap=5.0)
        torch.testing.assert_close(got[0].double(), expected, rtol=2**-7, atol=2e-3)
        uncapped = _reference(q[0], keys, values, 0, 40, 0.5, window)
        assert (uncapped - expected).abs().max() > 0.05  # the cap matters at this scale


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Queries of different slots and lengths in one call give the bits each gives alone."""
    keys, values = _cache(1)
    rows = [(0, 5), (0, 6), (0, 7), (2, 299), (1, 1), (2, 64), (0, 8)]
    q = torch.randn(len(rows), HEADS, HEAD_DIM).bfloat16()
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    length = torch.tensor([n for _, n in rows], dtype=torch.int32)
    for extra in ({}, {"window": 6, "softcap": 4.0}):
        together = attention_cpu.attention(LIB, q, keys, values, slot, length, 0.125, **extra)
        for i in range(len(rows)):
            alone = attention_cpu.attention(LIB, q[i : i + 1], keys, values, slot[i : i + 1], length[i : i + 1], 0.125,
                                            **extra)
            assert torch.equal(alone[0], together[i]), (rows[i], extra)


def test_keys_past_the_length_are_never_read():
    keys, values = _cache(2)
    q = torch.randn(1, HEADS, HEAD_DIM).bfloat16()
    args = (torch.tensor([0], dtype=torch.int32), torch.tensor([10], dtype=torch.int32), 0.125)
    before = attention_cpu.attention(LIB, q, keys, values, *args)
    keys[0, :, 10:] = float("nan")
    values[0, :, 10:] = float("nan")
    assert torch.equal(attention_cpu.attention(LIB, q, keys, values, *args), before)


def test_only_bfloat16_models_use_it():
    assert not attention_cpu.supports(torch.float32, HEADS, KV_HEADS, HEAD_DIM)
    assert not attention_cpu.supports(torch.bfloat16, HEADS, KV_HEADS, 48)  # head_dim % 32
    assert attention_cpu.supports(torch.bfloat16, HEADS, KV_HEADS, 128)


def test_a_head_dim_of_128_matches_the_reference():
    """Four 32-dimension blocks: the interleaved lanes are put back in order."""
    torch.manual_seed(4)
    keys, values = torch.randn(2, 2, 50, 128).bfloat16(), torch.randn(2, 2, 50, 128).bfloat16()
    q = torch.randn(1, 4, 128).bfloat16()
    got = attention_cpu.attention(LIB, q, keys, values, torch.tensor([1], dtype=torch.int32),
                                  torch.tensor([37], dtype=torch.int32), 0.1)
    k, v = keys[1, :, :37].double().repeat_interleave(2, 0), values[1, :, :37].double().repeat_interleave(2, 0)
    weights = torch.softmax((k @ q[0].double().unsqueeze(-1)).squeeze(-1) * 0.1, dim=-1)
    torch.testing.assert_close(got[0].double(), (weights.unsqueeze(-1) * v).sum(1).reshape(-1), rtol=2**-7, atol=2e-3)


def test_no_rows_is_an_empty_result():
    keys, values = _cache(7)
    q = torch.randn(0, HEADS, HEAD_DIM).bfloat16()
    none = torch.zeros(0, dtype=torch.int32)
    assert attention_cpu.attention(LIB, q, keys, values, none, none, 0.125).shape == (0, HEADS * HEAD_DIM)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(16, 1, 32), (8, 2, 128), (4, 1, 256), (20, 1, 64)])
def test_heads_sharing_a_key_head_give_each_heads_own_bits(heads, kv_heads, head_dim):
    """Many rows: an item attends a row's heads of one key/value head together (each key
    unpacked once for all of them; up to 16 heads, the values in passes of what fits in
    registers); one row: down to each head alone. Same bits either way, and the reference's
    values."""
    torch.manual_seed(6)
    keys, values = torch.randn(3, kv_heads, 260, head_dim).bfloat16(), torch.randn(3, kv_heads, 260, head_dim).bfloat16()
    rows = [(0, 259), (1, 3), (2, 140), (0, 17), (1, 260), (2, 1), (0, 64), (1, 129)]
    q = torch.randn(len(rows), heads, head_dim).bfloat16()
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    length = torch.tensor([n for _, n in rows], dtype=torch.int32)
    together = attention_cpu.attention(LIB, q, keys, values, slot, length, head_dim**-0.5)
    group = heads // kv_heads
    for i, (s, n) in enumerate(rows):
        alone = attention_cpu.attention(LIB, q[i : i + 1], keys, values, slot[i : i + 1], length[i : i + 1], head_dim**-0.5)
        assert torch.equal(alone[0], together[i]), rows[i]
        k = keys[s, :, :n].double().repeat_interleave(group, 0)
        v = values[s, :, :n].double().repeat_interleave(group, 0)
        weights = torch.softmax((k @ q[i].double().unsqueeze(-1)).squeeze(-1) * head_dim**-0.5, dim=-1)
        torch.testing.assert_close(together[i].double(), (weights.unsqueeze(-1) * v).sum(1).reshape(-1), rtol=2**-7,
                                   atol=2e-3)


@pytest.mark.skipif(build.missing_cpu_flags("avx512") != set(), reason="no AVX-512 CPU here")
def test_the_avx512_and_avx2_builds_give_the_same_bits():
    keys, values = _cache(5)
    rows = [(0, 1), (1, 9), (2, 300), (0, 77)]
    q = torch.randn(len(rows), HEADS, HEAD_DIM).bfloat16()
    args = (torch.tensor([s for s, _ in rows], dtype=torch.int32), torch.tensor([n for _, n in rows], dtype=torch.int32), 0.125)
    for extra in ({}, {"window": 30, "softcap": 4.0}):
        out = {}
        for isa in ("avx2", "avx512"):
            kernels = Kernels.load("native", isa=isa)
            assert kernels.attention_name == isa
            out[isa] = attention_cpu.attention(kernels.attention_library, q, keys, values, *args, **extra)
        assert torch.equal(out["avx2"], out["avx512"]), extra


def test_a_nan_query_gives_nan_not_a_silent_average():
    keys, values = _cache(3)
    q = torch.randn(2, HEADS, HEAD_DIM).bfloat16()
    q[0, 0, 0] = float("nan")
    out = attention_cpu.attention(LIB, q, keys, values, torch.tensor([0, 0], dtype=torch.int32),
                                  torch.tensor([20, 13], dtype=torch.int32), 0.125)
    assert out[0, :HEAD_DIM].isnan().all() and not out[1].isnan().any()


def test_bad_row_arguments_are_refused():
    keys, values = _cache()
    q = torch.randn(2, HEADS, HEAD_DIM).bfloat16()
    with pytest.raises(ValueError, match="int32"):
        attention_cpu.attention(LIB, q, keys, values, torch.tensor([0, 0]), torch.tensor([3, 4], dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="bfloat16"):
        attention_cpu.attention(LIB, q.float(), keys, values, torch.tensor([0, 0], dtype=torch.int32),
                                torch.tensor([3, 4], dtype=torch.int32), 0.1)


def _rope_tables(positions: int = MAX_LEN):
    """llama.py's bfloat16 cos and signed-sin tables (rotate-half layout)."""
    from speclane.models.llama import LlamaConfig, rope_inv_freq

    config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, intermediate_size=64, num_layers=1, num_heads=HEADS,
                         num_kv_heads=KV_HEADS, vocab_size=32, max_position_embeddings=positions)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), rope_inv_freq(config))
    angles = torch.cat([angles, angles], dim=-1)
    half = HEAD_DIM // 2
    signed_sin = torch.cat([-angles[:, :half].sin(), angles[:, half:].sin()], dim=-1)
    return angles.cos().bfloat16(), signed_sin.bfloat16()


def test_fused_rope_write_attention_is_the_torch_ops_and_the_kernel_bit_for_bit():
    """rope_write_attention == llama.py's _rotate on the fused projection, the two cache
    writes and attention(): the same rotated queries, the same cache, the same output."""
    from speclane.models.llama import _rotate

    cos, signed_sin = _rope_tables()
    rows = [(0, 40), (0, 41), (0, 42), (2, 0), (1, 299)]  # (slot, position): a verify's run, a first token, the end
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    position = torch.tensor([p for _, p in rows])
    qkv = (torch.randn(len(rows), (HEADS + 2 * KV_HEADS) * HEAD_DIM) * 2).bfloat16()
    keys, values = _cache(3)
    expected_keys, expected_values = keys.clone(), values.clone()
    qk = _rotate(qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].view(-1, HEADS + KV_HEADS, HEAD_DIM),
                 cos[position].unsqueeze(1), signed_sin[position].unsqueeze(1))
    q, k = qk.split([HEADS, KV_HEADS], dim=1)
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(-1, KV_HEADS, HEAD_DIM)
    expected_keys[slot.long(), :, position] = k
    expected_values[slot.long(), :, position] = v
    row_len = (position + 1).to(torch.int32)
    for extra in ({}, {"window": 2, "softcap": 3.0}):  # a global layer, a windowed and capped one
        expected = attention_cpu.attention(LIB, q, expected_keys, expected_values, slot, row_len, 0.125, **extra)
        written_keys, written_values = keys.clone(), values.clone()
        scratch = torch.empty(len(rows), HEADS, HEAD_DIM, dtype=torch.bfloat16)
        got = attention_cpu.rope_write_attention(LIB, qkv, cos, signed_sin, written_keys, written_values, slot, row_len,
                                                 HEADS, 0.125, scratch, **extra)
        assert torch.equal(scratch, q.contiguous())
        assert torch.equal(written_keys, expected_keys) and torch.equal(written_values, expected_values)
        assert torch.equal(got, expected), extra


def test_fused_rope_write_attention_refuses_what_it_cannot_read():
    cos, signed_sin = _rope_tables()
    keys, values = _cache()
    slot, row_len = torch.tensor([0], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * HEAD_DIM).bfloat16()
    scratch = torch.empty(1, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="qkv must be contiguous"):
        attention_cpu.rope_write_attention(LIB, qkv[:, :-HEAD_DIM], cos, signed_sin, keys, values, slot, row_len, HEADS, 0.1, scratch)
    with pytest.raises(ValueError, match="bfloat16"):
        attention_cpu.rope_write_attention(LIB, qkv, cos.float(), signed_sin, keys, values, slot, row_len, HEADS, 0.1, scratch)
    with pytest.raises(ValueError, match="one row_slot"):
        attention_cpu.rope_write_attention(LIB, qkv, cos, signed_sin, keys, values, slot, row_len, HEADS, 0.1, scratch[:0])


def _paged(keys, values, block_size, order):
    """The slot cache [slots, kvh, max_len, d] cut into blocks of ``block_size`` placed in the
    pool at ``order`` (pool index per (slot, block)), and each slot's table."""
    slots, kvh, max_len, d = keys.shape
    per_slot = max_len // block_size
    pool_k = torch.zeros(slots * per_slot, kvh, block_size, d, dtype=keys.dtype)
    pool_v = torch.zeros_like(pool_k)
    tables = torch.tensor(order, dtype=torch.int32).view(slots, per_slot)
    for s in range(slots):
        for b in range(per_slot):
            pool_k[tables[s, b]] = keys[s, :, b * block_size : (b + 1) * block_size]
            pool_v[tables[s, b]] = values[s, :, b * block_size : (b + 1) * block_size]
    return pool_k, pool_v, tables


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (7, 0.0), (40, 2.0)])
@pytest.mark.parametrize("block_size", [1, 15, 20, MAX_LEN])
def test_paged_attention_gives_the_slot_caches_bits_through_any_block_table(block_size, window, softcap):
    """A position's result does not depend on where its keys sit: blocks in order or shuffled,
    of any size, give the bits of the slot cache, a window starting mid-block and a soft
    cap included, and match the float64 reference."""
    keys, values = _cache(4)
    rows = [(0, 5), (2, 299), (1, 1), (2, 64), (0, 16), (1, 17)]
    q = torch.randn(len(rows), HEADS, HEAD_DIM).bfloat16()
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    length = torch.tensor([n for _, n in rows], dtype=torch.int32)
    expected = attention_cpu.attention(LIB, q, keys, values, slot, length, 0.125, window=window, softcap=softcap)
    for t, (s, n) in enumerate(rows):
        reference = _reference(q[t], keys, values, s, n, 0.125, window, softcap)
        torch.testing.assert_close(expected[t].double(), reference, atol=2e-2, rtol=2e-2)
    num_blocks = SLOTS * (MAX_LEN // block_size)
    for order in (list(range(num_blocks)), torch.randperm(num_blocks, generator=torch.Generator().manual_seed(5)).tolist()):
        pool_k, pool_v, tables = _paged(keys, values, block_size, order)
        got = attention_cpu.paged_attention(LIB, q, pool_k, pool_v, tables, slot, length, 0.125, window=window,
                                            softcap=softcap)
        assert torch.equal(got, expected), (block_size, order[:4])


def test_a_rows_bits_do_not_depend_on_how_its_segments_and_rows_are_shared():
    """A row's softmax is taken over segments of 64 keys and combined: alone, each of its
    segments is a work item; among other sequences' rows, an item takes all of a row's
    segments (among many, all of its key/value heads too); a verify round's rows (one
    sequence, consecutive positions) share each key's unpacking. Every row gets the bits it gets alone, at lengths ending before, at and past
    a segment's end, and the float64 reference's values."""
    keys, values = _cache(8)
    order = torch.randperm(SLOTS * 15, generator=torch.Generator().manual_seed(9)).tolist()
    pool_k, pool_v, tables = _paged(keys, values, 20, order)
    q = torch.randn(16, HEADS, HEAD_DIM).bfloat16()
    verify = [(1, n) for n in range(60, 70)]  # one sequence's rows, across the first segment's end
    others = [(0, 300), (2, 128), (2, 129), (0, 193), (2, 1), (0, 64)]

    def attend(rows, queries):
        seq = torch.tensor([s for s, _ in rows], dtype=torch.int32)
        length = torch.tensor([n for _, n in rows], dtype=torch.int32)
        return attention_cpu.paged_attention(LIB, queries, pool_k, pool_v, tables, seq, length, 0.125)

    alone = torch.cat([attend([row], q[i : i + 1]) for i, row in enumerate(verify + others)])
    for i, (s, n) in enumerate(verify + others):
        torch.testing.assert_close(alone[i].double(), _reference(q[i], keys, values, s, n, 0.125), rtol=2**-7, atol=2e-3)
    assert torch.equal(attend(verify, q[: len(verify)]), alone[: len(verify)])  # a verify round, few rows
    assert torch.equal(attend(verify + others, q), alone)  # among other sequences' rows
    assert torch.equal(attend(others + verify, torch.cat([q[len(verify) :], q[: len(verify)]])),
                       torch.cat([alone[len(verify) :], alone[: len(verify)]]))
    # Rows of many sequences (an item takes all of a row's key/value heads, segment by segment).
    many = [(s, n) for s, n in zip([0, 1, 2] * 4, [70, 130, 10, 200, 64, 65, 1, 299, 150, 129, 128, 33], strict=True)]
    queries = torch.randn(len(many), HEADS, HEAD_DIM).bfloat16()
    separate = torch.cat([attend([row], queries[i : i + 1]) for i, row in enumerate(many)])
    assert torch.equal(attend(many, queries), separate)


def test_paged_rope_write_attention_writes_through_the_table():
    """The fused call on a paged cache writes each row's key and value at its position's
    block and offset, and gives the slot cache's output (a window and a soft cap included)."""
    cos, signed_sin = _rope_tables()
    rows = [(0, 40), (0, 41), (0, 42), (2, 0), (1, 299)]
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    row_len = torch.tensor([p + 1 for _, p in rows], dtype=torch.int32)
    qkv = (torch.randn(len(rows), (HEADS + 2 * KV_HEADS) * HEAD_DIM) * 2).bfloat16()
    keys, values = _cache(6)
    order = torch.randperm(SLOTS * 15, generator=torch.Generator().manual_seed(7)).tolist()
    pool_k, pool_v, tables = _paged(keys, values, 20, order)
    scratch = torch.empty(len(rows), HEADS, HEAD_DIM, dtype=torch.bfloat16)
    expected = attention_cpu.rope_write_attention(LIB, qkv, cos, signed_sin, keys, values, slot, row_len, HEADS, 0.125,
                                                  scratch.clone(), window=9, softcap=3.0)
    got = attention_cpu.paged_rope_write_attention(LIB, qkv, cos, signed_sin, pool_k, pool_v, tables, slot, row_len,
                                                   HEADS, 0.125, scratch, window=9, softcap=3.0)
    assert torch.equal(got, expected)
    written_k, written_v, _ = _paged(keys, values, 20, order)
    assert torch.equal(pool_k, written_k) and torch.equal(pool_v, written_v)
