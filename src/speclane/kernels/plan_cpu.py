"""The forward plan's runner (``plan.c``), built by ``build.py``, and the pieces of the
calling convention (``op.h``) the plan's tables are written in: a kernel's ``_op`` entry
point as an address, a float as its 32 bits."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

from speclane.kernels import build

SOURCE = Path(__file__).with_name("plan.c")
ISAS = ("avx2",)  # no vector code: one build, for every CPU our other kernels run on


def source_digest() -> str:
    return build.digest(SOURCE)


def declare(lib: ctypes.CDLL) -> None:
    lib.run_plan.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.run_plan.restype = None


def load(isa: str | None = None) -> build.Kernel:
    """The runner; KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, "avx2" if isa is not None else None)


def address(lib: ctypes.CDLL, name: str) -> int:
    """The address of ``lib``'s function ``name`` (a plan step's first column)."""
    value = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    if value is None:
        raise ValueError(f"{name}: no address")
    return value


def float_bits(value: float) -> int:
    """A float argument as op.h's ``op_float`` reads it: its float32 bits."""
    return struct.unpack("<i", struct.pack("<f", value))[0]
