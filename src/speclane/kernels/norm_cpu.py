"""The small operations between a bfloat16 forward's matmuls, fused in C (``norm_x86.c``,
AVX-512 or AVX2 build), built by ``build.py``: the residual add + RMSNorm, RMSNorm of
column groups (q/k heads, Gemma's output norms), SiLU or GELU-tanh (gate) * up, and the
head's widening with its top candidates; and their forward-plan steps.

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
ACTIVATIONS = {"silu": "silu_mul", "gelu_tanh": "gelu_tanh_mul"}  # a gated MLP's activation -> the C function
ISAS = ("avx512", "avx2")  # the builds of SOURCE, widest first


def declare(lib: ctypes.CDLL) -> None:
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    lib.add_rms_norm.argtypes = [pointer] * 4 + [integer] * 2 + [ctypes.c_float]
    lib.add_rms_norm.restype = None
    lib.add_rms_norm_f32.argtypes = [pointer] * 4 + [integer] * 2 + [ctypes.c_float]
    lib.add_rms_norm_f32.restype = None
    lib.silu_mul.argtypes = [pointer] * 2 + [integer] * 2
    lib.silu_mul.restype = None
    lib.rms_norm_groups.argtypes = [pointer] + [integer] * 4 + [pointer, ctypes.c_float]
    lib.rms_norm_groups.restype = None
    lib.gelu_tanh_mul.argtypes = [pointer] * 2 + [integer] * 2
    lib.gelu_tanh_mul.restype = None
    lib.top_logits.argtypes = [pointer] * 3 + [integer] * 3
    lib.top_logits.restype = None
    lib.refine_logits.argtypes = [pointer] * 4 + [integer] * 4
    lib.refine_logits.restype = None


def add_rms_norm_row(lib: ctypes.CDLL, x: int, delta: int, weight: int, out: int, rows: int, hidden: int,
                     eps: float) -> list[int]:
    """``add_rms_norm`` as a forward plan's step (``plan_cpu``; addresses as ints, delta 0: none)."""
    return [plan_cpu.address(lib, "add_rms_norm_op"), x, delta, weight, out, rows, hidden, plan_cpu.float_bits(eps)]


def add_rms_norm_f32_row(lib: ctypes.CDLL, x: int, delta: int, weight: int, out: int, rows: int, hidden: int,
                         eps: float) -> list[int]:
    """``final_norm`` as a forward plan's step (out float32; column 4 is out's address)."""
    return [plan_cpu.address(lib, "add_rms_norm_f32_op"), x, delta, weight, out, rows, hidden, plan_cpu.float_bits(eps)]


def copy_columns_row(lib: ctypes.CDLL, src: int, dst: int, rows: int, width: int, ld: int, offset: int) -> list[int]:
    """``copy_columns`` as a forward plan's step: src [rows, width] bfloat16 into columns
    [offset, offset + width) of dst's rows of ``ld`` columns."""
    return [plan_cpu.address(lib, "copy_columns_op"), src, dst, rows, width, ld, offset]


def gated_activation_row(lib: ctypes.CDLL, activation: str, gate_up: int, out: int, rows: int, intermediate: int
                         ) -> list[int]:
    """``silu_mul`` or ``gelu_tanh_mul`` (``activation``: "silu" or "gelu_tanh") as a forward
    plan's step (``plan_cpu``)."""
    return [plan_cpu.address(lib, ACTIVATIONS[activation] + "_op"), gate_up, out, rows, intermediate]


def rms_norm_groups_row(lib: ctypes.CDLL, x: int, rows: int, stride: int, groups: int, width: int, weight: int,
                        eps: float) -> list[int]:
    """``rms_norm_groups`` as a forward plan's step: in place over ``groups`` groups of
    ``width`` columns at address x of rows of ``stride`` columns (bfloat16)."""
    return [plan_cpu.address(lib, "rms_norm_groups_op"), x, rows, stride, groups, width, weight, plan_cpu.float_bits(eps)]


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs;
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def source_digest() -> str:
    return build.digest(SOURCE)


