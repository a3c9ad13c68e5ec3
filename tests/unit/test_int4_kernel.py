"""Our int4 kernel (kernels/int4_x86.c): exact maths, batch invariance, its builds, fallback."""

import logging
import re

import pytest
import torch
from int4_weights import grid_round, random_int4_weight, wide_range_inputs

from speclane.kernels import build, int4_cpu
from speclane.kernels.select import Kernels
from speclane.models.linear import Int4Weight

KERNELS = Kernels.load("auto")  # what a model gets by default
needs_kernel = pytest.mark.skipif(KERNELS.int4 is None, reason="no AVX2 CPU or no C compiler here")


def int4_weight(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, kernels: Kernels = KERNELS) -> Int4Weight:
    return Int4Weight(q, scale, minimum, kernels)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9, 16, 70])
@pytest.mark.parametrize("shape", [(192, 576), (80, 1536)])  # 80 columns: an odd number of 16-column tiles
def test_matches_float64_reference(rows, shape):
    q, scale, minimum, dense = random_int4_weight(*shape)
    weight = int4_weight(q, scale, minimum)
    assert weight.kernel in int4_cpu.ISAS
    x = torch.randn(rows, shape[1]).bfloat16()
    expected = x.double() @ dense.double().T
    got = weight.matmul(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, shape[0])
    # float32 accumulation of exact products, one bfloat16 rounding at the end (2^-8 relative).
    assert torch.allclose(got.double(), expected, rtol=2**-8, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("out_features", [1536, 1552])  # 1552: 97 tiles, the last buffered group has one
def test_a_rows_result_does_not_depend_on_its_neighbours(out_features):
    """Every path (direct for few rows, a tile's rows in blocks of them for more, in integers in
    the AVX2 build, buffered for many, blocks of 128 rows) gives the same bits per row."""
    q, scale, minimum, _ = random_int4_weight(out_features, 576)
    weight = int4_weight(q, scale, minimum)
    x = torch.randn(140, 576).bfloat16()
    alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(140)])
    # 13-48: the AVX-512 builds' blocks (13 as 6 + 7, 16 as 8 + 8, 21 as 10 + 11, 25 as
    # 8 + 8 + 9); 48 | 49: those and the AVX2 integer path | the buffered path
    for rows in (2, 3, 4, 6, 7, 13, 16, 21, 25, 48, 49, 64, 128, 129, 140):
        assert torch.equal(weight.matmul(x[:rows]), alone[:rows]), rows


@needs_kernel
@pytest.mark.parametrize("rows", [1, 9])  # the direct and the buffered path's stores
def test_outputs_round_to_nearest_even_and_keep_nan(rows):
    """The kernel's bfloat16 rounding is torch's: one output column's weights are all zero but
    one input column, so the float32 sum is a single product that .to(bfloat16) rounds."""
    q, scale, minimum, _ = random_int4_weight(16, 64)
    q.zero_()
    minimum.zero_()
    scale.fill_(1.0)
    q[:, 0] = torch.arange(16)  # column n: w[n][0] = n, every other weight 0
    weight = int4_weight(q, scale, minimum)
    x = torch.zeros(rows, 64)
    x[:, 0] = 1.0 + torch.arange(rows) / 256 + 1 / 512  # halfway cases among them
    x = x.bfloat16()
    x[-1, 0] = float("nan")
    expected = (x[:, :1].float() * torch.arange(16).float()).to(torch.bfloat16)
    got = weight.matmul(x)
    assert torch.equal(got[:-1], expected[:-1])
    assert got[-1].isnan().all()


def test_torch_fallback_is_selectable():
    """--kernels torch (and auto on a machine without the kernel) use torch's int4 op."""
    kernels = Kernels.load("torch")
    assert kernels.int4 is None and kernels.int4_name == "torch"
    q, scale, minimum, dense = random_int4_weight(192, 576)
    weight = int4_weight(q, scale, minimum, kernels)
    assert weight.kernel == "torch" and weight.library is None
    x = torch.randn(5, 576).bfloat16()
    # torch's kernel keeps scales in bfloat16: close to the reference, not exact.
    expected = x.float() @ dense.T
    assert (weight.matmul(x).float() - expected).norm() / expected.norm() < 0.01


@pytest.mark.skipif(build.missing_cpu_flags("avx512") != set() or KERNELS.int4 is None,
                    reason="no AVX-512 CPU or no C compiler here")
