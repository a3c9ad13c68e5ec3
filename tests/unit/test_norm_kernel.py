"""Our fused add + RMSNorm and SiLU * up (kernels/norm_x86.c): torch's maths, row invariance, its two builds."""

import pytest
import torch
import torch.nn.functional as F

from speclane.kernels import build, norm_cpu
from speclane.kernels.select import Kernels

LIB = Kernels.load("auto").norm_library  # the build a model gets by default
pytestmark = pytest.mark.skipif(LIB is None, reason="no AVX2 CPU or no C compiler here")

HIDDEN, INTER, EPS = 576, 1536, 1e-5


def _ops() -> norm_cpu.LayerOps:
    ops = norm_cpu.LayerOps.for_dtype(LIB, torch.bfloat16)
    assert ops.lib is not None
    return ops


def _inputs(rows: int, seed: int = 0, hidden: int = HIDDEN):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g) * 3
    delta = torch.randn(rows, hidden, generator=g).bfloat16()
    weight = torch.rand(hidden, generator=g) + 0.5
    return x, delta, weight


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bfloat16 steps (same-sign values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("hidden", [HIDDEN, 40])  # 40: not a multiple of 16, the element-by-element row
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_is_torchs_add_then_rms_norm(with_delta, hidden):
    x, delta, weight = _inputs(5, hidden=hidden)
    expected_x = x + delta if with_delta else x.clone()
    expected = F.rms_norm(expected_x, (hidden,), weight, EPS).bfloat16()
    got = _ops().add_rms_norm(x, delta if with_delta else None, weight, EPS)
    assert torch.equal(x, expected_x)  # the residual add is the same float32 add
    assert got.dtype == torch.bfloat16 and got.shape == (5, hidden)
    # Only the sum of squares' order differs: at most one bfloat16 step, almost always none.
    assert _ulps(got, expected).max() <= 1
    assert (got == expected).float().mean() > 0.99


@pytest.mark.parametrize("hidden", [HIDDEN, 40])
@pytest.mark.parametrize("rows", [1, 9])  # 9: the rows on the threads
def test_the_final_norm_is_the_add_and_rms_norm_in_float32_and_a_rows_own(rows, hidden):
    """The model's last norm (``final_norm``) keeps float32: the head refines its top logits
    from it. Torch's values within float32 rounding (only the sum of squares' order
    differs); a row's bits the same alone or among others."""
    x, delta, weight = _inputs(rows, seed=3, hidden=hidden)
    expected = F.rms_norm(x + delta, (hidden,), weight, EPS)
    residual = x.clone()
    got = _ops().final_norm(residual, delta, weight, EPS)
    assert got.dtype == torch.float32 and got.shape == (rows, hidden)
    assert torch.equal(residual, x + delta)  # the residual add in place, the same float32 add
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    for r in range(rows):
        alone = _ops().final_norm(x[r : r + 1].clone(), delta[r : r + 1], weight, EPS)
        assert torch.equal(alone[0], got[r])
    torch.testing.assert_close(_ops().final_norm(x.clone(), None, weight, EPS), F.rms_norm(x, (hidden,), weight, EPS),
                               rtol=1e-6, atol=1e-6)  # no residual to add


# 13: the scalar tail alone (AVX-512) or after one vector (AVX2); 91: the four-vector loop,
# then single vectors, then the scalar tail, in both builds.
@pytest.mark.parametrize("inter", [INTER, 13, 91])
def test_silu_mul_rounds_as_torchs_bfloat16_ops(inter):
    g = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(4, 2 * inter, generator=g) * 4).bfloat16()
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, float("nan")])  # exp's clamps; NaN stays NaN
    gate, up = gate_up.split(inter, dim=-1)
    expected = F.silu(gate) * up
    got = _ops().gated_activation(gate_up, inter, "silu")
    assert got.shape == (4, inter) and got.dtype == torch.bfloat16
    assert got[0, 3].isnan() and expected[0, 3].isnan()
    got[0, 3] = expected[0, 3] = 0
    assert _ulps(got, expected).max() <= 1
    assert (got == expected).float().mean() > 0.99


