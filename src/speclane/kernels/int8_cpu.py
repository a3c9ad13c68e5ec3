"""Our int8-group matmul (``int8_x86.c``: AVX-512 VNNI, AVX-512 or AVX2 build), built and
loaded by ``build.py``: w = q * scale + minimum per group of ``group`` (32 or 16) input
columns, q an int8, scale and minimum float32. It runs the GGUF types whose integers do not
fit the int4 kernel's 0..15 (``models/gguf_types.py``). The inputs are rounded to a grid of
each block of 32 (``grid.h``, 11 bits) where a group's sum of products is exact, and every
build sums in int32 (``vpdpwssd`` with VNNI, ``vpmaddwd`` otherwise): the same bits in
every build, and a row's result does not depend on the other rows of its call
(``int8_x86.c``). The default model's shapes (its 49,152 x 576 head and a layer's
matmuls), against the kernel that multiplied the unrounded inputs by FMAs one at a time,
on an Intel Xeon with AMX: the VNNI build 0.88x the time at one row, 0.82x at two,
0.65-0.70x at 4-96 rows; the AVX2 build 0.74-0.87x its predecessor. Scales and
minimums that are all float16 values (Q8_0, Q5_0 and Q5_1 store them so) are kept in
float16, half the bytes, through the kernel's ``int8_matmul_h``: the same bits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from speclane.kernels import build, plan_cpu

__all__ = ["Packed", "bind", "dequantize_rows", "load", "load_int8_inputs", "load_tiles", "narrowest_format", "pack",
           "source_digest", "tile_source_digest"]

SOURCE = Path(__file__).with_name("int8_x86.c")
# The kernel on int8 inputs (``--matmul-inputs int8``): its weights packed in quads (``pack``),
# the same entry points, an AVX-512 VNNI build and an AVX2 build, widest first (the same bits).
INT8_INPUTS_SOURCE = Path(__file__).with_name("int8_q8_x86.c")
INT8_INPUTS_ISAS = ("avx512vnni", "avx2")
ISAS = ("avx512vnni", "avx512", "avx2")  # the builds of SOURCE, widest first
# The tile kernel (``int8_amx.c``): the same arithmetic on AMX tiles (the same bits: on the
# inputs' grid every sum is exact), for calls of TILE_MIN_ROWS rows or more. Tile kernel /
# VNNI build, Intel Xeon with AMX, 2 threads, the default model's layer shapes (qkv 960 x
# 576, gate_up 3072 x 576, down 576 x 1536), rows 5 / 6 / 8 / 12 / 16: 5 bits (Q5_0, Q5_1,
# Q5_K) 1.11-1.16x / 0.99-1.03x / 0.71-0.79x / 0.66-0.67x / 0.50-0.54x; 6 bits (Q6_K) 1.10-1.16x
# / 0.98-1.07x / 0.78-0.82x / 0.74-0.87x / 0.58-0.62x; bytes (Q8_0) 1.11-1.29x / 0.91-1.14x /
# 0.68-0.96x / 0.63-0.77x / 0.56-0.73x (its 49152 x 576 head at 8 rows 0.77x).
TILE_SOURCE = Path(__file__).with_name("int8_amx.c")
TILE_MIN_ROWS = 8
LANES = 16  # output columns per packed tile (the C file's LANES)
GROUPS = (16, 32)  # the group widths the loader gives it (Q6_K: 16; the others: 32)


def source_digest() -> str:
    return build.digest(SOURCE)


def tile_source_digest() -> str:
    return build.digest(TILE_SOURCE)


def declare(lib: ctypes.CDLL) -> None:
    for entry in (lib.int8_matmul, lib.int8_matmul_h):
        entry.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
        entry.restype = None
    lib.int8_rows.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    lib.int8_rows.restype = ctypes.c_int


def declare_tiles(lib: ctypes.CDLL) -> None:
    lib.amx_init.argtypes = []
    lib.amx_init.restype = ctypes.c_int
    for entry in (lib.int8_matmul_amx, lib.int8_matmul_h_amx):
        entry.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
        entry.restype = None


def load_tiles() -> build.Kernel:
    """The tile kernel (``int8_amx.c``); KernelUnavailable where the CPU or Linux cannot run it."""
    missing = build.missing_cpu_flags("amx")
    if missing:
        raise build.KernelUnavailable(f"the CPU lacks {', '.join(sorted(missing))}")
    kernel = build.load_build(TILE_SOURCE, "amx", declare_tiles)
    if kernel.library.amx_init() != 0:
        raise build.KernelUnavailable("Linux refused this process the AMX tiles (arch_prctl)")
    return kernel


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs.
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def load_int8_inputs(isa: str | None = None) -> build.Kernel:
    """The kernel on int8 inputs (``int8_q8_x86.c``): the ``isa`` build (or the widest at or
    below it), else the widest this CPU runs; KernelUnavailable where it cannot be built or
    run here."""
    return build.load(INT8_INPUTS_SOURCE, declare, INT8_INPUTS_ISAS, isa)


def int8_inputs_source_digest() -> str:
    return build.digest(INT8_INPUTS_SOURCE)


INT8 = 8  # the int8 layout's format (int8_packed.h: bits | signed << 4)
SIGNED = 16
FORMATS = (INT8, 5, 6, 5 | SIGNED, 6 | SIGNED)  # what int8_packed.h decodes


class Packed(NamedTuple):
    """A weight in the kernel's layout (``pack``): q's bytes, its scales and minimums, and
    q's format (int8_packed.h: the int8 layout, or 5 or 6 bits a value)."""

    q: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor | None
    format: int = INT8

    @property
    def shape(self) -> tuple[int, int]:
        """[N, K] of the weight."""
        q = self.q
        if self.format & 15 == INT8:  # [N/16, K, 16] or quads [N/16, K/4, 64]
            return q.shape[0] * LANES, q.shape[1] * q.shape[2] // LANES
        return q.shape[0] * LANES, q.shape[1] * 2  # [N/16, K/2, pair bytes]


