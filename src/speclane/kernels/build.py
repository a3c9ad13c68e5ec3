"""Build our C kernels with the system compiler, once per source version, and load them.

A kernel source may build for several instruction sets (each module's ``ISAS``: AVX-512
and AVX2 for every kernel, and AVX-512 with its bfloat16 dot product for the int4 matmul;
the int4 tile kernel, ``int4_amx.c``, builds only for AMX). ``load`` gives the widest
build this CPU runs, or the one asked for; which kernels a model runs, ours or torch's,
is ``select.Kernels``'s choice, made once when the model is built.

A library is compiled (~1 s) into ``~/.cache/speclane/kernels/<name>-<isa>-<digest>.so`` and
reused. It is built with ``-fopenmp`` and resolves ``libgomp.so.1`` to the copy torch has
already loaded, so its parallel loops run on torch's OpenMP threads
(``torch.set_num_threads`` applies) rather than a second pool fighting for the cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from speclane.config import runtime_env

log = logging.getLogger(__name__)

# -ffp-contract=off: the compiler must not fuse a multiply and an add we wrote apart (the
# kernels promise the same operations for every row, whatever the compiler).
FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]  # the attention kernel's tanhf (soft-capped scores), linked rather than found in the process
# Instruction sets, widest first: the compiler flags of each build and the CPU flags it needs.
ISA_FLAGS = {
    "amx": ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mavx512vbmi", "-mavx2", "-mfma", "-mf16c", "-mamx-tile",
            "-mamx-bf16", "-mamx-int8"],
    "avx512bf16": ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mavx2", "-mfma", "-mf16c"],
    "avx512vnni": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}
ISA_CPU_FLAGS = {
    "amx": {"avx512f", "avx512bw", "avx512_bf16", "avx512vbmi", "avx2", "fma", "f16c", "amx_tile", "amx_bf16", "amx_int8"},
    "avx512bf16": {"avx512f", "avx512bw", "avx512_bf16", "avx2", "fma", "f16c"},
    "avx512vnni": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"},
    "avx512": {"avx512f", "avx512bw", "avx2", "fma", "f16c"},
    "avx2": {"avx2", "fma", "f16c"},
}
# The vector builds, widest first: what ``pick_isa``'s ``isa`` may name.
VECTOR_ISAS = ("avx512bf16", "avx512vnni", "avx512", "avx2")


class KernelUnavailable(ValueError):
    """A kernel choice names no kernel, or asks for ours where it cannot run (a ValueError:
    the command line reports it as a user error, without a traceback)."""


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel library and the instruction set it was built for."""

    library: ctypes.CDLL
    isa: str


def digest(source: Path) -> str:
    """Version of a source's builds: the source, the sources it includes (``int8_amx.c``
    includes ``int8_x86.c``), the headers beside it (``bf16.h``), the flags."""
    text = source.read_bytes()
    included = [source.with_name(name.decode()).read_bytes() for name in re.findall(rb'#include "([^"]+\.c)"', text)]
    parts = [text, *included] + [h.read_bytes() for h in sorted(source.parent.glob("*.h"))]
    flags = " ".join(FLAGS + [f for isa in ISA_FLAGS.values() for f in isa])
    return hashlib.sha1(b"".join(parts) + flags.encode()).hexdigest()[:16]


