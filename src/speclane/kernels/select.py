"""Which kernels a model runs, picked once when it is built (``--kernels``).

- ``auto`` (default): ours (the C kernels of this folder, for the widest instruction set
  this CPU has, the int4 matmul's tile kernel where it has AMX) where they build here, else
  torch's ops for those that do not, with one logged warning;
- ``native``: ours, and a ``KernelUnavailable`` (a ValueError: a one-line start-up error)
  naming the kernel that cannot be built or run here;
- ``torch``: torch's reference ops everywhere (for A/B benchmarks).

``Kernels`` holds the loaded libraries, None where torch's op runs. ``build_model`` makes
one and hands it to the linears and the model; the MTP drafter takes its target's. Tests and
benchmarks that need a given build pin it with ``Kernels.load``'s arguments, or swap one
field with ``dataclasses.replace``.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from speclane.config import HEAD_INPUTS, MATMUL_INPUTS
from speclane.config import KERNELS as CHOICES
from speclane.kernels import (
    attention_cpu,
    build,
    float_cpu,
    int4_cpu,
    int8_cpu,
    mtp_step_cpu,
    norm_cpu,
    plan_cpu,
)
from speclane.kernels.build import Kernel, KernelUnavailable

log = logging.getLogger(__name__)


def _library(kernel: Kernel | None) -> ctypes.CDLL | None:
    return kernel.library if kernel is not None else None


def _name(kernel: Kernel | None) -> str:
    return kernel.isa if kernel is not None else "torch"


@dataclass(frozen=True)
class Kernels:
    """The loaded kernel of each computation, or None where torch's op runs.

    ``int4``: the int4 matmul (``Int4Weight``); ``tiles``: its tile kernel for calls of
    ``int4_cpu.TILE_MIN_ROWS`` rows or more (the same bits; only beside ``int4``);
    ``attention`` and ``norm``: a bfloat16 forward's attention and add + RMSNorm / SiLU;
    ``mtp_step``: the MTP head's draft step in one C call (else its kernels one by one);
    ``int8``: the int8-group matmul of the GGUF types int4 cannot hold (``GroupInt8Weight``;
    None: those layers run dense); ``int8_tiles``: its tile kernel for calls of
    ``int8_cpu.TILE_MIN_ROWS`` rows or more (the same bits; only beside ``int8`` on
    bfloat16 inputs); ``float_matmul``: the float-weight matmul of the matmul
    weights kept in their source's float type (``FloatWeight``: a GGUF's F32, F16 and BF16, a
    Hugging Face folder's safetensors; None: those layers run dense, torch's ``F.linear``).
    ``matmul_inputs``: what ``int4`` and ``int8`` multiply their weights by (``--matmul-inputs``):
    bfloat16, or int8 (their ``int4_q8_x86.c`` and ``int8_q8_x86.c``, whose weights are packed in quads).
    ``head``: the output head's kernels where its coarse pass runs on int8 inputs while the
    layers' matmuls do not (``--head-inputs``; ``for_head``): its top logits are recomputed
    in float32 from the exact rows anyway, so rounding its inputs to int8 costs the tail of
    the distribution a little precision and saves a third of the head's time at 5-16 rows.
    """

    int4: Kernel | None = None
    tiles: Kernel | None = None
    attention: Kernel | None = None
    norm: Kernel | None = None
    mtp_step: Kernel | None = None
    int8: Kernel | None = None
    int8_tiles: Kernel | None = None
    float_matmul: Kernel | None = None
    plan: Kernel | None = None  # the forward plan's runner (plan.c): a forward's kernels in one call
    matmul_inputs: str = "bfloat16"  # what ``int4`` and ``int8`` multiply the weights by (config.MATMUL_INPUTS)
    narrow_weights: bool = True  # ``int8``'s weights in 5 or 6 bits where their values fit (int8_packed.h)
    head: Kernels | None = None

    @property
    def for_head(self) -> Kernels:
        """The kernels the output head (and a head tied to it, the token embedding) runs on."""
        return self.head if self.head is not None else self

    @classmethod
    def load(cls, choice: str = "auto", *, isa: str | None = None, tiles: bool | None = None,
             mtp_step: bool = True, matmul_inputs: str = "bfloat16", head_inputs: str = "auto",
             narrow_weights: bool = True) -> Kernels:
        """The kernels of ``choice`` (module docstring).

        ``isa`` pins every kernel's build to that instruction set (``build.VECTOR_ISAS``;
        a kernel without that build takes its widest below it), with no timing of the int4
        builds. ``tiles``: None, the tile kernels where the CPU has AMX; True, required beside
        each of our int4 and int8-group matmuls (an error where one cannot run, or where
        neither matmul is ours); False, never. ``mtp_step`` False: the MTP head calls its
        kernels one by one (the same bits as one call). ``matmul_inputs`` int8: the int4 and
        int8-group matmuls on int8 inputs (``int4_q8_x86.c``, ``int8_q8_x86.c``: an AVX-512 VNNI
        and an AVX2 build each, the same bits; no tile kernel: it reads bfloat16 inputs); under ``torch``, an
        error (torch's ops have no such inputs). ``narrow_weights`` (``--narrow-weights``): the
        int8-group kernel keeps a weight's values in 5 or 6 bits where they fit (quads: always
        a byte a value). ``head_inputs`` (``--head-inputs``): the
        output head's coarse pass on int8 inputs (``head``) where int8, or auto where those
        kernels run here and no AMX tile kernel does (those take a head's calls of many rows
        on bfloat16 inputs, and were not measured against them); int8 where they cannot run
        is an error."""
        if choice not in CHOICES:
            raise KernelUnavailable(f"kernels must be one of {', '.join(CHOICES)}; got {choice!r}")
        if matmul_inputs not in MATMUL_INPUTS:
            raise KernelUnavailable(f"matmul inputs must be one of {', '.join(MATMUL_INPUTS)}; got {matmul_inputs!r}")
        if head_inputs not in HEAD_INPUTS:
            raise KernelUnavailable(f"head inputs must be one of {', '.join(HEAD_INPUTS)}; got {head_inputs!r}")
        int8_inputs = matmul_inputs == "int8"
        if choice == "torch":
            if int8_inputs or head_inputs == "int8":
                flag = "--matmul-inputs" if int8_inputs else "--head-inputs"
                raise KernelUnavailable(f"{flag} int8 runs on our int4 and int8-group kernels; --kernels torch has none")
            log.info("kernels: torch's ops throughout (--kernels torch)")
            return cls()
        unavailable: list[str] = []

        def attempt(source: str, load: Callable[[], Kernel], required: bool = choice == "native") -> Kernel | None:
            try:
                return load()
            except KernelUnavailable as err:
                if required:
                    raise KernelUnavailable(f"--kernels {choice}: {source} is unavailable here: {err}") from err
                unavailable.append(f"{source} ({err})")
                return None

        if tiles is True and int8_inputs:
            raise KernelUnavailable(f"tiles: {int4_cpu.TILE_SOURCE.name} and {int8_cpu.TILE_SOURCE.name} read bfloat16 "
                                    "inputs, and the matmuls are on int8 inputs")
        # The tile kernels read our int4 and int8 layouts on bfloat16 inputs: only beside our
        # matmuls, and only where the CPU has AMX.
        use_tiles = not int8_inputs and (tiles is True or (tiles is None and not build.missing_cpu_flags("amx")))
        tile = None
        if use_tiles:
            tile = attempt(int4_cpu.TILE_SOURCE.name, int4_cpu.load_tiles, required=choice == "native" or tiles is True)
        if int8_inputs:
            int4 = attempt(int4_cpu.INT8_INPUTS_SOURCE.name, lambda: int4_cpu.load_int8_inputs(isa), required=True)
        else:  # without the tile kernel the vector build serves every row count: timed at a batch's too
            int4 = attempt(int4_cpu.SOURCE.name, lambda: int4_cpu.load(isa, many_rows=tile is None))
        if int4 is None:
            tile = None  # the tile kernel runs beside our int4 matmul only
        int8 = (attempt(int8_cpu.INT8_INPUTS_SOURCE.name, lambda: int8_cpu.load_int8_inputs(isa), required=True) if int8_inputs
                else attempt(int8_cpu.SOURCE.name, lambda: int8_cpu.load(isa)))
        if tiles is True and int4 is None and int8 is None:
            raise KernelUnavailable(f"tiles: {int4_cpu.TILE_SOURCE.name} and {int8_cpu.TILE_SOURCE.name} read our int4 "
                                    f"and int8 layouts, and both matmuls are torch's here ({'; '.join(unavailable)})")
        int8_tile = None
        if int8 is not None and use_tiles:
            int8_tile = attempt(int8_cpu.TILE_SOURCE.name, int8_cpu.load_tiles, required=choice == "native" or tiles is True)
        kernels = cls(
            int4=int4,
            tiles=tile,
            attention=attempt(attention_cpu.SOURCE.name, lambda: attention_cpu.load(isa)),
            norm=attempt(norm_cpu.SOURCE.name, lambda: norm_cpu.load(isa)),
            mtp_step=attempt(mtp_step_cpu.SOURCE.name, lambda: mtp_step_cpu.load(isa)) if mtp_step else None,
            int8=int8,
            int8_tiles=int8_tile,
            float_matmul=attempt(float_cpu.SOURCE.name, lambda: float_cpu.load(isa)),
            plan=attempt(plan_cpu.SOURCE.name, lambda: plan_cpu.load(isa)),
            matmul_inputs=matmul_inputs,
            narrow_weights=narrow_weights,
        )
        if not int8_inputs and head_inputs != "bfloat16":
            kernels = replace(kernels, head=_int8_inputs_head(kernels, isa, required=head_inputs == "int8"))
        if unavailable:
            log.warning("kernels: ours unavailable here, torch's ops (for the tile kernel, the int4 matmul) stand in: %s",
                        "; ".join(unavailable))
        if len(build.openmp_runtimes()) > 1:  # e.g. a torch wheel whose libgomp has another soname
            log.warning("our kernels run on a second OpenMP runtime beside torch's (%s): two thread pools share the cores",
                        ", ".join(sorted(build.openmp_runtimes())))
        log.info("kernels: %s", kernels.describe())
        return kernels

    # -- the loaded libraries, None where torch's op runs ------------------------------
    @property
    def int4_library(self) -> ctypes.CDLL | None:
        return _library(self.int4)

    @property
    def tile_library(self) -> ctypes.CDLL | None:
        return _library(self.tiles)

    @property
    def int8_tile_library(self) -> ctypes.CDLL | None:
        return _library(self.int8_tiles)

    @property
    def attention_library(self) -> ctypes.CDLL | None:
        return _library(self.attention)

    @property
    def norm_library(self) -> ctypes.CDLL | None:
        return _library(self.norm)

    @property
    def mtp_step_library(self) -> ctypes.CDLL | None:
        return _library(self.mtp_step)

    @property
    def plan_library(self) -> ctypes.CDLL | None:
        return _library(self.plan)

    # -- names, for logs, benchmarks and the calibration's key ---------------------------
    @property
    def int4_name(self) -> str:
        """'avx512bf16', 'avx512vnni', 'avx512', 'avx2' or 'torch'."""
        return _name(self.int4)

    @property
    def tile_name(self) -> str:
        """'amx' where calls of ``TILE_MIN_ROWS`` rows or more run on the tile kernel, else 'off'."""
        return "amx" if self.tiles is not None or self.int8_tiles is not None else "off"

    @property
    def attention_name(self) -> str:
        return _name(self.attention)

    @property
    def norm_name(self) -> str:
        return _name(self.norm)

    @property
    def mtp_step_name(self) -> str:
        return _name(self.mtp_step)

    @property
    def int8_name(self) -> str:
        return _name(self.int8)

    @property
    def float_matmul_name(self) -> str:
        return _name(self.float_matmul)

    @property
    def plan_name(self) -> str:
        """'on' where a forward's layers may run as one C call (models/forward_plan.py), else 'off'."""
        return "on" if self.plan is not None else "off"

    @property
    def head_inputs(self) -> str:
        """What the output head's coarse pass multiplies its weights by: 'int8' or 'bfloat16'."""
        return self.for_head.matmul_inputs

    def describe(self) -> str:
        return (f"int4={self.int4_name} matmul_inputs={self.matmul_inputs} head_inputs={self.head_inputs} "
                f"tiles={self.tile_name} attention={self.attention_name} "
                f"norm={self.norm_name} mtp_step={self.mtp_step_name} int8={self.int8_name} "
                f"narrow_weights={'on' if self.narrow_weights else 'off'} "
                f"float={self.float_matmul_name} plan={self.plan_name}")

    def fingerprint(self, bfloat16: bool) -> list[str]:
        """Which kernels a forward of a model runs here (``bfloat16``: its dtype), and their
        sources' versions: what a measurement of its speed depends on."""
        int8_inputs = self.matmul_inputs == "int8"
        int4_digest = int4_cpu.int8_inputs_source_digest() if int8_inputs else int4_cpu.source_digest()
        int8_digest = int8_cpu.int8_inputs_source_digest() if int8_inputs else int8_cpu.source_digest()
        int8_weights = "narrow" if self.narrow_weights and not int8_inputs else "bytes"  # quads: a byte a value
        # the head's own matmul kernels, where they are not the layers'
        head = [] if self.head is None else [f"head={part}" for part in self.head.fingerprint(bfloat16)
                                              if part.startswith(("int4=", "int8="))]
        return [*head, f"int4={self.int4_name}/{self.matmul_inputs}:{int4_digest}",
                f"int8={self.int8_name}/{self.matmul_inputs}/{int8_weights}:{int8_digest}",
                f"tiles={self.tile_name}:{int4_cpu.tile_source_digest()}:{int8_cpu.tile_source_digest()}",
                f"attention={self.attention_name if bfloat16 else 'sdpa'}:{attention_cpu.source_digest()}",
                f"norm={self.norm_name if bfloat16 else 'torch'}:{norm_cpu.source_digest()}",
                f"float={self.float_matmul_name if bfloat16 else 'torch'}:{float_cpu.source_digest()}",
                f"plan={self.plan_name if bfloat16 else 'off'}:{plan_cpu.source_digest()}"]