@pytest.mark.parametrize("inter", [INTER, 13])
def test_gelu_tanh_mul_rounds_as_torchs_bfloat16_ops(inter):
    g = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(4, 2 * inter, generator=g) * 4).bfloat16()
    gate_up[0, :3] = torch.tensor([0.0, -100.0, 100.0])  # tanh's ends: gelu 0, -0 and g itself
    gate, up = gate_up.split(inter, dim=-1)
    # The roundings of torch's bfloat16 ops on the function in float64, as g / (1 + e^-2u):
    # torch's GELU (float32 and float64) loses the digits of very negative gates, where
    # 1 + tanh(u) cancels; ours computes that form too.
    g64 = gate.double()
    exact = ((g64 / (1 + torch.exp(-2 * 0.7978845608028654 * (g64 + 0.044715 * g64**3)))).bfloat16() * up).bfloat16()
    got = _ops().gated_activation(gate_up, inter, "gelu_tanh")
    assert got.shape == (4, inter) and got.dtype == torch.bfloat16

    def flushed(t: torch.Tensor) -> torch.Tensor:  # below 1e-30 (ours: 0 once e^-2u passes float32's range)
        return torch.where(t.abs() < 1e-30, torch.zeros_like(t), t)

    assert _ulps(flushed(got), flushed(exact)).max() <= 1
    assert (got == exact).float().mean() > 0.99
    torchs = F.gelu(gate, approximate="tanh") * up
    assert torch.equal(got[gate > -3], torchs[gate > -3]) or _ulps(got[gate > -3], torchs[gate > -3]).max() <= 1
    rows = torch.cat([_ops().gated_activation(gate_up[r : r + 1], inter, "gelu_tanh") for r in range(4)])
    assert torch.equal(rows, got)  # a row alone has the bits it has among others


@pytest.mark.parametrize("rows", [3, 9])  # 9: past the kernel's PARALLEL_ROWS, split across threads
def test_rms_norm_groups_normalizes_heads_in_place_as_torchs_rms_norm(rows):
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, d = 4, 2, 64
    qkv = (torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g) * 3).bfloat16()
    q_norm, k_norm = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    before = qkv.clone()
    q, k, v = before.float().split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    expected_q = F.rms_norm(q.view(rows, heads, d), (d,), q_norm, EPS).bfloat16().view(rows, -1)
    expected_k = F.rms_norm(k.view(rows, kv_heads, d), (d,), k_norm, EPS).bfloat16().view(rows, -1)
    got = _ops().rms_norm_groups(qkv, [(0, heads, d, q_norm), (heads * d, kv_heads, d, k_norm)], EPS)
    assert got is qkv  # in place
    assert _ulps(got[:, : heads * d], expected_q).max() <= 1
    assert _ulps(got[:, heads * d : (heads + kv_heads) * d], expected_k).max() <= 1
    assert torch.equal(got[:, (heads + kv_heads) * d :], before[:, (heads + kv_heads) * d :])  # v untouched
    with pytest.raises(ValueError, match="groups"):
        _ops().rms_norm_groups(qkv, [(0, heads + 5, d, q_norm)], EPS)


@pytest.mark.parametrize("rows", [2, 9, 40])  # 9 and 40: past the kernel's PARALLEL_ROWS, split across threads
def test_a_row_gives_the_same_bits_alone_or_among_others(rows):
    ops = _ops()
    x, delta, weight = _inputs(rows, seed=rows)
    together_x = x.clone()
    together = ops.add_rms_norm(together_x, delta, weight, EPS)
    gate_up = torch.cat([together, together.flip(-1)], dim=-1)  # any bfloat16 [rows, 2 * HIDDEN]
    mlp_together = ops.gated_activation(gate_up, HIDDEN, "silu")
    for r in range(rows):
        alone_x = x[r : r + 1].clone()
        assert torch.equal(ops.add_rms_norm(alone_x, delta[r : r + 1], weight, EPS), together[r : r + 1])
        assert torch.equal(alone_x, together_x[r : r + 1])
        assert torch.equal(ops.gated_activation(gate_up[r : r + 1], HIDDEN, "silu"), mlp_together[r : r + 1])


@pytest.mark.skipif(build.missing_cpu_flags("avx512") != set(), reason="no AVX-512 CPU here")
@pytest.mark.parametrize(("hidden", "inter"), [(HIDDEN, INTER), (40, 91)])
def test_the_avx512_and_avx2_builds_give_the_same_bits(hidden, inter):
    x, delta, weight = _inputs(3, seed=7, hidden=hidden)
    gate_up = (torch.randn(3, 2 * inter) * 4).bfloat16()
    out = {}
    for isa in ("avx2", "avx512"):
        kernels = Kernels.load("native", isa=isa)
        assert kernels.norm_name == isa
        ops = norm_cpu.LayerOps.for_dtype(kernels.norm_library, torch.bfloat16)
        out[isa] = (ops.add_rms_norm(x.clone(), delta, weight, EPS), ops.gated_activation(gate_up, inter, "silu"))
    assert torch.equal(out["avx2"][0], out["avx512"][0]) and torch.equal(out["avx2"][1], out["avx512"][1])


