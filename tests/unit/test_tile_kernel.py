"""The tile kernel (kernels/int4_amx.c, ``Kernels.tiles``): the int4 matmul's bits on AMX
tiles, and calls of TILE_MIN_ROWS rows or more sent to it."""

import ctypes

import pytest
import torch
from int4_weights import random_int4_weight, wide_range_inputs

from speclane.kernels import build, int4_cpu
from speclane.kernels.select import Kernels
from speclane.models.linear import Int4Weight

KERNELS = Kernels.load("auto")  # what a model gets by default
has_amx = KERNELS.int4 is not None and not build.missing_cpu_flags("amx")
needs_amx = pytest.mark.skipif(not has_amx, reason="no AMX (amx_tile, amx_bf16) on this CPU")
needs_kernel = pytest.mark.skipif(KERNELS.int4 is None, reason="no AVX2 CPU or no C compiler here")


@needs_kernel
def test_where_the_cpu_has_amx_by_default_and_off_on_request():
    assert (KERNELS.tile_library is not None) == has_amx
    assert KERNELS.tile_name == ("amx" if has_amx else "off")
    assert Kernels.load("auto", tiles=False).tiles is None
    assert Kernels.load("torch").tiles is None  # it reads our int4 layout: only beside our matmul


@pytest.mark.skipif(has_amx or KERNELS.int4 is None, reason="this CPU has AMX")
def test_asking_for_it_without_amx_says_what_is_missing():
    with pytest.raises(build.KernelUnavailable, match="int4_amx.c is unavailable here: the CPU lacks amx"):
        Kernels.load("auto", tiles=True)
    assert Kernels.load("native").tiles is None  # native: the tiles where the CPU has them


@pytest.mark.skipif(not has_amx, reason="this CPU has no AMX")
def test_required_tiles_beside_our_int8_matmul_where_the_int4_one_is_torch_s(monkeypatch: pytest.MonkeyPatch):
    def unavailable(isa=None, many_rows=True):
        raise build.KernelUnavailable("not built here")
    monkeypatch.setattr(int4_cpu, "load", unavailable)
    kernels = Kernels.load("auto", tiles=True)
    assert kernels.int4 is None and kernels.tiles is None
    assert kernels.int8 is not None and kernels.int8_tiles is not None


class _Recording:
    """A stand-in tile library: records the rows of each call, computes with the int4 matmul."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib, self.rows = lib, []

    def int4_matmul_amx(self, *args):
        self.rows.append(args[5])
        return self.lib.int4_matmul(*args)


@needs_kernel
def test_calls_of_tile_min_rows_or_more_go_to_the_tile_kernel():
    q, scale, minimum, _ = random_int4_weight(192, 576)
    tiles = _Recording(KERNELS.int4_library)
    call = int4_cpu.bind(*int4_cpu.pack(q, scale, minimum), lib=KERNELS.int4_library, tiles=tiles)
    for rows in (1, int4_cpu.TILE_MIN_ROWS - 1, int4_cpu.TILE_MIN_ROWS, 96):
        call(torch.randn(rows, 576).bfloat16())
    assert tiles.rows == [int4_cpu.TILE_MIN_ROWS, 96]


@needs_amx
@pytest.mark.parametrize("shape", [(192, 576), (80, 1536), (1552, 576)])  # 80: an odd number of tiles
def test_the_same_bits_as_every_build_of_the_int4_matmul(shape):
    """The point of the grid rounding (q4.h): the tile unit's order of adding cannot change
    a bit. Inputs over many binades with an outlier column, so that the rounding acts."""
    q, scale, minimum, dense = random_int4_weight(*shape)
    tensors = int4_cpu.pack(q, scale, minimum)
    tile = int4_cpu.bind(*tensors, lib=KERNELS.tile_library, function="int4_matmul_amx")
    builds = {isa: build.load_build(int4_cpu.SOURCE, isa, int4_cpu.declare).library
              for isa in int4_cpu.ISAS if not build.missing_cpu_flags(isa)}
    x = wide_range_inputs(140, shape[1])
    for rows in (1, 7, 8, 15, 16, 17, 37, 96, 140):
        got = tile(x[:rows])
        assert got.shape == (rows, shape[0])
        for isa, lib in builds.items():
            assert torch.equal(got, int4_cpu.bind(*tensors, lib=lib)(x[:rows])), (isa, rows)
    # The grid's range (q4.h): tiny groups zeroed, so no sum is subnormal in any kernel.
    edges = torch.cat([wide_range_inputs(8, shape[1]).float() * 2.0**power for power in (-118, -125, -130, 100)])
    for isa, lib in builds.items():
        assert torch.equal(tile(edges.bfloat16()), int4_cpu.bind(*tensors, lib=lib)(edges.bfloat16())), isa
    ordinary = torch.randn(16, shape[1]).bfloat16()
    assert torch.allclose(tile(ordinary).double(), ordinary.double() @ dense.double().T, rtol=2**-8, atol=1e-4)


@needs_amx
def test_a_rows_result_does_not_depend_on_its_neighbours():
    """Row blocks of 16, padding, threads splitting columns: a row's bits are its own."""
    q, scale, minimum, _ = random_int4_weight(1552, 576)
    tile = int4_cpu.bind(*int4_cpu.pack(q, scale, minimum), lib=KERNELS.tile_library, function="int4_matmul_amx")
    x = wide_range_inputs(70, 576)
    whole = tile(x)
    for first, last in ((0, 1), (0, 16), (3, 20), (16, 17), (5, 70), (40, 70)):
        assert torch.equal(tile(x[first:last].contiguous()), whole[first:last]), (first, last)


@needs_amx
def test_an_int4_weight_gives_the_same_bits_with_it_and_without():
    q, scale, minimum, _ = random_int4_weight(192, 576)
    tiled = Int4Weight(q, scale, minimum, Kernels.load("native", tiles=True))
    plain = Int4Weight(q, scale, minimum, Kernels.load("native", tiles=False))
    x = wide_range_inputs(64, 576)
    assert torch.equal(tiled.matmul(x), plain.matmul(x))
