"""The attention kernel against its source at another git revision, inside the default
model's forward: the forward plan's attention steps point at one build or the other (or at
a step that does nothing), forward by forward in one process (this machine's speed drifts
within seconds).

    .venv/bin/python benchmarks/attention_ab.py [--against HEAD~1] [--rounds 150]
        [--shapes 60:1x1,200:1x1,800:1x1,200:1x5,800:1x5,200:8x1,200:16x1]

A shape ``kv:BxP`` is B sequences of P new tokens each after kv cached ones: 1x1 a
one-token step, 1x5 a verify round of 4 drafts, 8x1 eight streams' decode rows. A round
runs the three arms in a shuffled order, each a forward (with logits) to settle and one
timed. Per shape: each arm's median forward, the attention's ms per forward (the median
forward with that build's attention less the median with the attention's steps skipped:
their outputs stale, the same work after them), and the paired ratio, the median over
rounds of this tree's forward over the other's. Both builds must read the same arguments
(the plan's step is swapped, not rebuilt).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from revision_build import build_at  # noqa: E402

from speclane.config import EngineConfig  # noqa: E402
from speclane.engine.calibration import forward_ms  # noqa: E402
from speclane.kernels import attention_cpu, plan_cpu  # noqa: E402
from speclane.llm import LLM  # noqa: E402

STEP = "paged_rope_write_attention_op"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD~1", help="the git revision whose kernel is the other arm")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--shapes", default="60:1x1,200:1x1,800:1x1,200:1x5,800:1x5,200:8x1,200:16x1")
    args = parser.parse_args()
    torch.set_num_threads(2)
    llm = LLM(config=EngineConfig().replace(spec_mode="off"))
    model, cache = llm.engine.model, llm.engine.cache
    if model.plans is None or model.kernels.attention is None:
        raise SystemExit("the model runs no forward plan with our attention kernel here")
    current = plan_cpu.address(model.kernels.attention.library, STEP)
    skip = plan_cpu.address(model.kernels.plan.library, "skip_op")
    with tempfile.TemporaryDirectory() as where:
        kernel = build_at(args.against, "attention_x86.c", model.kernels.attention_name, attention_cpu.declare, Path(where))
        other = plan_cpu.address(kernel.library, STEP)
    arms = {args.against: other, "this tree": current, "skipped": skip}
    print(f"| shape (kv:sequences x new tokens) | forward ms, {args.against} | forward ms, this tree "
          f"| attention ms, {args.against} | attention ms, this tree | attention, this tree / {args.against} "
          f"| forward, this tree / {args.against} (paired) |")
    print("|---|---|---|---|---|---|---|")
    shuffle = random.Random(0).shuffle
    for shape in args.shapes.split(","):
        kv, rows = shape.split(":")
        batch, positions = (int(x) for x in rows.split("x"))

        def forward(kv_len: int = int(kv), batch: int = batch, positions: int = positions) -> float:
            return forward_ms(model, cache, batch=batch, positions=positions, kv_len=kv_len)

        forward()  # the plan of this many rows
        with model.plans.lock:
            plan = model.plans.get(batch * positions)
        assert plan is not None
        steps = [i for i, f in enumerate(plan.table[:, 0].tolist()) if f == current]
        times: dict[str, list[float]] = {name: [] for name in arms}
        try:
            for _ in range(args.rounds):
                order = list(arms)
                shuffle(order)
                for name in order:
                    with torch.inference_mode():  # the plan's table is an inference tensor
                        plan.table[steps, 0] = arms[name]
                    forward()
                    times[name].append(forward())
        finally:
            with torch.inference_mode():
                plan.table[steps, 0] = current
        ms = {name: statistics.median(values) for name, values in times.items()}
        old, new = ms[args.against] - ms["skipped"], ms["this tree"] - ms["skipped"]
        paired = statistics.median(b / a for a, b in zip(times[args.against], times["this tree"], strict=True))
        print(f"| {shape} | {ms[args.against]:.2f} | {ms['this tree']:.2f} | {old:.3f} | {new:.3f} | {new / old:.2f}x "
              f"| {paired:.3f}x |")


if __name__ == "__main__":
    main()