def narrowest_format(q: torch.Tensor) -> int:
    """The fewest bits that hold every value of ``q`` (int8_packed.h): 5 or 6, signed
    (-2^(b-1) .. 2^(b-1) - 1) or not (0 .. 2^b - 1), else the int8 layout. Q5_0 fits 5 bits
    signed, Q5_1 and Q5_K 5 unsigned, Q6_K 6 signed; Q8_0 needs 8."""
    low, high = int(q.min()), int(q.max())
    for bits in (5, 6):
        if low >= 0 and high < 1 << bits:
            return bits
        if -(1 << (bits - 1)) <= low and high < 1 << (bits - 1):
            return bits | SIGNED
    return INT8


def _pack_bits(q: torch.Tensor, format: int) -> torch.Tensor:
    """q [N, K] -> [N/16, K/2, 16 + 4 (bits - 4)] uint8 (int8_packed.h's layout)."""
    bits = format & 15
    n, k = q.shape
    u = q.to(torch.int32) + ((1 << (bits - 1)) if format & SIGNED else 0)
    if int(u.min()) < 0 or int(u.max()) >= 1 << bits:
        raise ValueError(f"values outside {bits} bits")
    # [tile, pair, column, input of the pair]: the kernels' pair order (value 2j + i: column j at input 2p + i)
    pairs = u.reshape(n // LANES, LANES, k // 2, 2).permute(0, 2, 1, 3)
    nibbles = (pairs[..., 0] & 15) | ((pairs[..., 1] & 15) << 4)
    values = pairs.reshape(n // LANES, k // 2, 2 * LANES)
    parts = [nibbles]
    bit_weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int32)
    for h in range(bits - 4):
        # plane h as 4 bytes, little-endian: bit 2j + i of the 32-bit word is value 2j + i's bit 4 + h
        plane = ((values >> (4 + h)) & 1).reshape(n // LANES, k // 2, 4, 8)
        parts.append((plane * bit_weights).sum(-1))
    return torch.cat(parts, dim=-1).to(torch.uint8).contiguous()


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None, quads: bool = False,
         format: int | None = None) -> Packed:
    """(q [N, K] int8, scale and minimum [N, K/G]) -> the C kernel's layout: q [N/16, K, 16]
    int8, or where the values fit 5 or 6 bits (``format`` None: ``narrowest_format``; ``INT8``
    keeps a byte a value) [N/16, K/2, 16 + 4 (bits - 4)] bytes (int8_packed.h); scale and
    minimum [N/16, K/G, 16] (minimum None: the weight has none), float16 where every one of
    them is a float16 value (widening back is exact), else float32. ``quads`` (the kernel on
    int8 inputs, ``int8_q8_x86.c``; K a multiple of 32; always a byte a value): q [N/16, K/4,
    64], byte 4c+i of quad k holding column n0+c's value at input column 4k+i."""
    n, k = q.shape
    groups = scale.shape[1]
    if n % LANES or k % 32 or k % groups or (k // groups) not in GROUPS:
        raise ValueError(f"our int8 kernel needs N % {LANES} == 0, K % 32 == 0 and groups of {GROUPS}; "
                         f"got [{n}, {k}], {groups} groups")

    def per_tile(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return t.to(dtype).reshape(n // LANES, LANES, -1).permute(0, 2, 1).contiguous()

    params = [t.float() for t in (scale, minimum) if t is not None]
    exact_in_half = all(torch.equal(t.half().float(), t) for t in params)
    dtype = torch.float16 if exact_in_half else torch.float32
    format = INT8 if quads else narrowest_format(q) if format is None else format
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)} (int8_packed.h); got {format}")
    if quads:  # [tile, quad, column, input of 4]
        packed = q.to(torch.int8).reshape(n // LANES, LANES, k // 4, 4).permute(0, 2, 1, 3).reshape(n // LANES, k // 4, 4 * LANES)
    elif format == INT8:
        packed = per_tile(q, torch.int8)
    else:
        packed = _pack_bits(q, format)
    return Packed(packed.contiguous(), per_tile(scale, dtype), None if minimum is None else per_tile(minimum, dtype), format)


def dequantize_rows(weight: Packed, rows: torch.Tensor, lib: ctypes.CDLL) -> torch.Tensor:
    """float32 [len(rows), K]: the weight rows ``rows`` of a packed weight (``pack``),
    q * scale + minimum per group: the values the kernel multiplies by (an embedding's
    lookup, the output head's exact refinement), read from the packed layout itself by
    ``lib``'s ``int8_rows`` (a one-token step reads two such sets: torch's strided gathers
    cost ~0.1 ms each, the loop ~10 us)."""
    q, scale, minimum, format = weight
    n, k = weight.shape
    ids = rows.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    if lib.int8_rows(q.data_ptr(), scale.data_ptr(), minimum.data_ptr() if minimum is not None else None,
                     int(scale.dtype == torch.float16), ids.data_ptr(), ids.numel(), n, k, k // scale.shape[1], format,
                     out.data_ptr()):
        raise IndexError(f"a row id outside [0, {n})")
    return out


def bind(weight: Packed, lib: ctypes.CDLL, tiles: ctypes.CDLL | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (``pack``), by
    ``lib`` (a build of the kernel); the weight's pointers are taken once here. ``tiles``:
    the tile kernel's library (``load_tiles``), for calls of ``TILE_MIN_ROWS`` rows or
    more (the same bits)."""
    q, scale, minimum, format = weight
    name = "int8_matmul_h" if scale.dtype == torch.float16 else "int8_matmul"
    entry = getattr(lib, name)
    many_rows = getattr(tiles, name + "_amx") if tiles is not None else entry
    min_rows = TILE_MIN_ROWS if tiles is not None else 1 << 30
    n, k = weight.shape
    group = k // scale.shape[1]
    pointers = (q.data_ptr(), scale.data_ptr(), minimum.data_ptr() if minimum is not None else None)
    keep_alive = (q, scale, minimum)
    bf16, empty = torch.bfloat16, torch.empty

    def call(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != bf16 or not x.is_contiguous():
            x = x.to(bf16).contiguous()
        rows, width = x.shape
        if width != k:
            raise ValueError(f"int8 matmul: input has {width} columns, the weight {k}")
        y = empty(rows, n, dtype=bf16)
        if rows:
            (many_rows if rows >= min_rows else entry)(x.data_ptr(), *pointers, y.data_ptr(), rows, n, k, group, format)
        return y

    op = plan_cpu.address(lib, name + "_op")
    many_rows_op = plan_cpu.address(tiles, name + "_amx_op") if tiles is not None else op

    def op_row(x: int, y: int, rows: int) -> list[int]:
        """A forward plan's step (``plan_cpu``): this call on ``rows`` rows at addresses x and y."""
        return [many_rows_op if rows >= min_rows else op, x, *(p or 0 for p in pointers), y, rows, n, k, group, format]

    call.keep_alive = keep_alive  # the pointers above stay valid while the call lives
    call.op_row = op_row
    return call
