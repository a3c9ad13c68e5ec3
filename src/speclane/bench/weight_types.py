"""``speclane bench gguf``'s weight-type table: what each GGUF type our kernels run costs.

For each ``native`` type of ``models/gguf_types.TYPES`` (the block types, and F32, F16 and
BF16 on the float kernel), the layer
matmuls of Qwen3-0.6B as our model runs them (q/k/v fused [4096 x 1024], o [1024 x 2048],
gate/up fused [6144 x 1024], down [1024 x 3072]) for 7 layers: 110M weights, about the
layer weights of SmolLM2-135M, more than the caches hold, read from memory as a decode step
reads them. Every width is a multiple of 256, so the K types' super-blocks fit (SmolLM2's
576-wide matmuls hold none: a K-quant file of it keeps them in Q5_0 or Q8_0). The blocks are
random bytes with float16 scales of the size a model's weights have (``random_blocks``:
every quant pattern is a valid block; a random float16 scale could be inf or nan), the
float types normal values (``random_values``). Each
weight runs on the kernel a model of the file runs it on (``models.build.file_weight``),
against torch's dense bfloat16 matmul (``torch.nn.functional.linear``) of the same
weights dequantized, at 1 row (a decode step) and at 96 rows (a prefill chunk); the arms
alternate and the table reports medians. The types our int8-group kernel keeps in 5 or 6
bits a value (``--narrow-weights``, the default) run a third arm, the same values a byte
each (``--no-narrow-weights``): which layout is faster depends on the CPU's build.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import numpy as np
import torch

from speclane.bench.common import Table, alternate, median
from speclane.bench.driver import progress
from speclane.kernels import int8_cpu
from speclane.kernels.select import Kernels
from speclane.models.build import file_weight
from speclane.models.gguf_types import FLOAT_DTYPES, TYPES, FloatTensor, GGMLType, quantized_tensor
from speclane.models.linear import GroupInt8Weight

LAYERS = 7
SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # [out, in] of one layer's matmuls
PREFILL_ROWS = 96
# Byte offsets of each block type's float16 scales: d, and the minimum's scale (dmin, m)
# where the type has one.
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                 "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
SCALE_RANGE = (1e-4, 1e-3)  # d and dmin: |w| up to thousandths (Q4_0) or tenths (Q8_0, the K types)


def random_blocks(kind: GGMLType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] of ``kind`` blocks: random quants, random finite float16 scales
    in ``SCALE_RANGE`` at ``SCALE_OFFSETS``."""
    offsets = SCALE_OFFSETS[kind.name]
    raw = rng.integers(0, 256, (rows, cols // kind.block_values, kind.block_bytes), dtype=np.uint8)
    scales = rng.uniform(*SCALE_RANGE, (*raw.shape[:2], len(offsets))).astype(np.float16).view(np.uint8)
    for i, at in enumerate(offsets):
        raw[..., at : at + 2] = scales[..., 2 * i : 2 * i + 2]
    return raw.reshape(rows, -1)


def random_values(kind: GGMLType, rows: int, cols: int, rng: np.random.Generator) -> FloatTensor:
    """A float type's weight: normal values of a model's size (standard deviation 0.02) in
    the type's own element type."""
    values = torch.from_numpy(rng.normal(0.0, 0.02, (rows, cols)).astype(np.float32))
    return FloatTensor(values.to(FLOAT_DTYPES[kind.name]).contiguous(), kind.name)


def measured_types() -> tuple[list[str], list[str]]:
    """The native types this table times (block types, then float types), and those it
    cannot (no block layout it makes)."""
    native = [name for name, kind in TYPES.items() if kind.load == "native"]
    timed = [n for n in native if n in SCALE_OFFSETS or n in FLOAT_DTYPES]
    return timed, [n for n in native if n not in timed]


def _layers(type_name: str, kernels: Kernels, layers: int, seed: int) -> tuple[list, list[torch.Tensor]] | None:
    """Our kernel weights and their dense bfloat16 copies, ``layers`` x ``SHAPES``; None
    where no kernel of ours runs the type here."""
    rng = np.random.default_rng(seed)
    ours, dense = [], []
    for _ in range(layers):
        for rows, cols in SHAPES:
            kind = TYPES[type_name]
            part = (random_values(kind, rows, cols, rng) if type_name in FLOAT_DTYPES
                    else quantized_tensor(kind, random_blocks(kind, rows, cols, rng), rows, cols))
            weight = file_weight(part, kernels)
            if weight is None:
                return None
            ours.append(weight)
            dense.append(part.dequantize().to(torch.bfloat16))
    return ours, dense


def _pass(matmuls: list[Callable[[torch.Tensor], torch.Tensor]], inputs: list[torch.Tensor]) -> Callable[[], float]:
    """One call of every matmul on its input; returns its seconds."""
    def run() -> float:
        start = time.perf_counter()
        for matmul, x in zip(matmuls, inputs, strict=True):
            matmul(x)
        return time.perf_counter() - start
    return run


def kept_narrow(weight: object) -> bool:
    """Whether the int8-group kernel keeps this weight's values in 5 or 6 bits."""
    return isinstance(weight, GroupInt8Weight) and weight.packed.format & 15 != int8_cpu.INT8


def weight_types(kernel_choice: str, quick: bool = False) -> Table:
    layers = 2 if quick else LAYERS
    repeats = {1: 5 if quick else 15, PREFILL_ROWS: 2 if quick else 4}
    kernels = Kernels.load(kernel_choice)
    byte_kernels = Kernels.load(kernel_choice, narrow_weights=False)
    measured, skipped = measured_types()
    table = Table(f"Weight types: Qwen3-0.6B's layer matmuls x {layers} layers, our kernel on the type's blocks "
                  "vs a dense bfloat16 matmul of the same values",
                  ["type", "kernel", "bits / weight",
                   *(f"{rows} row{'s' * (rows > 1)}: {column}" for rows in (1, PREFILL_ROWS)
                     for column in ("ours ms", "bf16 ms", "bf16 / ours", "a byte a value / ours"))])
    generator = torch.Generator().manual_seed(0)
    for index, type_name in enumerate(measured):
        progress(f"weight types: {type_name}")
        built = _layers(type_name, kernels, layers, seed=index)
        if built is None:
            table.add(type_name, "none here (runs dense)", *[""] * 9)
            continue
        ours, dense = built
        byte_layout = _layers(type_name, byte_kernels, layers, seed=index)[0] if kept_narrow(ours[0]) else None
        row: list = [type_name, ours[0].kernel, 8 * sum(w.nbytes for w in ours) / sum(w.numel() for w in dense)]
        for rows in (1, PREFILL_ROWS):
            inputs = [torch.randn(rows, w.shape[1], generator=generator).bfloat16() for w in dense]
            arms = {"ours": _pass([w.matmul for w in ours], inputs), "bf16": _pass([_dense_matmul(w) for w in dense], inputs)}
            if byte_layout is not None:
                arms["bytes"] = _pass([w.matmul for w in byte_layout], inputs)
            runs = alternate(arms, repeats[rows])
            ours_s, dense_s = median(runs["ours"]), median(runs["bf16"])
            bytes_ratio = f"{median(runs['bytes']) / ours_s:.2f}x" if byte_layout is not None else "-"
            row += [1e3 * ours_s, 1e3 * dense_s, f"{dense_s / ours_s:.2f}x", bytes_ratio]
        table.add(*row)
        del ours, dense, built, byte_layout
        gc.collect()
    table.notes.append(f"{layers} layers of [4096 x 1024] (q/k/v fused), [1024 x 2048], [6144 x 1024] (gate/up fused) and "
                       f"[1024 x 3072] matmuls: {layers * sum(r * c for r, c in SHAPES) / 1e6:.0f}M weights, each "
                       "called once per pass; random blocks with finite scales (timing does not depend on the values).")
    table.notes.append("bf16 / ours: the dense bfloat16 time over ours (above 1: ours is faster). bits / weight: what our kernel reads (quants, "
                       "scales and minimums as it packs them); dense bfloat16 reads 16. a byte a value / ours: where our int8-group "
                       "kernel keeps the values in 5 or 6 bits (--narrow-weights, the default), the time of the same values a byte "
                       "each (--no-narrow-weights) over ours (below 1: the byte layout is faster on this CPU, for more memory). "
                       f"Medians of {repeats[1]} (1 row) and {repeats[PREFILL_ROWS]} ({PREFILL_ROWS} rows) "
                       "alternating passes after a warm-up of each arm, on torch's threads.")
    if skipped:
        table.notes.append(f"Not timed here (native, without a block layout this table makes): {', '.join(skipped)}.")
    return table


def _dense_matmul(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.nn.functional.linear(x, weight)
