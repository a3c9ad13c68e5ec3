"""Our row-by-row attention kernel (kernels/attention_x86.c): maths, row invariance, its two builds."""

import pytest
import torch

from speclane.kernels import attention_cpu, build

pytestmark = pytest.mark.skipif(not attention_cpu.supports(torch.bfloat16, 9, 3, 64),
                                reason="no AVX2 CPU or no C compiler here")

HEADS, KV_HEADS, HEAD_DIM, SLOTS, MAX_LEN = 9, 3, 64, 3, 300


def _cache(seed: int = 0):
    torch.manual_seed(seed)
    keys = torch.randn(SLOTS, KV_HEADS, MAX_LEN, HEAD_DIM).bfloat16()
    values = torch.randn(SLOTS, KV_HEADS, MAX_LEN, HEAD_DIM).bfloat16()
    return keys, values


def _reference(q, keys, values, slot, length, scale):
    """float64 softmax attention of one query row [heads, d] over the first `length` keys."""
    group = HEADS // KV_HEADS
    k = keys[slot, :, :length].double().repeat_interleave(group, dim=0)  # [heads, L, d]
    v = values[slot, :, :length].double().repeat_interleave(group, dim=0)
    weights = torch.softmax((k @ q.double().unsqueeze(-1)).squeeze(-1) * scale, dim=-1)  # [heads, L]
    return (weights.unsqueeze(-1) * v).sum(1).reshape(-1)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 64, 201, MAX_LEN])
def test_matches_float64_softmax_attention(length):
    keys, values = _cache()
    q = torch.randn(1, HEADS, HEAD_DIM).bfloat16()
    scale = HEAD_DIM**-0.5
    got = attention_cpu.attention(q, keys, values, torch.tensor([1], dtype=torch.int32),
                                  torch.tensor([length], dtype=torch.int32), scale)
    expected = _reference(q[0], keys, values, 1, length, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (1, HEADS * HEAD_DIM)
    torch.testing.assert_close(got[0].double(), expected, rtol=2**-7, atol=2e-3)


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Queries of different slots and lengths in one call give the bits each gives alone."""
    keys, values = _cache(1)
    rows = [(0, 5), (0, 6), (0, 7), (2, 299), (1, 1), (2, 64), (0, 8)]
    q = torch.randn(len(rows), HEADS, HEAD_DIM).bfloat16()
    slot = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    length = torch.tensor([n for _, n in rows], dtype=torch.int32)
    together = attention_cpu.attention(q, keys, values, slot, length, 0.125)
    for i in range(len(rows)):
        alone = attention_cpu.attention(q[i : i + 1], keys, values, slot[i : i + 1], length[i : i + 1], 0.125)
        assert torch.equal(alone[0], together[i]), rows[i]


def test_keys_past_the_length_are_never_read():
    keys, values = _cache(2)
    q = torch.randn(1, HEADS, HEAD_DIM).bfloat16()
    args = (torch.tensor([0], dtype=torch.int32), torch.tensor([10], dtype=torch.int32), 0.125)
    before = attention_cpu.attention(q, keys, values, *args)
    keys[0, :, 10:] = float("nan")
    values[0, :, 10:] = float("nan")
    assert torch.equal(attention_cpu.attention(q, keys, values, *args), before)


def test_only_bfloat16_models_use_it():
    assert not attention_cpu.supports(torch.float32, HEADS, KV_HEADS, HEAD_DIM)
    assert not attention_cpu.supports(torch.bfloat16, HEADS, KV_HEADS, 48)  # head_dim % 32
    assert attention_cpu.supports(torch.bfloat16, HEADS, KV_HEADS, 128)


def test_a_head_dim_of_128_matches_the_reference():
    """Four 32-dimension blocks: the interleaved lanes are put back in order."""
    torch.manual_seed(4)
    keys, values = torch.randn(2, 2, 50, 128).bfloat16(), torch.randn(2, 2, 50, 128).bfloat16()
    q = torch.randn(1, 4, 128).bfloat16()
    got = attention_cpu.attention(q, keys, values, torch.tensor([1], dtype=torch.int32),
                                  torch.tensor([37], dtype=torch.int32), 0.1)
    k, v = keys[1, :, :37].double().repeat_interleave(2, 0), values[1, :, :37].double().repeat_interleave(2, 0)
    weights = torch.softmax((k @ q[0].double().unsqueeze(-1)).squeeze(-1) * 0.1, dim=-1)
    torch.testing.assert_close(got[0].double(), (weights.unsqueeze(-1) * v).sum(1).reshape(-1), rtol=2**-7, atol=2e-3)


@pytest.mark.skipif(build.missing_cpu_flags("avx512") != set(), reason="no AVX-512 CPU here")
def test_the_avx512_and_avx2_builds_give_the_same_bits():
    keys, values = _cache(5)
    rows = [(0, 1), (1, 9), (2, 300), (0, 77)]
    q = torch.randn(len(rows), HEADS, HEAD_DIM).bfloat16()
    args = (torch.tensor([s for s, _ in rows], dtype=torch.int32), torch.tensor([n for _, n in rows], dtype=torch.int32), 0.125)
    out = {}
    for isa in ("avx2", "avx512"):
        with attention_cpu.using(isa):
            assert attention_cpu.kernel_name() == isa
            out[isa] = attention_cpu.attention(q, keys, values, *args)
    assert torch.equal(out["avx2"], out["avx512"])


def test_a_nan_query_gives_nan_not_a_silent_average():
    keys, values = _cache(3)
    q = torch.randn(2, HEADS, HEAD_DIM).bfloat16()
    q[0, 0, 0] = float("nan")
    out = attention_cpu.attention(q, keys, values, torch.tensor([0, 0], dtype=torch.int32),
                                  torch.tensor([20, 13], dtype=torch.int32), 0.125)
    assert out[0, :HEAD_DIM].isnan().all() and not out[1].isnan().any()


def test_bad_row_arguments_are_refused():
    keys, values = _cache()
    q = torch.randn(2, HEADS, HEAD_DIM).bfloat16()
    with pytest.raises(ValueError, match="int32"):
        attention_cpu.attention(q, keys, values, torch.tensor([0, 0]), torch.tensor([3, 4], dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="bfloat16"):
        attention_cpu.attention(q.float(), keys, values, torch.tensor([0, 0], dtype=torch.int32),
                                torch.tensor([3, 4], dtype=torch.int32), 0.1)
