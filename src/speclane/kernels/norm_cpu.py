"""The residual add + RMSNorm and SiLU(gate) * up of a bfloat16 forward, fused in C
(``norm_x86.c``, AVX-512 or AVX2 build), built by ``build.py``.

``select.Kernels`` loads it (``load``) or leaves these to torch's ops. Ours replaces ~150 small torch ops of a one-token step, each mostly dispatch time.
Used for bfloat16 models only (a float32 model keeps torch's ops, as for attention).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from speclane.kernels import build, plan_cpu

SOURCE = Path(__file__).with_name("norm_x86.c")
ISAS = ("avx512", "avx2")  # the builds of SOURCE, widest first


def declare(lib: ctypes.CDLL) -> None:
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    lib.add_rms_norm.argtypes = [pointer] * 4 + [integer] * 2 + [ctypes.c_float]
    lib.add_rms_norm.restype = None
    lib.silu_mul.argtypes = [pointer] * 2 + [integer] * 2
    lib.silu_mul.restype = None


def add_rms_norm_row(lib: ctypes.CDLL, x: int, delta: int, weight: int, out: int, rows: int, hidden: int,
                     eps: float) -> list[int]:
    """``add_rms_norm`` as a forward plan's step (``plan_cpu``; addresses as ints, delta 0: none)."""
    return [plan_cpu.address(lib, "add_rms_norm_op"), x, delta, weight, out, rows, hidden, plan_cpu.float_bits(eps)]


def silu_mul_row(lib: ctypes.CDLL, gate_up: int, out: int, rows: int, intermediate: int) -> list[int]:
    """``silu_mul`` as a forward plan's step (``plan_cpu``)."""
    return [plan_cpu.address(lib, "silu_mul_op"), gate_up, out, rows, intermediate]


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs;
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def source_digest() -> str:
    return build.digest(SOURCE)


class LayerOps:
    """A forward's add + RMSNorm and SiLU * up, by our kernel (``lib``, a loaded build) or by
    torch's ops (``lib`` None): chosen once (``for_dtype``), so the layer loop has no branches."""

    def __init__(self, lib: ctypes.CDLL | None, dtype: torch.dtype):
        self.lib = lib
        self._dtype = dtype

    @classmethod
    def for_dtype(cls, lib: ctypes.CDLL | None, dtype: torch.dtype) -> LayerOps:
        """Ours for bfloat16 forwards where ``lib`` is loaded; a float32 one keeps torch's ops."""
        return cls(lib if dtype == torch.bfloat16 else None, dtype)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x += delta`` (in place; x [T, H] float32, delta [T, H] or None), then the norm of x
        with ``weight`` in the forward's dtype."""
        if self.lib is None:
            if delta is not None:
                x.add_(delta)
            return F.rms_norm(x, (x.shape[-1],), weight, eps).to(self._dtype)
        if x.dtype != torch.float32 or not x.is_contiguous() or weight.dtype != torch.float32:
            raise ValueError("add_rms_norm: a contiguous float32 residual stream and float32 norm weights only")
        rows, hidden = x.shape
        if delta is not None:
            delta = delta.to(torch.bfloat16).contiguous()
        out = torch.empty(rows, hidden, dtype=torch.bfloat16)
        self.lib.add_rms_norm(x.data_ptr(), delta.data_ptr() if delta is not None else None, weight.data_ptr(),
                               out.data_ptr(), rows, hidden, eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
        """gate_up [T, 2 * I] (gate, then up) -> SiLU(gate) * up [T, I]."""
        if self.lib is None:
            gate, up = gate_up.split(intermediate, dim=-1)
            return F.silu(gate) * up
        gate_up = gate_up.to(torch.bfloat16).contiguous()  # no-ops for the int4 kernel's output
        out = torch.empty(gate_up.shape[0], intermediate, dtype=torch.bfloat16)
        self.lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], intermediate)
        return out
