"""Our int4 matmul (``int4_x86.c``: AVX-512 with bfloat16 dot products, AVX-512 or AVX2
build), built and loaded by ``build.py``.

``select.Kernels`` loads it (``load``) or leaves torch's ``_weight_int4pack_mm_for_cpu`` to
``Int4Weight``. All builds give the same bits (each output column is one vector lane doing
the same operations).

The AVX-512 VNNI build runs calls of up to 12 rows in integers (``vpdpwssd`` on the
inputs as int16 multiples of their group's step, as the AVX2 build does with ``vpmaddwd``):
on an Intel Xeon with AMX, the default model's layer and head shapes at 1-4 rows took
0.77-0.87x the plain AVX-512 build's time, and the lm head 0.87x at one row
(``benchmarks/kernels.py``); from 13 rows it is the plain build.

Without a pinned build, a CPU with AVX512_BF16 times the bfloat16 build against the other
AVX-512 build it runs (VNNI, else plain) on a few rows and, where no tile kernel takes the
calls of many rows, at a batch's width too, and keeps the faster over both
(``faster_build``): which one wins depends on the core, not on its flags. On a Zen 5
``vdpbf16ps`` (two multiply-adds per lane) made a 5-row verify 0.68x the plain build's
time; on an Intel Xeon with AMX it runs at half the plain build's FMA rate (5 rows 1.37x,
96 rows 1.64x the plain build's time). The bits are the same either way, so the choice
changes only speed.

The tile kernel (``load_tiles``; ``select.Kernels`` takes it where the CPU has AMX and Linux
grants this process its tiles): a second kernel over the same packed weights
(``int4_amx.c``, the tile kernel) takes every call of ``TILE_MIN_ROWS`` rows or more: a
prefill's chunks, a verify round of K >= 4, a tick of five streams or more. Its tile unit adds
a group's products in an order of its own, and that does not change the bits: the int4
arithmetic rounds each input to a grid of its group (``grid.h``, ``round_group``) on which
every sum of a group's products is exact in float32, whatever the order. So a row's result
does not depend on the kernel its call took, and the choice is by rows alone.

``--matmul-inputs int8`` swaps all of these for ``int4_q8_x86.c`` (``load_int8_inputs``): the
inputs rounded to int8 per group of 32, another arithmetic (as llama.cpp's), on the same
values and scales packed in quads (``pack(..., quads=True)``).
"""

from __future__ import annotations

import ctypes
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from speclane.kernels import build, plan_cpu
from speclane.kernels.build import KernelUnavailable

