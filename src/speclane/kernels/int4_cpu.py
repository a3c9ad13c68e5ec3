"""Our int4 matmul (``int4_x86.c``: AVX-512 with bfloat16 dot products, AVX-512 or AVX2
build), built and loaded by ``build.py``.

``SPECLANE_INT4_KERNEL=auto|avx512bf16|avx512|avx2|torch`` picks it or torch's
``_weight_int4pack_mm_for_cpu`` (see ``build.py``); ``Int4Weight`` asks here once. All
builds give the same bits (each output column is one vector lane doing the same operations).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import cache
from pathlib import Path

import torch

from speclane.kernels import build
from speclane.kernels.build import KernelUnavailable

__all__ = ["KernelUnavailable", "available", "bind", "kernel_name", "matmul", "pack", "source_digest"]

SOURCE = Path(__file__).with_name("int4_x86.c")
ISAS = ("avx512bf16", "avx512", "avx2")  # the builds of SOURCE, widest first
SWITCH = "SPECLANE_INT4_KERNEL"
LANES = 16  # output columns per packed tile (the C file's LANES)
GROUP = 32  # input columns per (scale, minimum) pair


def requested_kernel() -> str:
    return build.requested(SWITCH, ISAS)


def source_digest() -> str:
    return build.digest(SOURCE)


def _declare(lib: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    lib.int4_matmul.argtypes = [pointer] * 5 + [ctypes.c_int] * 3
    lib.int4_matmul.restype = None


_loaded: ctypes.CDLL | None = None  # once loaded, weights packed for it keep working


@cache
def _kernel() -> build.Kernel | None:
    """The loaded kernel, or None when torch's kernel is to be used."""
    global _loaded
    kernel = build.load(SOURCE, SWITCH, _declare, ISAS)
    _loaded = kernel.library if kernel else _loaded
    return kernel


def using(value: str) -> AbstractContextManager[None]:
    """``with using("avx2"): ...``: the block runs with ``SPECLANE_INT4_KERNEL=value`` (``build.switched``)."""
    return build.switched(SWITCH, value, _kernel)


def available() -> bool:
    return _kernel() is not None


def kernel_name() -> str:
    """'avx512bf16', 'avx512', 'avx2' or 'torch': which kernel Int4Weight uses in this process."""
    kernel = _kernel()
    return kernel.isa if kernel else "torch"


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] in 0..15, scale, minimum [N, K/32]) -> the C kernel's layout.

    packed [N/16, K/2, 16] uint8 (byte j of pair p holds column n0+j's values at input
    columns 2p and 2p+1, low nibble first); scale and minimum [N/16, K/32, 16] float16
    (GGUF's Q4_1 stores them so), and the kernel computes with w = q * scale + minimum (see int4_x86.c).
    """
    n, k = q.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"our int4 kernel needs N % {LANES} == 0 and K % {GROUP} == 0; got [{n}, {k}]")
    pairs = q.to(torch.uint8).reshape(n // LANES, LANES, k // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 1).contiguous()

    def per_tile(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).reshape(n // LANES, LANES, k // GROUP).permute(0, 2, 1).contiguous()

    return packed, per_tile(scale), per_tile(minimum)


def library() -> ctypes.CDLL:
    """The build loaded last (an Int4Weight keeps the one it was made with)."""
    return _loaded or _kernel().library


def bind(packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
         lib: ctypes.CDLL | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (every row
    computed alike whatever M is), by ``lib`` (a build of the kernel; default: the one
    loaded last). The weight's checks and pointers are taken once here: a model calls its
    121 matmuls per forward, and at one row the Python around a call cost more than the
    call (42 µs per call before, of which the C function ~13)."""
    lib = lib or library()
    function = lib.int4_matmul
    n, k = packed.shape[0] * LANES, packed.shape[1] * 2
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
            function(x.data_ptr(), *weight, y.data_ptr(), rows, n, k)
        return y

    call.keep_alive = keep_alive  # the pointers above stay valid while the call lives
    return call


def matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor,
           lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``bind(packed, scale, minimum, lib)(x)``, for one call (tests, benchmarks)."""
    return bind(packed, scale, minimum, lib)(x)


# The same kernel as an operator torch.compile can keep inside one graph (``--compile``).
@torch.library.custom_op("speclane::int4_matmul", mutates_args=())
def int4_matmul_op(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    return matmul(x, packed, scale, minimum)


@int4_matmul_op.register_fake
def _(x, packed, scale, minimum):
    return x.new_empty(x.shape[0], packed.shape[0] * LANES, dtype=torch.bfloat16)
