"""The int8-group kernel's weights in 5 or 6 bits (``kernels/int8_packed.h``): the narrowest
format that holds a weight's values, its bytes, and the same bits as the int8 layout of the
same values on every path (one row over a run of tiles, few rows, the integer path's row
blocks, the float path of a call off the grid, the AMX tile kernel, row lookups), in every
build. The weights have 5 column tiles: a one-row call runs the first 4 in one call and
the last alone."""

from __future__ import annotations

import pytest
import torch

from speclane.kernels import build, int8_cpu
from speclane.kernels.select import Kernels

KERNELS = Kernels.load("auto")
needs_kernel = pytest.mark.skipif(KERNELS.int8 is None, reason="no AVX2 CPU or no C compiler here")

# (format, lowest value, highest value): GGUF's Q5_0 (5 bits, signed), Q5_1 / Q5_K (5,
# unsigned), Q6_K (6, signed), and 6 unsigned.
FORMATS = [(5 | int8_cpu.SIGNED, -16, 15), (5, 0, 31), (6 | int8_cpu.SIGNED, -32, 31), (6, 0, 63)]


def _weight(low: int, high: int, n: int = 80, k: int = 256, group: int = 32, minimum: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(low, high + 1, (n, k), generator=g, dtype=torch.int32).to(torch.int8)
    q[0, :4] = torch.tensor([low, high, low, high], dtype=torch.int8)  # both ends of the range appear
    scale = torch.rand(n, k // group, generator=g).half().float() * 0.02
    mins = -torch.rand(n, k // group, generator=g).half().float() * 0.1 if minimum else None
    return q, scale, mins


def _inputs(rows: int, k: int = 256, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-10, 3, (rows, k), generator=g).float())
    return x.bfloat16()


def test_the_narrowest_format_holds_every_value():
    assert int8_cpu.narrowest_format(torch.tensor([[-16, 15]])) == 5 | int8_cpu.SIGNED
    assert int8_cpu.narrowest_format(torch.tensor([[0, 31]])) == 5
    assert int8_cpu.narrowest_format(torch.tensor([[-17, 15]])) == 6 | int8_cpu.SIGNED
    assert int8_cpu.narrowest_format(torch.tensor([[0, 32]])) == 6
    assert int8_cpu.narrowest_format(torch.tensor([[-33, 0]])) == int8_cpu.INT8
    assert int8_cpu.narrowest_format(torch.tensor([[-1, 63]])) == int8_cpu.INT8
    q, scale, mins = _weight(-16, 15)
    with pytest.raises(ValueError, match="outside 5 bits"):
        int8_cpu.pack(q + 1, scale, mins, format=5 | int8_cpu.SIGNED)
    with pytest.raises(ValueError, match="format must be one of"):
        int8_cpu.pack(q, scale, mins, format=int8_cpu.INT8 | int8_cpu.SIGNED)


@pytest.mark.parametrize("format, low, high", FORMATS)
def test_packed_weights_keep_their_bits_in_memory(format, low, high):
    q, scale, mins = _weight(low, high)
    packed = int8_cpu.pack(q, scale, mins)
    wide = int8_cpu.pack(q, scale, mins, format=int8_cpu.INT8)
    bits = format & 15
    assert packed.format == format and wide.format == int8_cpu.INT8
    assert packed.q.numel() * 8 == q.numel() * bits and wide.q.numel() == q.numel()
    assert packed.shape == wide.shape == tuple(q.shape)
    assert int8_cpu.pack(q, scale, mins, quads=True).format == int8_cpu.INT8  # quads stay a byte a value


@needs_kernel
@pytest.mark.parametrize("format, low, high", FORMATS)
@pytest.mark.parametrize("group, minimum", [(32, True), (16, False)])
def test_packed_weights_give_the_int8_layouts_bits_in_every_build(format, low, high, group, minimum):
    q, scale, mins = _weight(low, high, group=group, minimum=minimum)
    packed, wide = int8_cpu.pack(q, scale, mins), int8_cpu.pack(q, scale, mins, format=int8_cpu.INT8)
    assert packed.format == format
    x = _inputs(17)
    off_grid = x.clone()
    off_grid[2, 9] = 2.0**120  # the float path, for the whole call
    for isa in int8_cpu.ISAS:
        if build.missing_cpu_flags(isa):
            continue
        library = int8_cpu.load(isa).library
        narrow, reference = int8_cpu.bind(packed, library), int8_cpu.bind(wide, library)
        for rows in (1, 2, 3, 4, 5, 8, 10, 12, 13, 17):
            assert torch.equal(narrow(x[:rows]), reference(x[:rows])), (isa, rows)
        assert torch.equal(narrow(off_grid), reference(off_grid)), isa
        ids = torch.tensor([0, 47, 16, 5])
        assert torch.equal(int8_cpu.dequantize_rows(packed, ids, library), int8_cpu.dequantize_rows(wide, ids, library))
        expected = q.float().reshape(q.shape[0], -1, group) * scale.unsqueeze(-1)
        if mins is not None:
            expected = expected + mins.unsqueeze(-1)
        assert torch.equal(int8_cpu.dequantize_rows(packed, ids, library), expected.reshape(q.shape[0], -1)[ids])


@pytest.mark.skipif(KERNELS.int8_tiles is None, reason="no AMX (amx_tile, amx_bf16) on this CPU")
@pytest.mark.parametrize("format, low, high", FORMATS)
def test_packed_weights_on_the_tile_kernel(format, low, high):
    q, scale, mins = _weight(low, high)
    packed, wide = int8_cpu.pack(q, scale, mins), int8_cpu.pack(q, scale, mins, format=int8_cpu.INT8)
    tiles = int8_cpu.bind(packed, KERNELS.int8.library, tiles=KERNELS.int8_tiles.library)
    reference = int8_cpu.bind(wide, KERNELS.int8.library)
    x = _inputs(40)
    for rows in (int8_cpu.TILE_MIN_ROWS, 13, 40):
        assert torch.equal(tiles(x[:rows]), reference(x[:rows])), rows