__all__ = ["KernelUnavailable", "bind", "dequantize_rows", "load", "load_int8_inputs", "load_tiles", "matmul", "pack", "source_digest", "tile_source_digest"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int4_x86.c")
ISAS = ("avx512bf16", "avx512vnni", "avx512", "avx2")  # the builds of SOURCE, widest first
LANES = 16  # output columns per packed tile (the C file's LANES)
PLANES_ISA = "avx2"  # the build that reads its weights in planes (``pack(..., planes=True)``; the C file's q4_weight)
# Where a plane lane keeps input 8b + 2j + odd: bits 4j + 16 odd ([j, odd], j = 0..3).
PLANE_SHIFTS = 4 * torch.arange(4, dtype=torch.int32)[:, None] + 16 * torch.arange(2, dtype=torch.int32)
GROUP = 32  # input columns per (scale, minimum) pair
TILE_SOURCE = Path(__file__).with_name("int4_amx.c")
# The int4 matmul on int8 inputs (``--matmul-inputs int8``): the same packed weights and
# entry points, an AVX-512 VNNI build and an AVX2 build, widest first (the same bits).
INT8_INPUTS_SOURCE = Path(__file__).with_name("int4_q8_x86.c")
INT8_INPUTS_ISAS = ("avx512vnni", "avx2")
# Calls of this many rows or more run on the tile kernel. The 120 layer matmuls of the
# default model, tile kernel / plain AVX-512 build (Intel Xeon with AMX, two runs in one
# process each, benchmarks/kernels.py and a /tmp script): 3 rows 0.91x / 1.01x, 4 rows
# 1.05x / 0.90x, 5 rows 0.98x / 0.81x, 8 rows 0.84x / 0.72x, 96 rows 0.40x / 0.41x; at 1-2
# rows, where the weights' stream from memory sets both, 1.0-1.2x. From 5 on it never lost.
TILE_MIN_ROWS = 5


def source_digest() -> str:
    return build.digest(SOURCE)


def declare(lib: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    lib.int4_matmul.argtypes = [pointer] * 5 + [ctypes.c_int] * 3
    lib.int4_matmul.restype = None


def declare_tiles(lib: ctypes.CDLL) -> None:
    lib.amx_init.argtypes = []
    lib.amx_init.restype = ctypes.c_int
    lib.int4_matmul_amx.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3
    lib.int4_matmul_amx.restype = None


def load(isa: str | None = None, many_rows: bool = True) -> build.Kernel:
    """Our int4 matmul: the ``isa`` build (or the widest at or below it), else the widest
    this CPU runs, which with AVX512_BF16 is the faster of the two AVX-512 builds
    (``faster_build``) over the row counts it will serve: ``many_rows`` False where the tile
    kernel takes the calls of ``TILE_MIN_ROWS`` rows or more. KernelUnavailable where it
    cannot be built or run here."""
    kernel = build.load(SOURCE, declare, ISAS, isa)
    if isa is None and kernel.isa == "avx512bf16":
        kernel = faster_build(kernel, TIMING_ROWS + (BATCH_TIMING_ROWS if many_rows else ()))
    return kernel


def load_int8_inputs(isa: str | None = None) -> build.Kernel:
    """The int4 matmul on int8 inputs (``int4_q8_x86.c``): the ``isa`` build (or the widest at
    or below it), else the widest this CPU runs; KernelUnavailable where it cannot be built
    or run here."""
    return build.load(INT8_INPUTS_SOURCE, declare, INT8_INPUTS_ISAS, isa)


def int8_inputs_source_digest() -> str:
    return build.digest(INT8_INPUTS_SOURCE)


def load_tiles() -> build.Kernel:
    """The tile kernel (``int4_amx.c``); KernelUnavailable where the CPU or Linux cannot run it."""
    missing = build.missing_cpu_flags("amx")
    if missing:
        raise KernelUnavailable(f"the CPU lacks {', '.join(sorted(missing))}")
    kernel = build.load_build(TILE_SOURCE, "amx", declare_tiles)
    if kernel.library.amx_init() != 0:
        raise KernelUnavailable("Linux refused this process the AMX tiles (arch_prctl)")
    return kernel


# The timing behind auto's choice: a gate_up-shaped weight (~1 MB packed: it stays in
# cache, so the timing is of the multiply-adds, where the builds differ; one row streams
# the model's weights from memory at the same speed in both) at the most rows the vector
# build serves beside the tile kernel (TILE_MIN_ROWS - 1; a K=3 verify round elsewhere)
# and, where no tile kernel runs, at a batch's width too: the build then serves every
# forward. On an AMD EPYC (Zen 4: AVX512_BF16 and VNNI, no AMX), ms per call, bfloat16 /
# VNNI build: 1 row 0.035 / 0.031, 4 rows 0.061 / 0.057, 16 rows 0.18 / 0.33, 64 rows
# 0.65 / 1.18. At 4 rows the two are within the margin's noise, so a 4-row timing alone
# picks either; on the VNNI build 16 streams of the default model decode at 0.65-0.72x
# the bfloat16 build's aggregate tok/s, one stream at 1.02x (within the noise).
TIMING_SHAPE = (3072, 576)
TIMING_ROWS = (TILE_MIN_ROWS - 1,)
BATCH_TIMING_ROWS = (16,)
TIMING_ROUNDS = 7
TIMING_CALLS = 4  # per round and build; the builds alternate round by round
# The widest build is kept unless another takes at most this fraction of its time: on a
# draw (noise on a shared machine), no reason to move.
TIMING_MARGIN = 0.95


def faster_build(widest: build.Kernel, rows: tuple[int, ...] = TIMING_ROWS) -> build.Kernel:
    """With AVX512_BF16 and no pinned build: the bfloat16 build or the other AVX-512 build
    this CPU runs (VNNI, else plain), by a timing at each of ``rows`` (~10 ms each; both
    give the same bits). That one unavailable: the bfloat16 one."""
    other_isa = "avx512vnni" if not build.missing_cpu_flags("avx512vnni") else "avx512"
    try:
        other = build.load_build(SOURCE, other_isa, declare)
    except KernelUnavailable as err:
        log.warning("int4_x86: the %s build is unavailable (%s); keeping %s", other_isa, err, widest.isa)
        return widest
    kernels = {kernel.isa: kernel for kernel in (widest, other)}
    ms = time_builds({isa: kernel.library for isa, kernel in kernels.items()}, rows)
    isa = faster(ms, widest.isa)
    log.info("int4_x86: auto chose %s (%s ms per call at %s rows%s)", isa,
             ", ".join(f"{name} {value:.3f}" for name, value in ms.items()), " and ".join(map(str, rows)),
             ", summed" if len(rows) > 1 else "")
    return kernels[isa]


def time_builds(libraries: dict[str, ctypes.CDLL], rows: tuple[int, ...] = TIMING_ROWS) -> dict[str, float]:
    """Per build, the sum over ``rows`` of its median ms per call on ``TIMING_SHAPE`` at that
    many rows, the builds alternated so that a slow moment of the machine falls on both."""
    n, k = TIMING_SHAPE
    generator = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (n // LANES, k // 2, LANES), dtype=torch.uint8, generator=generator)
    scale = (torch.rand(n // LANES, k // GROUP, LANES, generator=generator) * 0.01 + 0.001).half()
    minimum = (torch.rand(n // LANES, k // GROUP, LANES, generator=generator) * -0.1).half()
    calls = {isa: bind(packed, scale, minimum, lib) for isa, lib in libraries.items()}
    total = dict.fromkeys(calls, 0.0)
    for width in rows:
        x = torch.randn(width, k, generator=generator).bfloat16()
        samples: dict[str, list[float]] = {isa: [] for isa in calls}
        for round_ in range(TIMING_ROUNDS + 1):  # round 0 warms up
            for isa, call in calls.items():
                start = time.perf_counter()
                for _ in range(TIMING_CALLS):
                    call(x)
                if round_:
                    samples[isa].append((time.perf_counter() - start) * 1000 / TIMING_CALLS)
        for isa, values in samples.items():
            total[isa] += statistics.median(values)
    return total


def faster(ms: dict[str, float], incumbent: str, margin: float = TIMING_MARGIN) -> str:
    """The build to keep: the fastest in ``ms`` if it takes at most ``margin`` of the
    incumbent's time, else the incumbent."""
    best = min(ms, key=ms.__getitem__)
    return best if ms[best] <= margin * ms[incumbent] else incumbent


def tile_source_digest() -> str:
    return build.digest(TILE_SOURCE)


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, quads: bool = False, planes: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] in 0..15, scale, minimum [N, K/32]) -> the C kernel's layout.

    packed [N/16, K/2, 16] uint8 (byte j of pair p holds column n0+j's values at input
    columns 2p and 2p+1, low nibble first); scale and minimum [N/16, K/32, 16] float16
    (GGUF's Q4_1 stores them so), and the kernel computes with w = q * scale + minimum (see int4_x86.c).
    ``quads`` (the kernel on int8 inputs, ``int4_q8_x86.c``): packed [N/16, K/4, 32] instead,
    byte 4c+i of quad k holding column n0+c's value at input column 4k+i in its low nibble
    and column n0+c+8's in its high one (a mask and a shift make two vectors of 8 columns).
    ``planes`` (the AVX2 build of ``int4_x86.c``, ``PLANES_ISA``): packed [N/16, K/8, 64]:
    block b of a tile is 16 little-endian 32-bit lanes, lane c holding column n0+c's 8
    values at input columns 8b..8b+7, input 8b+2j in bits 4j..4j+3 and input 8b+2j+1 in bits
    16+4j..19+4j (a shift and a mask make the int16 pairs of 8 columns: see direct_int).
    """
    n, k = q.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"our int4 kernel needs N % {LANES} == 0 and K % {GROUP} == 0; got [{n}, {k}]")
    if quads and planes:
        raise ValueError("pack: one layout, quads or planes")
    tiles = q.to(torch.uint8).reshape(n // LANES, LANES, k)
    if planes:  # [tile, column, block, j, odd] -> lanes [tile, block, column]
        values = tiles.to(torch.int32).reshape(n // LANES, LANES, k // 8, 4, 2)
        lanes = (values << PLANE_SHIFTS).sum((-2, -1), dtype=torch.int32).permute(0, 2, 1).contiguous()
        packed = lanes.view(torch.uint8).reshape(n // LANES, k // 8, 4 * LANES)
    elif quads:  # [tile, quad, column c of 8, input i of 4]
        halves = tiles.reshape(n // LANES, 2, 8, k // 4, 4).permute(0, 1, 3, 2, 4)
        packed = (halves[:, 0] | (halves[:, 1] << 4)).reshape(n // LANES, k // 4, 32).contiguous()
    else:
        pairs = tiles.reshape(n // LANES, LANES, k // 2, 2)
        packed = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 1).contiguous()

    def per_tile(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).reshape(n // LANES, LANES, k // GROUP).permute(0, 2, 1).contiguous()

    return packed, per_tile(scale), per_tile(minimum)


def dequantize_rows(packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """float32 [len(rows), K]: the weight rows ``rows`` of a packed weight (``pack``, any
    layout: a quad layout's last dimension is 32, a plane layout's 64), q * scale + minimum
    per group of 32 (an embedding's lookup, the output head's exact refinement), read from
    the packed layout itself."""
    tile, lane = rows // LANES, rows % LANES
    if packed.shape[-1] == 4 * LANES:  # planes: lane c of each block, 8 inputs a lane
        lanes = packed.view(torch.int32)[tile, :, lane]  # [R, K/8]
        q = ((lanes[..., None] >> PLANE_SHIFTS.flatten()) & 0x0F).flatten(1).float()  # [R, K]: inputs 8b + 2j + odd
    elif packed.shape[-1] == 32:  # quads: lane c < 8 in the low nibbles of bytes 4c..4c+3, c + 8 in the high ones
        nibbles = packed.unflatten(-1, (8, 4))[tile, :, lane % 8]  # [R, K/4, 4]
        q = torch.where((lane >= 8)[:, None, None], nibbles >> 4, nibbles & 0x0F).flatten(1).float()  # [R, K]
    else:
        pairs = packed[tile, :, lane]  # [R, K/2]: two input columns a byte, low nibble first
        q = torch.stack([pairs & 0x0F, pairs >> 4], dim=-1).flatten(1).float()  # [R, K]
    w = q.unflatten(1, (-1, GROUP)) * scale[tile, :, lane].float()[..., None] + minimum[tile, :, lane].float()[..., None]
    return w.flatten(1)


def bind(packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, lib: ctypes.CDLL,
         function: str = "int4_matmul", tiles: ctypes.CDLL | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (every row
    computed alike whatever M is), by ``lib`` (a build of the kernel). The weight's checks and pointers are taken once here: a model calls its
    121 matmuls per forward, and at one row the Python around a call cost more than the
    call (42 µs per call before, of which the C function ~13). ``function``: the library's
    entry point (``int4_matmul_amx`` in the tile kernel's). ``tiles``: the tile kernel's
    library, for calls of ``TILE_MIN_ROWS`` rows or more (the same bits)."""
    entry = getattr(lib, function)
    many_rows = tiles.int4_matmul_amx if tiles is not None else entry
    min_rows = TILE_MIN_ROWS if tiles is not None else 1 << 30
    n, k = packed.shape[0] * LANES, packed.shape[1] * packed.shape[2] // (LANES // 2)  # either layout (pack)
    weight = (packed.data_ptr(), scale.data_ptr(), minimum.data_ptr())
    keep_alive = (packed, scale, minimum)
    bf16, empty = torch.bfloat16, torch.empty

    def call(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != bf16 or not x.is_contiguous():  # the model's own activations already are
            x = x.to(bf16).contiguous()
        rows, width = x.shape
        if width != k:
            raise ValueError(f"int4 matmul: input has {width} columns, the weight {k}")
        y = empty(rows, n, dtype=bf16)
        if rows:
            (many_rows if rows >= min_rows else entry)(x.data_ptr(), *weight, y.data_ptr(), rows, n, k)
        return y

    ops: list[int] = []  # the entry points' ``_op`` twins, looked up when a plan first asks

    def op_row(x: int, y: int, rows: int) -> list[int]:
        """A forward plan's step (``plan_cpu``): this call on ``rows`` rows at addresses x and y."""
        if not ops:
            ops.append(plan_cpu.address(lib, function + "_op"))
            ops.append(plan_cpu.address(tiles, "int4_matmul_amx_op") if tiles is not None else 0)
        return [ops[1] if rows >= min_rows else ops[0], x, *weight, y, rows, n, k]

    call.keep_alive = keep_alive  # the pointers above stay valid while the call lives
    call.op_row = op_row
    return call


def matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
           lib: ctypes.CDLL) -> torch.Tensor:
    """``bind(packed, scale, minimum, lib)(x)``, for one call (tests, benchmarks)."""
    return bind(packed, scale, minimum, lib)(x)