@cache
def _cpu_flags() -> frozenset[str] | None:
    """The CPU's flags from /proc/cpuinfo (read once), or None where there is none."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return frozenset(flags.split(":", 1)[1].split())


def missing_cpu_flags(isa: str) -> set[str]:
    """The CPU flags the ``isa`` build needs and this CPU lacks."""
    flags = _cpu_flags()
    if flags is None:  # not Linux: torch's own probe (AVX2 CPUs have FMA and F16C in practice)
        has = {"AVX512": {"avx512", "avx2"}, "AVX2": {"avx2"}}.get(torch.backends.cpu.get_cpu_capability(), set())
        return set() if isa in has else {isa}
    return ISA_CPU_FLAGS[isa] - flags


def compile_build(source: Path, isa: str, out: Path) -> None:
    """Compile the ``isa`` build of ``source`` into ``out`` (the CPU need not run it);
    KernelUnavailable with the compiler's message where it fails."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        partial = Path(tmp) / out.name
        try:
            result = subprocess.run([compiler, *FLAGS, *ISA_FLAGS[isa], str(source), "-o", str(partial), *LIBS], capture_output=True,
                                    text=True, timeout=300)
        except subprocess.TimeoutExpired as err:
            raise KernelUnavailable(f"{compiler} took over 300 s on {source.name}") from err
        if result.returncode != 0:
            raise KernelUnavailable(f"{compiler} failed on {source.name}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, out)  # atomic: a concurrent process sees the whole file or none


def pick_isa(isas: tuple[str, ...], isa: str | None = None) -> str:
    """The build of a source (``isas``, widest first) to load: with ``isa``, the widest
    build at or below that instruction set; without, the widest this CPU runs.
    KernelUnavailable where the CPU cannot run it."""
    if isa is not None:
        if isa not in VECTOR_ISAS:
            raise KernelUnavailable(f"isa {isa!r}: expected one of {', '.join(VECTOR_ISAS)}")
        below = VECTOR_ISAS[VECTOR_ISAS.index(isa):]
        isa = next(build for build in isas if build in below)
        missing = missing_cpu_flags(isa)
        if missing:
            raise KernelUnavailable(f"the CPU lacks {', '.join(sorted(missing))}")
        return isa
    for build in isas:
        if not missing_cpu_flags(build):
            return build
    raise KernelUnavailable(f"the CPU lacks {', '.join(sorted(missing_cpu_flags(isas[-1])))}")


def load(source: Path, declare: Callable[[ctypes.CDLL], None], isas: tuple[str, ...], isa: str | None = None) -> Kernel:
    """The build of ``source`` that ``pick_isa`` names, compiled on first use, its functions
    declared; where that build does not compile (an older compiler without the CPU's newest
    flags, e.g. -mavx512bf16), the next narrower one this CPU runs. KernelUnavailable where
    none can be built or run here (the first build's reason)."""
    first = pick_isa(isas, isa)
    failures: list[KernelUnavailable] = []
    for build in isas[isas.index(first):]:
        if missing_cpu_flags(build):
            continue
        try:
            kernel = load_build(source, build, declare)
        except KernelUnavailable as err:
            log.warning("%s: the %s build is unavailable (%s); trying a narrower one", source.stem, build,
                        str(err).splitlines()[0][:300])
            failures.append(err)
            continue
        return kernel
    raise failures[0]


def load_build(source: Path, isa: str, declare: Callable[[ctypes.CDLL], None]) -> Kernel:
    """The ``isa`` build of ``source`` (compiled on first use), its functions declared;
    KernelUnavailable where it cannot be built or loaded. The CPU's flags are the caller's
    to check (``missing_cpu_flags``). Builds are kept in ``RuntimeEnv.kernel_dir``, read at
    the call."""
    path = runtime_env().kernel_dir / f"{source.stem}-{isa}-{digest(source)}.so"
    try:
        if not path.exists():
            compile_build(source, isa, path)
        lib = ctypes.CDLL(str(path))
    except OSError as err:
        raise KernelUnavailable(str(err)) from err
    declare(lib)
    log.info("%s: ours, %s (%s)", source.stem, isa, path)
    return Kernel(lib, isa)


OMP_PAUSE_HARD = 2  # omp_pause_resource_t's omp_pause_hard (OpenMP 5.0)


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (``omp_pause_resource_all``), in every
    libgomp loaded in this process; False where there is none or it has no such call.

    A thread that ran parallel regions keeps its own pool of workers. libgomp counts the
    workers of every pool, and once they outnumber the CPUs it spins only briefly at each
    barrier before sleeping, so every one of a forward's parallel regions pays a futex
    wake-up. A server builds its model on the main thread and then ticks on an engine
    thread: with the main thread's idle pool left in place, 8 streams on 2 cores ran at
    0.43x the rate of the same engine stepped on the main thread (one thread: no loss).
    The next parallel region on the calling thread builds its pool again."""
    released = False
    for path in openmp_runtimes():
        try:
            library = ctypes.CDLL(path)
            pause = library.omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes = [ctypes.c_int]
        pause.restype = ctypes.c_int
        released |= pause(OMP_PAUSE_HARD) == 0
    return released


def openmp_runtimes() -> set[str]:
    """Paths of the libgomp copies mapped into this process (Linux; empty elsewhere)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {line.split()[-1] for line in maps.splitlines() if "libgomp" in line and "/" in line}
