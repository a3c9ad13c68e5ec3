"""The matmuls on int8 inputs (``--matmul-inputs int8``: kernels/int4_q8_x86.c for int4
weights, int8_q8_x86.c for int8 groups): their arithmetic against a float64 reference,
batch invariance, the same bits in both builds, NaN, the weights' rows, and how they are chosen."""

import pytest
import torch
from int4_weights import random_int4_weight, wide_range_inputs

from speclane.config import ModelConfig
from speclane.kernels import build, int4_cpu, int8_cpu
from speclane.kernels.select import Kernels
from speclane.models.linear import GroupInt8Weight, Int4Weight

available = not build.missing_cpu_flags("avx2") and Kernels.load("auto").int4 is not None
needs_kernel = pytest.mark.skipif(not available, reason="no AVX2 CPU or no C compiler here")
INT8 = Kernels.load("native", matmul_inputs="int8") if available else None
EXACT = Kernels.load("native", isa="avx2", tiles=False) if available else None  # the bfloat16-input kernel


def int8_inputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, d): each group of 32 inputs as int8 q times its step d = max|x| / 127 (float32,
    as the kernel: q = round(x * (1 / d)), ties to even)."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    d = groups.abs().amax(-1) / 127
    inverse = torch.where((d > 0) & (1 / d).isfinite(), 1 / d, torch.zeros_like(d))  # a subnormal step: q all zero
    return torch.round(groups * inverse[..., None]), d


def reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None) -> torch.Tensor:
    """float64: per weight group of G inputs, scale * d * sum(qx q) + minimum * d * sum(qx),
    summed over groups (d: the step of the 32 inputs the group lies in)."""
    qx, d = int8_inputs(x)
    n, k = q.shape
    group = k // scale.shape[1]
    qx = qx.reshape(x.shape[0], -1, group).double()
    d = d.double().repeat_interleave(32 // group, dim=1)  # [M, K/G]
    products = torch.einsum("mgk,ngk->mng", qx, q.double().reshape(n, -1, group))
    out = scale.double()[None] * products * d[:, None]
    if minimum is not None:
        out = out + minimum.double()[None] * (d * qx.sum(-1))[:, None]
    return out.sum(-1)


def random_int8_weight(n: int, k: int, group: int, with_minimum: bool, seed: int = 0):
    """(q, scale, minimum): int8 groups over the full range (Q8_0's -127..127 and -128)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, k // group, generator=g) * 0.01 + 0.001
    minimum = -torch.rand(n, k // group, generator=g) * 0.1 if with_minimum else None
    return q, scale, minimum


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13, 70])
@pytest.mark.parametrize("shape", [(192, 576), (80, 1536)])  # 80 columns: an odd number of 16-column tiles
def test_matches_the_int8_arithmetic_in_float64(rows, shape):
    q, scale, minimum, dense = random_int4_weight(*shape)
    weight = Int4Weight(q, scale, minimum, INT8)
    x = wide_range_inputs(rows, shape[1])
    got = weight.matmul(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, shape[0])
    # Integer sums are exact; the float32 steps round a little; one bfloat16 rounding at the end.
    expected = reference(x, q, scale, minimum)
    assert torch.allclose(got.double(), expected, rtol=2**-8, atol=1e-5 * expected.abs().max().item())
    # ...and the inputs' rounding to 8 bits shows against exact products (the bfloat16 kernel).
    exact = x.double() @ dense.double().T
    assert not torch.allclose(got.double(), exact, rtol=2**-8, atol=1e-5 * exact.abs().max().item())


@needs_kernel
def test_inputs_already_on_an_int8_grid_give_the_bfloat16_kernels_bits():
    """Groups whose largest is 127 * 2^e and whose other inputs are integers times 2^e lose
    nothing to 8 bits: both kernels then add exact products and run the same float steps."""
    q, scale, minimum, _ = random_int4_weight(96, 576)
    g = torch.Generator().manual_seed(3)
    ints = torch.randint(-127, 128, (9, 18, 32), generator=g).float()
    ints[..., 7] = torch.where(torch.rand(9, 18, generator=g) < 0.5, 127.0, -127.0)
    x = (ints * torch.ldexp(torch.ones(9, 18, 1), torch.randint(-20, 4, (9, 18, 1), generator=g))).reshape(9, 576).bfloat16()
    assert torch.equal(x.float().reshape(9, 18, 32), ints * x.float().reshape(9, 18, 32).abs().amax(-1, keepdim=True) / 127)
    got = Int4Weight(q, scale, minimum, INT8).matmul(x)
    assert torch.equal(got, Int4Weight(q, scale, minimum, EXACT).matmul(x))


@needs_kernel
@pytest.mark.parametrize("out_features", [1536, 1552])  # 1552: 97 tiles, an odd last one for one-row calls
def test_a_rows_result_does_not_depend_on_its_neighbours(out_features):
    """One row, a register block of rows, several blocks over a tile unpacked once: the same bits per row."""
    q, scale, minimum, _ = random_int4_weight(out_features, 576)
    weight = Int4Weight(q, scale, minimum, INT8)
    x = wide_range_inputs(140, 576)
    alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(140)])
    for rows in (2, 3, 5, 6, 7, 8, 13, 48, 140):
        assert torch.equal(weight.matmul(x[:rows]), alone[:rows]), rows


@needs_kernel
@pytest.mark.parametrize("rows", [1, 9])
def test_a_group_with_nan_or_infinity_gives_nan_and_leaves_other_rows_alone(rows):
    q, scale, minimum, _ = random_int4_weight(32, 64)
    weight = Int4Weight(q, scale, minimum, INT8)
    x = torch.randn(rows, 64).bfloat16()
    clean = weight.matmul(x)
    x[-1, 40] = float("inf") if rows == 1 else float("nan")
    got = weight.matmul(x)
    assert got[-1].isnan().all()
    assert torch.equal(got[:-1], clean[:-1])


@needs_kernel
def test_the_choice_is_the_models_and_rejects_what_cannot_run():
    assert INT8.matmul_inputs == "int8" and INT8.tiles is None and "matmul_inputs=int8" in INT8.describe()
    assert INT8.int8 is not None and INT8.int8.library is not EXACT.int8.library
    assert Int4Weight(*random_int4_weight(32, 64)[:3], INT8).library is INT8.int4_library
    assert any(part.startswith(f"int4={INT8.int4.isa}/int8:") for part in INT8.fingerprint(True))  # calibrations are not shared
    with pytest.raises(int4_cpu.KernelUnavailable, match="--matmul-inputs int8 runs on our int4 and int8-group kernels"):
        Kernels.load("torch", matmul_inputs="int8")
    with pytest.raises(int4_cpu.KernelUnavailable, match="tiles: .* read bfloat16 inputs, and the matmuls are on int8 inputs"):
        Kernels.load("native", tiles=True, matmul_inputs="int8")
    with pytest.raises(ValueError, match="matmul_inputs must be one of bfloat16, int8; got 'int4'"):
        ModelConfig(matmul_inputs="int4")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize(("group", "with_minimum", "half"), [(32, False, True), (16, False, False), (32, True, False)])
def test_int8_groups_match_the_int8_arithmetic_in_float64(rows, group, with_minimum, half):
    """Q8_0-like (float16 scales), Q6_K-like (groups of 16), Q5_1-like (minimums) weights."""
    q, scale, minimum = random_int8_weight(80, 576, group, with_minimum)
    if half:
        scale = scale.half().float()
    weight = GroupInt8Weight(q, scale, minimum, INT8)
    assert weight.packed[0].shape == (5, 144, 64) and (weight.packed[1].dtype == torch.float16) == half
    x = wide_range_inputs(rows, 576)
    got = weight.matmul(x)
    expected = reference(x, q, scale, minimum)
    assert torch.allclose(got.double(), expected, rtol=2**-8, atol=1e-5 * expected.abs().max().item())
    alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(rows)])
    assert torch.equal(got, alone)  # a row's bits do not depend on its neighbours
    dense = q.float().reshape(80, -1, group) * scale[..., None] + (0 if minimum is None else minimum[..., None])
    picked = torch.tensor([0, 7, 8, 15, 16, 79])
    assert torch.equal(weight.dequantize_rows(picked), dense.reshape(80, 576)[picked])  # int8_rows reads the quads


@needs_kernel
def test_int8_groups_on_an_int8_grid_give_the_bfloat16_kernels_bits():
    q, scale, minimum = random_int8_weight(48, 256, 32, False)
    g = torch.Generator().manual_seed(4)
    ints = torch.randint(-127, 128, (5, 8, 32), generator=g).float()
    ints[..., 3] = 127.0
    x = (ints * torch.ldexp(torch.ones(5, 8, 1), torch.randint(-12, 2, (5, 8, 1), generator=g))).reshape(5, 256).bfloat16()
    exact = Kernels.load("native", isa="avx2")
    assert torch.equal(GroupInt8Weight(q, scale, minimum, INT8).matmul(x), GroupInt8Weight(q, scale, minimum, exact).matmul(x))


vnni = pytest.mark.skipif(not available or bool(build.missing_cpu_flags("avx512vnni")), reason="no AVX-512 VNNI CPU here")


@needs_kernel
@vnni
@pytest.mark.parametrize("out_features", [80, 96, 112, 1552])  # 5, 6, 7, 97 tiles: remainders of 4 tiles a step
def test_the_avx512_vnni_builds_give_the_avx2_builds_bits(out_features):
    """vpdpbusd (q + 128 for signed weights, less 128 * sum(qx)) and vpmaddubsw add the same
    integers, and the float steps after them are the same per column; a group whose step is
    a subnormal (1 / d overflows) enters as zeros in both."""
    wide, narrow = Kernels.load("native", matmul_inputs="int8"), Kernels.load("native", isa="avx2", matmul_inputs="int8")
    assert (wide.int4.isa, wide.int8.isa, narrow.int4.isa, narrow.int8.isa) == ("avx512vnni", "avx512vnni", "avx2", "avx2")
    q4, scale4, minimum4, _ = random_int4_weight(out_features, 576)
    weights = [(Int4Weight(q4, scale4, minimum4, wide), Int4Weight(q4, scale4, minimum4, narrow))]
    for group, with_minimum, half in [(32, False, True), (16, True, False)]:
        q, scale, minimum = random_int8_weight(out_features, 576, group, with_minimum, seed=group)
        scale = scale.half().float() if half else scale
        weights.append((GroupInt8Weight(q, scale, minimum, wide), GroupInt8Weight(q, scale, minimum, narrow)))
    x = wide_range_inputs(70, 576)
    x[0] = (x[0].float() * 2.0**-130 / x[0].float().abs().max()).bfloat16()  # largest 2^-130: every step a subnormal
    assert not (1 / (x[0].float().abs().max() / 127)).isfinite()
    for a, b in weights:
        for rows in (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 70):
            assert torch.equal(a.matmul(x[:rows]), b.matmul(x[:rows])), (type(a).__name__, rows)
        assert not a.matmul(x[:1]).any(), type(a).__name__  # the tiny row's inputs entered as zeros


def test_int8_packing_in_quads_needs_whole_groups_of_32_inputs():
    q, scale, minimum = random_int8_weight(16, 48, 16, False)
    with pytest.raises(ValueError, match="our int8 kernel needs"):
        int8_cpu.pack(q, scale, minimum, quads=True)
