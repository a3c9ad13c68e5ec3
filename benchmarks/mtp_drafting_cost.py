"""What a round of MTP drafting costs while serving: one C call against the calls one by one.

    .venv/bin/python benchmarks/mtp_drafting_cost.py [--prompts 6] [--k 2]

Two engines over one model, the MTP head alone (no prompt lookup), K fixed: one drafts a
greedy round in one C call (``kernels/mtp_step.c``, the default), the other on the model's
kernels without ``mtp_step`` (the same kernels, one ctypes call each, glued by torch ops). They answer the held-out chat questions in turn (A B per prompt). Prints the
drafting ms per round (the drafter's own ``propose`` time: catch-up and every draft) and
each engine's tok/s. Both draft the same tokens (the same bits), so their rounds match.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from speclane.bench.factory import EngineFactory
from speclane.bench.prompts import CHAT_PROMPTS
from speclane.config import EngineConfig
from speclane.drafters.mtp import MTPDrafter, default_head_path
from speclane.engine.engine import LLMEngine
from speclane.models.mtp_kernel_step import KernelHead
from speclane.models.mtp_store import load_head
from speclane.request import SamplingParams


def timed_drafter(engine) -> list[float]:
    """Record each proposal's ms on the engine's drafter."""
    drafter, times = engine.drafter, []
    propose = drafter._propose

    def wrapped(request, k, may_seed):
        started = time.perf_counter()
        try:
            return propose(request, k, may_seed)
        finally:
            times.append((time.perf_counter() - started) * 1000)

    drafter._propose = wrapped
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--k", type=int, default=2)
    args = parser.parse_args()
    factory = EngineFactory(EngineConfig())
    options = dict(spec_mode="slice", drafter="mtp", mtp_lookup=False, num_draft_tokens=args.k, spec_adaptive_k=False)
    fused = factory.engine(**options)
    model, name = fused.model, factory.base.model.model
    # The same model and kernels, the head's step called kernel by kernel.
    one_by_one = KernelHead(load_head(default_head_path(name), model, name), dataclasses.replace(model.kernels, mtp_step=None))
    engines = {"one C call per round": fused,
               "kernel calls one by one": LLMEngine.from_parts(fused.config, model, factory.tokenizer,
                                                               drafter=MTPDrafter(one_by_one, model.config.vocab_size))}
    assert engines["one C call per round"].drafter.head.fused_step, "mtp_step.c does not run here"
    assert not engines["kernel calls one by one"].drafter.head.fused_step
    times = {name: timed_drafter(engine) for name, engine in engines.items()}
    tokens = dict.fromkeys(engines, 0)
    wall = dict.fromkeys(engines, 0.0)
    prompts = [factory.chat_ids(p) for p in CHAT_PROMPTS[: args.prompts]]
    for i, prompt in enumerate([prompts[0]] + prompts):  # the first pass warms up
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.add_request(f"p{i}", prompt, SamplingParams(max_tokens=8 if i == 0 else 128))
            n = sum(len(out.token_ids) for out in engine.run_until_done())
            if i == 0:
                times[name].clear()
                continue
            tokens[name] += n
            wall[name] += time.perf_counter() - started
    print(f"MTP head alone, K={args.k} every round, {args.prompts} held-out chat prompts x up to 128 tokens\n")
    print("| drafting | ms per round (median) | mean | rounds | tok/s |")
    print("|---|---|---|---|---|")
    for name in engines:
        t = times[name]
        print(f"| {name} | {statistics.median(t):.2f} | {statistics.mean(t):.2f} | {len(t)} | {tokens[name] / wall[name]:.1f} |")


if __name__ == "__main__":
    main()
