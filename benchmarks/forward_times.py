"""Wall time of the three forwards a copy-task request is made of, for A/B across checkouts.

    .venv/bin/python benchmarks/forward_times.py [--rounds 6]
    PYTHONPATH=/tmp/old/src .venv/bin/python benchmarks/forward_times.py   # another checkout
                                             # (git worktree add /tmp/old COMMIT)

Prints the medians (ms) of: a 96-token prefill (logits of its last row), a 5-row verify
(K=4) after 100 cached positions and a one-token step after 100 (both with the logits of
every new row), default model, eager, 2 threads, alternated within the process. The
copy task's end-to-end speed-up is (prefill + answer x step) / (prefill + rounds x
verify): what moves it is the prefill and what a verify row costs beyond a step. Run the
two checkouts in turn a few times: this machine's speed drifts between processes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import speclane
from speclane.config import EngineConfig
from speclane.llm import LLM
from speclane.models.llama import RaggedBatch

FORWARDS = {"prefill 96": (96, 0), "verify 5 @100": (5, 100), "step 1 @100": (1, 100)}


# Not engine.calibration.forward_ms: that one computes every new row's logits (a prefill
# samples from its last row only), and this script must also run against checkouts older
# than any option added to it.
def forward_ms(model, cache, rows: int, cached: int) -> float:
    ids, positions = torch.randint(0, 1000, (rows,)), torch.arange(cached, cached + rows)
    if hasattr(cache, "block_size"):  # a paged cache: the sequence on the pool's first blocks
        table = list(range(-(-(cached + rows) // cache.block_size)))
        batch = RaggedBatch(input_ids=ids, positions=positions, block_tables=[table], starts=[cached], num_new=[rows])
    else:  # a checkout with one cache row per sequence
        cache.lengths[0] = cached
        batch = RaggedBatch(input_ids=ids, positions=positions, slots=[0], starts=[cached], num_new=[rows])
    start = time.perf_counter()
    hidden = model(batch, cache)
    model.logits(hidden if cached else hidden[-1:])  # a prefill samples from its last row only
    elapsed = (time.perf_counter() - start) * 1000
    if not hasattr(cache, "block_size"):
        cache.reset(0)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(2)
    llm = LLM(config=EngineConfig().replace(spec_mode="off"))
    model, cache = llm.engine.model, llm.engine.cache
    samples: dict[str, list[float]] = {name: [] for name in FORWARDS}
    for warm_up in (True, False):
        for _ in range(2 if warm_up else args.rounds):
            for name, (rows, cached) in FORWARDS.items():
                ms = forward_ms(model, cache, rows, cached)
                if not warm_up:
                    samples[name].append(ms)
    print(f"checkout: {speclane.__file__.rsplit('/src/', 1)[0]}")
    print("| forward | median ms |\n|---|---|")
    for name, values in samples.items():
        print(f"| {name} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
