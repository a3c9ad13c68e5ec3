"""The MTP head's whole draft step in one C call (``mtp_step.c``), built by ``build.py``.

The C file only calls the other kernels through the function pointers it is handed (the
int4 matmul, the norm and SiLU, the fused attention), so any of its builds gives their bits.
``models/mtp_kernel_step.py`` lays out its arguments (``FusedStep``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from speclane.kernels import build

SOURCE = Path(__file__).with_name("mtp_step.c")
ISAS = ("avx512", "avx2")  # it only calls the other kernels: any build does


def declare(lib: ctypes.CDLL) -> None:
    pointer = ctypes.c_void_p
    lib.mtp_step.argtypes = [pointer] * 3 + [ctypes.c_int] + [pointer] * 4 + [ctypes.c_int] + [pointer] * 4
    lib.mtp_step.restype = ctypes.c_int
    lib.mtp_draft_greedy.argtypes = [pointer] * 3 + [ctypes.c_int] * 2 + [pointer] * 4 + [ctypes.c_int] + [pointer] * 4
    lib.mtp_draft_greedy.restype = ctypes.c_int


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs;
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def source_digest() -> str:
    return build.digest(SOURCE)