def test_torch_kernels_and_float32_models_use_torchs_ops():
    x, delta, weight = _inputs(2)
    ops = norm_cpu.LayerOps.for_dtype(Kernels.load("torch").norm_library, torch.bfloat16)
    assert ops.lib is None
    got = ops.add_rms_norm(x.clone(), delta, weight, EPS)
    assert torch.equal(got, F.rms_norm(x + delta, (HIDDEN,), weight, EPS).bfloat16())
    f32 = norm_cpu.LayerOps.for_dtype(LIB, torch.float32)
    assert f32.lib is None
    assert f32.add_rms_norm(x.clone(), None, weight, EPS).dtype == torch.float32


def test_a_residual_stream_the_kernel_cannot_read_is_refused_not_misread():
    x, delta, weight = _inputs(2)
    with pytest.raises(ValueError, match="float32"):
        _ops().add_rms_norm(x.bfloat16(), delta, weight, EPS)
    with pytest.raises(ValueError, match="float32"):
        _ops().add_rms_norm(x.t().contiguous().t(), delta, weight, EPS)  # not contiguous


@pytest.mark.parametrize("vocab", [49152, 1003])  # 1003: a tail past the last block of 8
def test_top_logits_widens_exactly_and_picks_torchs_top_candidates_in_order(vocab):
    g = torch.Generator().manual_seed(4)
    coarse = (torch.randn(3, vocab, generator=g) * 4).bfloat16()  # bfloat16 values repeat: ties on purpose
    coarse[1, 500] = float("nan")  # never a candidate
    coarse[2] = 1.0  # all equal: the first 32 indices
    logits, top = _ops().top_logits(coarse, 32)
    assert logits.dtype == torch.float32
    assert torch.equal(torch.nan_to_num(logits), torch.nan_to_num(coarse.float()))
    for r in range(3):
        values = torch.nan_to_num(coarse[r].float(), nan=float("-inf"))
        # torch's stable sort: largest first, equal values in index order.
        expected = torch.sort(values, descending=True, stable=True).indices[:32]
        assert top[r].tolist() == expected.tolist()
    assert top[2].tolist() == list(range(32))
    with pytest.raises(ValueError, match="candidates"):
        _ops().top_logits(coarse, vocab + 1)


@pytest.mark.parametrize("hidden", [HIDDEN, 40])  # 40: the element-by-element dot product
@pytest.mark.parametrize("rows", [1, 9])  # 9: the rows on the threads
def test_refine_logits_sets_each_rows_candidates_to_their_float32_products(rows, hidden):
    """The head's refinement (``refine_logits``): each row's candidates become the float32
    dot products of its hidden state and their exact weights (float64's within float32
    rounding), every other logit is left as it was, and a row's values are its own."""
    g = torch.Generator().manual_seed(5)
    vocab, count = 300, 32
    coarse = torch.randn(rows, vocab, generator=g)
    top = torch.stack([torch.randperm(vocab, generator=g)[:count] for _ in range(rows)])
    state = torch.randn(rows, hidden, generator=g)
    weights = torch.randn(rows, count, hidden, generator=g)
    got = _ops().refine_logits(coarse.clone(), top, state, weights)
    exact = torch.einsum("nh,nrh->nr", state.double(), weights.double())
    for r in range(rows):
        torch.testing.assert_close(got[r, top[r]].double(), exact[r], rtol=1e-5, atol=1e-5)
        untouched = torch.ones(vocab, dtype=torch.bool)
        untouched[top[r]] = False
        assert torch.equal(got[r, untouched], coarse[r, untouched])
        alone = _ops().refine_logits(coarse[r : r + 1].clone(), top[r : r + 1], state[r : r + 1], weights[r : r + 1])
        assert torch.equal(alone[0], got[r])
    with pytest.raises(ValueError, match="refine_logits"):
        _ops().refine_logits(coarse.clone(), top, state, weights[:, :4])
