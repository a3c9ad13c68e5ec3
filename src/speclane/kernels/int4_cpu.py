"""Our int4 matmul (``int4_x86.c``: AVX-512 with bfloat16 dot products, AVX-512 or AVX2
build), built and loaded by ``build.py``.

``SPECLANE_INT4_KERNEL=auto|avx512bf16|avx512|avx2|torch`` picks it or torch's
``_weight_int4pack_mm_for_cpu`` (see ``build.py``); ``Int4Weight`` asks here once. All
builds give the same bits (each output column is one vector lane doing the same operations).

``SPECLANE_PROMPT_KERNEL=amx`` (opt-in; default ``off``) adds, where the CPU has AMX, a
second kernel over the same packed weights (``int4_amx.c``, the prompt kernel) for the
rows of prompts: many rows, where the tile unit's multiply-adds make a 96-token prefill
~0.35x the time. Its rows round differently in the last place, so the model sends it
prompt positions only, never a generated or verified one (``LlamaModel.forward``). Why
opt-in: as accurate as the int4 matmul (top-1 agreement with the float32 model on 214 and
213 of 216 prompts' first tokens), it flips other near-ties, and the default model's
"What is the capital of France?" is one (0.08 logits apart in float32): it loses Paris.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import cache
from pathlib import Path

import torch

from speclane.kernels import build
from speclane.kernels.build import KernelUnavailable

__all__ = ["KernelUnavailable", "available", "bind", "kernel_name", "matmul", "pack", "prompt_library", "source_digest"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int4_x86.c")
ISAS = ("avx512bf16", "avx512", "avx2")  # the builds of SOURCE, widest first
SWITCH = "SPECLANE_INT4_KERNEL"
LANES = 16  # output columns per packed tile (the C file's LANES)
GROUP = 32  # input columns per (scale, minimum) pair
PROMPT_SOURCE = Path(__file__).with_name("int4_amx.c")
PROMPT_ISAS = ("amx",)
PROMPT_SWITCH = "SPECLANE_PROMPT_KERNEL"
PROMPT_CHOICES = ("off", "amx")


def requested_kernel() -> str:
    return build.requested(SWITCH, ISAS)


def source_digest() -> str:
    return build.digest(SOURCE)


def _declare(lib: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    lib.int4_matmul.argtypes = [pointer] * 5 + [ctypes.c_int] * 3
    lib.int4_matmul.restype = None


def _declare_prompt(lib: ctypes.CDLL) -> None:
    lib.amx_init.argtypes = []
    lib.amx_init.restype = ctypes.c_int
    lib.int4_matmul_amx.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3
    lib.int4_matmul_amx.restype = None


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


@cache
def _prompt_kernel() -> build.Kernel | None:
    """The prompt kernel (``SPECLANE_PROMPT_KERNEL=amx``), or None: then prompt rows run on
    the int4 matmul like any other. Asked for where it cannot run, a clear error."""
    choice = os.environ.get(PROMPT_SWITCH, "off").strip().lower() or "off"
    if choice not in PROMPT_CHOICES:
        raise KernelUnavailable(f"{PROMPT_SWITCH}={choice!r}: expected one of {', '.join(PROMPT_CHOICES)}")
    if choice == "off":
        return None
    if _kernel() is None:  # it reads our int4 layout: only beside our matmul
        log.warning("%s=amx: not used, the int4 matmul is torch's", PROMPT_SWITCH)
        return None
    kernel = build.load(PROMPT_SOURCE, PROMPT_SWITCH, _declare_prompt, PROMPT_ISAS)  # raises where it cannot build
    if kernel.library.amx_init() != 0:
        raise KernelUnavailable(f"{PROMPT_SWITCH}=amx but Linux refused this process the AMX tiles (arch_prctl)")
    return kernel


def prompt_library() -> ctypes.CDLL | None:
    """The prompt kernel's library (``int4_amx.c``) where it runs here, else None."""
    kernel = _prompt_kernel()
    return kernel.library if kernel else None


def using_prompt(value: str) -> AbstractContextManager[None]:
    """``with using_prompt("amx"): ...``: the block runs with ``SPECLANE_PROMPT_KERNEL=value``."""
    return build.switched(PROMPT_SWITCH, value, _prompt_kernel)


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
         lib: ctypes.CDLL | None = None, function: str = "int4_matmul") -> Callable[[torch.Tensor], torch.Tensor]:
    """``x [M, K] bfloat16 -> x @ W^T [M, N] bfloat16`` for one packed weight (every row
    computed alike whatever M is), by ``lib`` (a build of the kernel; default: the one
    loaded last). The weight's checks and pointers are taken once here: a model calls its
    121 matmuls per forward, and at one row the Python around a call cost more than the
    call (42 µs per call before, of which the C function ~13). ``function``: the library's
    entry point (``int4_matmul_amx`` in the prompt kernel's)."""
    lib = lib or library()
    entry = getattr(lib, function)
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
            entry(x.data_ptr(), *weight, y.data_ptr(), rows, n, k)
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
