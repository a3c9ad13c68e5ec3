"""Our int8-group matmul (``int8_x86.c``: AVX-512 or AVX2 build), built and loaded by
``build.py``: w = q * scale + minimum per group of ``group`` (32 or 16) input columns, q an
int8, scale and minimum float32. It runs the GGUF types whose integers do not fit the int4
kernel's 0..15 (``models/gguf_types.py``). Both builds give the same bits, and a row's
result does not depend on the other rows of its call (``int8_x86.c``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from speclane.kernels import build

__all__ = ["bind", "load", "pack", "source_digest"]

SOURCE = Path(__file__).with_name("int8_x86.c")
ISAS = ("avx512", "avx2")  # the builds of SOURCE, widest first
LANES = 16  # output columns per packed tile (the C file's LANES)
GROUPS = (16, 32)  # the group widths the loader gives it (Q6_K: 16; the others: 32)


def source_digest() -> str:
    return build.digest(SOURCE)


def declare(lib: ctypes.CDLL) -> None:
    lib.int8_matmul.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.int8_matmul.restype = None


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs.
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q [N, K] int8, scale and minimum [N, K/G]) -> the C kernel's layout: q [N/16, K, 16]
    int8, scale and minimum [N/16, K/G, 16] float32 (minimum None: the weight has none)."""
    n, k = q.shape
    groups = scale.shape[1]
    if n % LANES or k % groups or (k // groups) not in GROUPS:
        raise ValueError(f"our int8 kernel needs N % {LANES} == 0 and groups of {GROUPS}; got [{n}, {k}], {groups} groups")

    def per_tile(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return t.to(dtype).reshape(n // LANES, LANES, -1).permute(0, 2, 1).contiguous()

    f32 = torch.float32
    return per_tile(q, torch.int8), per_tile(scale, f32), None if minimum is None else per_tile(minimum, f32)


def bind(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor | None, lib: ctypes.CDLL
         ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (``pack``), by
    ``lib`` (a build of the kernel); the weight's pointers are taken once here."""
    entry = lib.int8_matmul
    n, k = q.shape[0] * LANES, q.shape[1]
    group = k // scale.shape[1]
    weight = (q.data_ptr(), scale.data_ptr(), minimum.data_ptr() if minimum is not None else None)
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
            entry(x.data_ptr(), *weight, y.data_ptr(), rows, n, k, group)
        return y

    call.keep_alive = keep_alive  # the pointers above stay valid while the call lives
    return call
