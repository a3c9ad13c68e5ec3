"""Where one decode step's time goes: the default model's one-token forward (its layers as
one forward plan, models/forward_plan.py) with a kind of the plan's steps swapped for a step
that does nothing, and the logits after it, alternated in one process (this machine's speed
drifts between runs).

    .venv/bin/python benchmarks/decode_breakdown.py [--rounds 8] [--batch 1] [--positions 1] [--kv-len 200]
        [--matmul-inputs bfloat16]

Prints the median ms of each variant of one forward with its logits (``--batch`` sequences
of ``--positions`` new tokens each, after ``--kv-len`` cached ones (200): a mixed tick's
decode rows, or a verify round of K = positions - 1 drafts) and of the logits alone (the
output head, its top candidates' exact refinement), and the share of the whole step each
kind of step takes (the whole step less the variant without it). Steps skipped leave
their output buffers as they were, so the steps after them compute on stale values at the
same cost. The variant with every step skipped is what a forward costs outside its plan's
steps (the embedding, the call, the logits); its share is the steps' together.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from speclane.config import MATMUL_INPUTS, EngineConfig
from speclane.engine.calibration import forward_ms
from speclane.kernels import plan_cpu
from speclane.llm import LLM

# A plan step's function (its ``_op`` entry point) by kind.
KINDS = {
    "layer matmuls": ("int4_matmul_op", "int4_matmul_amx_op", "int8_matmul_op", "int8_matmul_h_op",
                      "int8_matmul_amx_op", "int8_matmul_h_amx_op", "float_matmul_op"),
    "attention (RoPE, cache write, attention)": ("paged_rope_write_attention_op",),
    "norms and activations": ("add_rms_norm_op", "add_rms_norm_f32_op", "rms_norm_groups_op", "copy_columns_op", "silu_mul_op",
                              "gelu_tanh_mul_op"),
}


def step_addresses(kernels) -> dict[int, str]:
    """Every loaded kernel library's ``_op`` entry points: address -> kind."""
    libraries = [k.library for k in (kernels.int4, kernels.tiles, kernels.int8, kernels.int8_tiles, kernels.attention,
                                     kernels.norm, kernels.float_matmul) if k is not None]
    kinds: dict[int, str] = {}
    for kind, names in KINDS.items():
        for library in libraries:
            for name in names:
                with contextlib.suppress(AttributeError):  # not this library's
                    kinds[plan_cpu.address(library, name)] = kind
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1, help="sequences in the forward")
    parser.add_argument("--positions", type=int, default=1, help="new tokens of each sequence")
    parser.add_argument("--kv-len", type=int, default=200, help="each sequence's cached tokens before the forward")
    parser.add_argument("--matmul-inputs", default=EngineConfig().model.matmul_inputs, choices=MATMUL_INPUTS,
                        help="the engine's --matmul-inputs")
    args = parser.parse_args()
    torch.set_num_threads(2)
    llm = LLM(config=EngineConfig().replace(spec_mode="off", matmul_inputs=args.matmul_inputs))
    model, cache = llm.engine.model, llm.engine.cache
    if model.plans is None:
        raise SystemExit(f"the model runs no forward plan here: {model.plan_blocker}")

    def forward() -> float:
        return forward_ms(model, cache, batch=args.batch, positions=args.positions, kv_len=args.kv_len)

    forward()  # makes the plan of this many rows
    with model.plans.lock:
        plan = model.plans.get(args.batch * args.positions)
    assert plan is not None
    functions = plan.table[:, 0].clone()
    kinds = step_addresses(model.kernels)
    skip = plan_cpu.address(model.kernels.plan.library, "skip_op")
    steps_of = {kind: [i for i, f in enumerate(functions.tolist()) if kinds.get(f) == kind] for kind in KINDS}
    variants = {"whole forward (with logits)": [], **{f"without {kind}": rows for kind, rows in steps_of.items()},
                "every step skipped": list(range(len(functions)))}
    hidden = torch.randn(args.batch * args.positions, model.config.hidden_size)

    def logits_ms() -> float:
        start = time.perf_counter()
        model.logits(hidden)
        return (time.perf_counter() - start) * 1000

    @torch.inference_mode()  # the plan's table is an inference tensor
    def skip_steps(rows: list[int]) -> None:
        plan.table[:, 0] = functions
        plan.table[rows, 0] = skip

    samples: dict[str, list[float]] = {name: [] for name in [*variants, "logits"]}
    try:
        for _ in range(args.rounds):
            for name, rows in variants.items():
                skip_steps(rows)
                times = [forward() for _ in range(12)]
                samples[name].append(statistics.median(times[2:]))
            skip_steps([])
            # The head reads 30 MB: after a forward, as in a step, not from a warm cache.
            times = []
            for _ in range(12):
                forward()
                times.append(logits_ms())
            samples["logits"].append(statistics.median(times[2:]))
    finally:
        skip_steps([])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    whole = medians["whole forward (with logits)"]
    print(f"{len(functions)} plan steps: " + ", ".join(f"{len(rows)} {kind}" for kind, rows in steps_of.items()))
    print("| variant | ms (median) | the kind's share of forward + logits |\n|---|---|---|")
    total = whole  # forward_ms times the logits after the forward too
    for name, value in medians.items():
        share = "" if name == "whole forward (with logits)" else (
            f"{medians['logits'] / total:.0%}" if name == "logits" else f"{(whole - value) / total:.0%}")
        print(f"| {name} | {value:.2f} | {share} |")


if __name__ == "__main__":
    main()