@pytest.mark.parametrize("out_features", [1536, 1552])  # 1552: 97 tiles, a partial last buffered group
def test_every_build_gives_the_same_bits(out_features):
    """Each output column is one vector lane doing the same operations in every build (the
    bfloat16 dot product's pair step is two FMAs elsewhere; the AVX2 and VNNI builds' few
    rows are integer dot products on the grid). The direct path takes up to 12 rows in the
    AVX-512 builds (up to 48 in blocks of 6-12 of them) and 4 in AVX2's (whose integer path
    takes every call on the grid); 1-18, 21, 25, 37, 47-54 and 140 rows cover every path of each, every block height
    (21: 10 + 11) and every register tile height of the buffered path (49-54 rows) among them."""
    q, scale, minimum, _ = random_int4_weight(out_features, 576)
    x = torch.randn(140, 576).bfloat16()
    rows_cases = [*range(1, 19), 21, 25, 37, *range(47, 55), 140]
    isas = [isa for isa in int4_cpu.ISAS if not build.missing_cpu_flags(isa)]
    results = {}
    for isa in isas:
        kernels = Kernels.load("native", isa=isa, tiles=False)
        weight = int4_weight(q, scale, minimum, kernels)
        assert weight.kernel == isa == kernels.int4_name
        results[isa] = [weight.matmul(x[:rows]) for rows in rows_cases]
    for isa in isas[1:]:
        for rows, a, b in zip(rows_cases, results[isas[0]], results[isa], strict=True):
            assert torch.equal(a, b), (isa, rows)


@pytest.mark.skipif(build.missing_cpu_flags("avx512vnni") != set() or KERNELS.int4 is None,
                    reason="no AVX-512 VNNI CPU or no C compiler here")
def test_the_integer_path_leaves_groups_off_the_grid_to_the_float_path():
    """A group whose largest input is 2^119 or more (or Inf) has no int16 grid: the VNNI
    build's call then runs the float path, and its bits stay the plain build's."""
    q, scale, minimum, _ = random_int4_weight(64, 576)
    x = torch.randn(3, 576)
    x[1, 40] = 2.0**120
    x[2, 100] = float("inf")
    x = x.bfloat16()
    out = {}
    for isa in ("avx512vnni", "avx512"):
        weight = int4_weight(q, scale, minimum, Kernels.load("native", isa=isa, tiles=False))
        out[isa] = [weight.matmul(x[:rows]) for rows in (1, 2, 3)]
    for a, b in zip(out["avx512vnni"], out["avx512"], strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert torch.isfinite(out["avx512"][0].float()).all() and not torch.isfinite(out["avx512"][2][2].float()).all()


def test_a_pinned_build_is_the_widest_of_the_sources_at_or_below_it():
    """A source without the pinned build takes its widest one below (attention has no
    avx512bf16 build); an instruction set no build has is a clear error."""
    assert build.pick_isa(("avx512", "avx2"), "avx2") == "avx2"
    if not build.missing_cpu_flags("avx512"):
        assert build.pick_isa(("avx512", "avx2"), "avx512bf16") == "avx512"
    with pytest.raises(build.KernelUnavailable, match="isa 'sse2': expected one of avx512bf16, avx512vnni, avx512, avx2"):
        build.pick_isa(int4_cpu.ISAS, "sse2")


def test_unknown_kernel_choice_is_a_clear_error():
    with pytest.raises(int4_cpu.KernelUnavailable, match="kernels must be one of auto, native, torch; got 'cuda'"):
        Kernels.load("cuda")


def test_pack_rejects_shapes_the_kernel_cannot_tile():
    q, scale, minimum, _ = random_int4_weight(24, 64)
    with pytest.raises(ValueError, match="N % 16"):
        int4_cpu.pack(q, scale, minimum)


@pytest.mark.parametrize("layout", [{}, {"quads": True}, {"planes": True}])
def test_every_layout_reads_back_its_weights_rows(layout):
    """Each packed layout holds every value where its reader (the C builds, and
    dequantize_rows for an embedding's lookups and the head's refinement) looks for it."""
    q, scale, minimum, _ = random_int4_weight(48, 96)
    rows = torch.tensor([0, 5, 17, 31, 47])
    want = (q.float().unflatten(1, (-1, 32)) * scale.half().float()[..., None] + minimum.half().float()[..., None]).flatten(1)
    assert torch.equal(int4_cpu.dequantize_rows(*int4_cpu.pack(q, scale, minimum, **layout), rows), want[rows])


@needs_kernel
def test_the_avx2_build_reads_planes_on_both_its_paths():
    """The AVX2 build's weights are packed in planes (one column's 8 inputs a 32-bit lane);
    its integer path (every call whose inputs lie on the grid) and its float path (a call
    with a group above the grid's range) both read them: a row's bits are the same alone, in
    a call of 6, 13, 48 or 70 rows, and in a call that also holds a row of 2^120s (which
    sends the whole call down the float path), and near the float64 product."""
    kernels = Kernels.load("native", isa="avx2", tiles=False)
    q, scale, minimum, dense = random_int4_weight(80, 576)
    weight = int4_weight(q, scale, minimum, kernels)
    assert weight.tensors[0].shape == (80 // 16, 576 // 8, 64)
    x = wide_range_inputs(70, 576)
    alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(70)])
    for rows in (6, 13, 48, 70):
        assert torch.equal(weight.matmul(x[:rows]), alone[:rows]), rows
    off_grid = torch.cat([x, torch.full((1, 576), 2.0**120).bfloat16()])
    for rows in (3, 13, 70):  # the float path's direct loop (up to 4 rows) and its buffered one
        mixed = torch.cat([x[: rows - 1], off_grid[-1:]])
        assert torch.equal(weight.matmul(mixed)[:-1], alone[: rows - 1]), rows
    expected = grid_round(x).double() @ dense.double().T
    assert torch.allclose(alone.double(), expected, rtol=2**-7, atol=1e-3 * float(expected.abs().max()))