class LayerOps:
    """A forward's small operations (add + RMSNorm, group norms, the gated activation, the
    head's candidates) by our kernel (``lib``, a loaded build) or by torch's ops (``lib``
    None): chosen once (``for_dtype``), so the layer loop has no branches."""

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
        return self._add_rms_norm("add_rms_norm", x, delta, weight, eps, torch.bfloat16)

    def final_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The model's last norm: float32 [T, H] of x + delta (x float32 [T, H], changed in
        place by ours; delta [T, H] or None) with ``weight``."""
        if self.lib is None:
            return F.rms_norm(x if delta is None else x + delta, (x.shape[-1],), weight, eps)
        return self._add_rms_norm("add_rms_norm_f32", x, delta, weight, eps, torch.float32)

    def _add_rms_norm(self, name: str, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                      dtype: torch.dtype) -> torch.Tensor:
        """Our C ``name`` (add_rms_norm, or add_rms_norm_f32): x += delta in place, its norm
        into a fresh [T, H] tensor of ``dtype``."""
        if x.dtype != torch.float32 or not x.is_contiguous() or weight.dtype != torch.float32:
            raise ValueError(f"{name}: a contiguous float32 residual stream and float32 norm weights only")
        rows, hidden = x.shape
        if delta is not None:
            delta = delta.to(torch.bfloat16).contiguous()
        out = torch.empty(rows, hidden, dtype=dtype)
        getattr(self.lib, name)(x.data_ptr(), delta.data_ptr() if delta is not None else None, weight.data_ptr(),
                                out.data_ptr(), rows, hidden, eps)
        return out

    def gated_activation(self, gate_up: torch.Tensor, intermediate: int, activation: str) -> torch.Tensor:
        """gate_up [T, 2 * I] (gate, then up) -> act(gate) * up [T, I], ``activation`` "silu"
        or "gelu_tanh" (GELU's tanh approximation, Gemma's)."""
        if self.lib is None:
            gate, up = gate_up.split(intermediate, dim=-1)
            return (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")) * up
        gate_up = gate_up.to(torch.bfloat16).contiguous()  # no-ops for the int4 kernel's output
        out = torch.empty(gate_up.shape[0], intermediate, dtype=torch.bfloat16)
        getattr(self.lib, ACTIVATIONS[activation])(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], intermediate)
        return out

    def rms_norm_groups(self, x: torch.Tensor, groups: list[tuple[int, int, int, torch.Tensor]], eps: float
                        ) -> torch.Tensor:
        """RMSNorm of column groups of x [T, C]: each (start, count, width, weight) normalizes
        ``count`` groups of ``width`` columns from column ``start`` with ``weight`` [width].
        Ours: in place on x (bfloat16) and returns it; torch's: a float32 copy of x with the
        groups normalized (the columns outside the groups as they were)."""
        if self.lib is None:
            out = x.float()
            for start, count, width, weight in groups:
                part = out[:, start : start + count * width].view(-1, count, width)
                out[:, start : start + count * width] = F.rms_norm(part, (width,), weight, eps).view(-1, count * width)
            return out
        if x.dtype != torch.bfloat16 or not x.is_contiguous():
            raise ValueError("rms_norm_groups: a contiguous bfloat16 tensor only")
        rows, columns = x.shape
        for start, count, width, weight in groups:
            if weight.dtype != torch.float32 or weight.numel() != width or start + count * width > columns:
                raise ValueError(f"rms_norm_groups: {count} groups of {width} from column {start} of {columns} "
                                 f"with a {weight.dtype} weight of {weight.numel()}")
            self.lib.rms_norm_groups(x.data_ptr() + 2 * start, rows, columns, count, width, weight.data_ptr(), eps)
        return x

    def refine_logits(self, logits: torch.Tensor, top: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor
                      ) -> torch.Tensor:
        """logits [N, vocab] float32 with each row's candidates ``top`` [N, R] set to their
        exact values, the float32 products of ``hidden`` [N, H] and ``rows`` [N, R, H] (the
        candidates' exact weights); in place, and returned."""
        hidden = hidden.float()
        if self.lib is None:
            return logits.scatter_(-1, top, torch.einsum("nh,nrh->nr", hidden, rows))
        n, count = top.shape
        if (logits.dtype != torch.float32 or not logits.is_contiguous() or rows.dtype != torch.float32
                or rows.shape != (n, count, hidden.shape[1]) or logits.shape[0] != n):
            raise ValueError("refine_logits: float32 logits [N, vocab] and candidate rows [N, R, hidden]")
        hidden, rows, top = hidden.contiguous(), rows.contiguous(), top.to(torch.int64).contiguous()
        self.lib.refine_logits(hidden.data_ptr(), rows.data_ptr(), top.data_ptr(), logits.data_ptr(), n, count,
                               hidden.shape[1], logits.shape[1])
        return logits

    def top_logits(self, coarse: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A quantized head's coarse logits [N, vocab] -> (them in float32, each row's
        ``count`` largest indices [N, count] int64, largest first, equal values in index
        order). Ours where the output is bfloat16 (``top_logits`` in the C file), else torch's."""
        if self.lib is None or coarse.dtype != torch.bfloat16:
            logits = coarse.float()  # a NaN is never a candidate here either
            return logits, logits.nan_to_num(nan=float("-inf")).topk(count, dim=-1).indices
        coarse = coarse.contiguous()
        rows, vocab = coarse.shape
        if not 1 <= count <= vocab:
            raise ValueError(f"top_logits: {count} candidates of {vocab}")
        logits = torch.empty(rows, vocab, dtype=torch.float32)
        top = torch.empty(rows, count, dtype=torch.int32)
        self.lib.top_logits(coarse.data_ptr(), logits.data_ptr(), top.data_ptr(), rows, vocab, count)
        return logits, top.long().clamp_(min=0)  # a NaN row's missing candidates (-1): refine token 0 instead
