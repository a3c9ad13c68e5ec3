"""Our AVX2 int4 matmul (``int4_avx2.c``): built with the system C compiler, loaded by ctypes.

Which kernel runs is decided once per process by ``SPECLANE_INT4_KERNEL``:

- ``auto`` (default): ours when the CPU has AVX2 + FMA and a C compiler (``cc``/``gcc``)
  is on PATH, else torch's ``_weight_int4pack_mm_for_cpu`` (logged once);
- ``avx2``: ours, and an error if it cannot be built;
- ``torch``: torch's kernel (for A/B benchmarks).

The shared library is compiled once per source version (~1 s) into
``~/.cache/speclane/kernels`` and reused. It is built with ``-fopenmp`` and resolves
``libgomp.so.1`` to the copy torch has already loaded, so its parallel loops use torch's
OpenMP threads (``torch.set_num_threads`` applies) rather than a second pool fighting
for the same cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int4_avx2.c")
LANES = 16  # output columns per packed tile (the C file's LANES)
GROUP = 32  # input columns per (scale, minimum) pair
KERNELS = ("auto", "avx2", "torch")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC"]
_CPU_FLAGS = {"avx2", "fma", "f16c"}


class KernelUnavailable(RuntimeError):
    pass


def requested_kernel() -> str:
    value = os.environ.get("SPECLANE_INT4_KERNEL", "auto").strip().lower() or "auto"
    if value not in KERNELS:
        raise KernelUnavailable(f"SPECLANE_INT4_KERNEL={value!r}: expected one of {', '.join(KERNELS)}")
    return value


def source_digest() -> str:
    return hashlib.sha1(SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]


def _missing_cpu_flags() -> set[str]:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):  # not Linux: torch's own probe (AVX2 implies FMA and F16C in practice)
        return set() if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else {"avx2"}
    return _CPU_FLAGS - set(flags.split(":", 1)[1].split())


def _build(out: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        partial = Path(tmp) / out.name
        result = subprocess.run([compiler, *_FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelUnavailable(f"{compiler} failed on {SOURCE.name}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, out)  # atomic: a concurrent process sees the whole file or none


@cache
def _library() -> ctypes.CDLL | None:
    """The loaded kernel, or None when torch's kernel is to be used."""
    choice = requested_kernel()
    if choice == "torch":
        log.info("int4 kernel: torch's (SPECLANE_INT4_KERNEL=torch)")
        return None
    try:
        missing = _missing_cpu_flags()
        if missing:
            raise KernelUnavailable(f"the CPU lacks {', '.join(sorted(missing))}")
        path = Path.home() / ".cache" / "speclane" / "kernels" / f"int4_avx2-{source_digest()}.so"
        if not path.exists():
            _build(path)
        lib = ctypes.CDLL(str(path))
    except (KernelUnavailable, OSError) as err:
        if choice == "avx2":
            raise KernelUnavailable(f"SPECLANE_INT4_KERNEL=avx2 but the kernel is unavailable: {err}") from err
        log.warning("int4 kernel: torch's, because ours is unavailable (%s)", err)
        return None
    pointer = ctypes.c_void_p
    lib.int4_matmul.argtypes = [pointer] * 5 + [ctypes.c_int] * 3 + [pointer]
    lib.int4_matmul.restype = None
    log.info("int4 kernel: speclane's AVX2 (%s)", path)
    return lib


def available() -> bool:
    return _library() is not None


def kernel_name() -> str:
    """'avx2' or 'torch': which kernel Int4Weight uses in this process."""
    return "avx2" if available() else "torch"


def pack(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [N, K] in 0..15, scale, minimum [N, K/32]) -> the C kernel's layout.

    packed [N/16, K/2, 16] uint8 (byte j of pair p holds column n0+j's values at input
    columns 2p and 2p+1, low nibble first); scale and minimum [N/16, K/32, 16] float16
    (GGUF's Q4_1 stores them so), and the kernel computes w = q * scale + minimum in float32.
    """
    n, k = q.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the AVX2 int4 kernel needs N % {LANES} == 0 and K % {GROUP} == 0; got [{n}, {k}]")
    pairs = q.to(torch.uint8).reshape(n // LANES, LANES, k // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 1).contiguous()

    def per_tile(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).reshape(n // LANES, LANES, k // GROUP).permute(0, 2, 1).contiguous()

    return packed, per_tile(scale), per_tile(minimum)


def matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """x [M, K] bfloat16 -> [M, N] bfloat16 (every row computed alike whatever M is)."""
    lib = _library()
    x = x.to(torch.bfloat16).contiguous()  # no-ops for the model's own activations
    rows, k = x.shape
    n = packed.shape[0] * LANES
    y = torch.empty(rows, n, dtype=torch.bfloat16)
    if rows:
        scratch = torch.empty(rows, k, dtype=torch.float32)
        lib.int4_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), minimum.data_ptr(), y.data_ptr(),
                        rows, n, k, scratch.data_ptr())
    return y


# The same kernel as an operator torch.compile can keep inside one graph (``--compile``).
@torch.library.custom_op("speclane::int4_matmul", mutates_args=())
def int4_matmul_op(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    return matmul(x, packed, scale, minimum)


@int4_matmul_op.register_fake
def _(x, packed, scale, minimum):
    return x.new_empty(x.shape[0], packed.shape[0] * LANES)