@needs_kernel
def test_an_input_of_the_wrong_width_is_refused():
    q, scale, minimum, _ = random_int4_weight(192, 576)
    with pytest.raises(ValueError, match="input has 512 columns, the weight 576"):
        int4_weight(q, scale, minimum).matmul(torch.randn(2, 512).bfloat16())


@needs_kernel
def test_a_threads_input_buffer_is_freed_when_the_thread_exits():
    """The kernel keeps its float32 copy of the inputs per calling thread (int4_x86.c): 40
    short-lived threads, each leaving a 256 x 1536 buffer (1.5 MB), must not grow the
    process by their sum (60 MB) once they have exited."""
    import threading

    psutil = pytest.importorskip("psutil")
    q, scale, minimum, dense = random_int4_weight(16, 1536)
    weight = int4_weight(q, scale, minimum)
    x = torch.randn(256, 1536).bfloat16()
    expected = weight.matmul(x)

    def run_in_a_thread() -> None:
        results = []
        thread = threading.Thread(target=lambda: results.append(weight.matmul(x)))
        thread.start()
        thread.join()
        assert torch.equal(results[0], expected)

    run_in_a_thread()  # warm-up: the allocator's first large blocks
    before = psutil.Process().memory_info().rss
    for _ in range(40):
        run_in_a_thread()
    grown_mb = (psutil.Process().memory_info().rss - before) / 2**20
    assert grown_mb < 20, f"the process grew by {grown_mb:.0f} MB"


def test_auto_keeps_the_widest_build_unless_another_is_clearly_faster():
    """auto's choice between two AVX-512 builds (the same bits): a draw keeps the
    incumbent, a build at most TIMING_MARGIN of its time replaces it."""
    assert int4_cpu.faster({"avx512bf16": 1.0, "avx512": 0.97}, "avx512bf16") == "avx512bf16"
    assert int4_cpu.faster({"avx512bf16": 1.0, "avx512": 0.7}, "avx512bf16") == "avx512"
    assert int4_cpu.faster({"avx512bf16": 0.8, "avx512": 1.0}, "avx512bf16") == "avx512bf16"
    assert int4_cpu.faster({"avx512bf16": 1.0, "avx512": 0.95}, "avx512bf16", margin=0.95) == "avx512"


# ms per call of the two AVX-512 builds by rows, as an AMD EPYC (Zen 4) timed them: the
# VNNI build a little faster at a few rows, the bfloat16 one nearly twice as fast at a batch's.
ZEN4_MS = {4: {"avx512bf16": 0.061, "avx512vnni": 0.057}, 16: {"avx512bf16": 0.18, "avx512vnni": 0.33}}


@pytest.mark.skipif(build.missing_cpu_flags("avx512bf16") | build.missing_cpu_flags("avx512vnni") != set()
                    or KERNELS.int4 is None, reason="no AVX512_BF16 and VNNI CPU or no C compiler here")
def test_auto_times_the_builds_at_a_batchs_width_where_no_tile_kernel_runs(monkeypatch):
    """Without the tile kernel the vector build serves every forward, batches included: a
    build that wins at 4 rows and loses at 16 is not kept there; beside the tile kernel
    (which takes 5 rows and more) the 4-row timing decides alone."""
    def timed(libraries, rows=int4_cpu.TIMING_ROWS):
        return {isa: sum(ZEN4_MS[width][isa] for width in rows) for isa in libraries}

    monkeypatch.setattr(int4_cpu, "time_builds", timed)
    assert int4_cpu.load(many_rows=True).isa == "avx512bf16"
    assert int4_cpu.load(many_rows=False).isa == "avx512vnni"
    assert Kernels.load("auto", tiles=False).int4_name == "avx512bf16"
    beside_tiles = Kernels.load("auto")  # the tiles where this CPU has AMX
    assert beside_tiles.int4_name == ("avx512vnni" if beside_tiles.tiles is not None else "avx512bf16")


@pytest.mark.skipif(build.missing_cpu_flags("avx512bf16") != set() or KERNELS.int4 is None,
                    reason="no AVX512_BF16 CPU or no C compiler here")