def _int8_inputs_head(kernels: Kernels, isa: str | None, *, required: bool) -> Kernels | None:
    """``kernels`` with the int4 and int8-group matmuls on int8 inputs (their ``isa`` builds),
    for the output head; None where they do not run here or (not ``required``) an AMX tile
    kernel runs (it takes the head's calls of many rows on bfloat16 inputs, not measured
    against them). A KernelUnavailable where ``required`` and they cannot run."""
    if not required and (kernels.tiles is not None or kernels.int8_tiles is not None):
        return None
    try:
        int4 = int4_cpu.load_int8_inputs(isa) if kernels.int4 is not None else None
        int8 = int8_cpu.load_int8_inputs(isa) if kernels.int8 is not None else None
    except KernelUnavailable as err:
        if required:
            raise KernelUnavailable(f"--head-inputs int8: the int8-input kernels are unavailable here: {err}") from err
        log.info("output head: bfloat16 inputs (the int8-input kernels are unavailable here: %s)", err)
        return None
    if int4 is None and int8 is None:
        if required:
            raise KernelUnavailable("--head-inputs int8 runs on our int4 and int8-group kernels, and neither runs here")
        return None
    return replace(kernels, int4=int4, int8=int8, tiles=None, int8_tiles=None, matmul_inputs="int8")