@pytest.mark.parametrize("choice", ["auto", "native"])
def test_auto_on_a_bfloat16_cpu_times_two_avx512_builds(caplog, choice):
    """With AVX512_BF16 and no pinned build, auto (and native) load the bfloat16 build and
    the VNNI one (the plain one on a CPU without VNNI), time them and keep the one
    ``faster`` names, and say so in the log."""
    other = "avx512vnni" if not build.missing_cpu_flags("avx512vnni") else "avx512"
    with caplog.at_level(logging.INFO, logger="speclane.kernels.int4_cpu"):
        chosen = Kernels.load(choice).int4_name
    [message] = [r.getMessage() for r in caplog.records if "auto chose" in r.getMessage()]
    assert message.startswith(f"int4_x86: auto chose {chosen} (") and chosen in ("avx512bf16", other)
    assert re.search(r"avx512bf16 \d", message) and re.search(rf"{other} \d", message)  # both builds' times
    libraries = {isa: build.load_build(int4_cpu.SOURCE, isa, int4_cpu.declare).library for isa in ("avx512bf16", other)}
    ms = int4_cpu.time_builds(libraries)
    assert set(ms) == {"avx512bf16", other} and all(value > 0 for value in ms.values())


@needs_kernel
def test_inputs_are_rounded_to_their_groups_grid():
    """An input 2^10 below its group's largest is rounded to a multiple of 2^-4 (q4.h's round_group): 16
    inputs of 1 + 2^-7 beside an input of 1024 (weighted 0) sum as 16, not 16.125 (both
    exact in bfloat16). Without the rounding the tile kernel could not give these bits."""
    q = torch.zeros(16, 32, dtype=torch.int64)
    q[:, 1:17] = 1
    weight = int4_weight(q, torch.ones(16, 1), torch.zeros(16, 1))
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1:17] = 1024.0, 1 + 2**-7
    assert torch.equal(weight.matmul(x.bfloat16()), torch.full((1, 16), 16.0).bfloat16())
    x[0, 0] = 2.0  # within 2^6 of the largest: unchanged
    assert torch.equal(weight.matmul(x.bfloat16()), torch.full((1, 16), 16.125).bfloat16())


@needs_kernel
def test_the_rounding_is_the_documented_one():
    """The kernel on x == the kernel on grid_round(x) (the torch statement of round_group),
    and the rounding changes inputs here (else the first check could not fail)."""
    q, scale, minimum, _ = random_int4_weight(192, 576)
    weight = int4_weight(q, scale, minimum)
    x = wide_range_inputs(20, 576)
    rounded = grid_round(x)
    assert not torch.equal(rounded, x)
    assert torch.equal(weight.matmul(x), weight.matmul(rounded))


@needs_kernel
def test_groups_outside_the_grids_range_are_zeroed_or_passed_as_they_are():
    """round_group's edges: a group whose largest input is below 2^-112 is zeroed (its grid
    would be subnormal); NaN stays NaN; the torch statement agrees on every edge."""
    q, scale, minimum, _ = random_int4_weight(16, 96)
    weight = int4_weight(q, scale, minimum)
    x = torch.randn(4, 96)
    x[0, :32] *= 2.0**-120  # only a tiny group: zeroed, so every output is 0 (not ~2^-120)
    x[0, 32:] = 0
    x[1, 32:64] = float("nan")  # NaN in a group: every output of the row is NaN
    x[2, 64:96] *= 2.0**100  # large, inside the range: rounded as any group
    x = x.bfloat16()
    y = weight.matmul(x)
    assert torch.equal(y[0], torch.zeros(16).bfloat16())
    assert y[1].isnan().all() and not y[[0, 2, 3]].isnan().any()
    assert torch.equal(grid_round(x)[0, :32], torch.zeros(32).bfloat16())
    assert torch.equal(weight.matmul(x[[0, 2, 3]]), weight.matmul(grid_round(x)[[0, 2, 3]]))


def test_auto_falls_back_to_torch_with_one_warning_and_native_refuses(monkeypatch, caplog):
    """A kernel that cannot be built here: auto runs torch's op in its place and says so
    once; native is a clear error naming the kernel."""

    def unavailable(isa=None, many_rows=True):
        raise build.KernelUnavailable("no C compiler (cc or gcc) on PATH")

    monkeypatch.setattr(int4_cpu, "load", unavailable)
    with caplog.at_level(logging.WARNING, logger="speclane.kernels.select"):
        kernels = Kernels.load("auto")
    assert kernels.int4 is None and kernels.tiles is None
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "int4_x86.c (no C compiler (cc or gcc) on PATH)" in warning
    with pytest.raises(build.KernelUnavailable, match="--kernels native: int4_x86.c is unavailable here: no C compiler"):
        Kernels.load("native")
