"""Prompts that arrive together: their mean time to the first token, and the whole burst's
time, at several tick budgets (``--max-num-batched-tokens``), through the engine alone.

    .venv/bin/python benchmarks/burst_ttft.py [--streams 8] [--budgets 256,128,64,32] [--runs 4]

The prompts are ``bench vs-llama-cpp``'s concurrent streams' chat prompts (their chat
template opens them all with the same tokens), added to one engine at once as one new
tenant a burst, so no earlier burst's blocks are in its prefix cache; each answers 16
greedy tokens. The budgets' engines alternate run by run; the first run of each is a
warm-up. Per budget: the median over runs of the streams' mean time from the burst's
start to their first token, and of the burst's wall time. The design notes ("Prompts that
arrive together", "The budget is small") quote it.
"""

from __future__ import annotations

import argparse
import statistics

from speclane.bench.driver import Job, drive
from speclane.bench.gguf_scenario import STREAM_PROMPTS
from speclane.llm import LLM
from speclane.request import SamplingParams


def burst(llm: LLM, prompts: list[list[int]]) -> tuple[float, float]:
    """(mean seconds to a stream's first token, the burst's seconds): every prompt added at
    the start, as one new tenant (``drive``'s run tenant)."""
    sampling = SamplingParams(max_tokens=16, temperature=0)
    timelines, wall_s = drive(llm.engine, [Job(f"burst-{i}", prompt, sampling) for i, prompt in enumerate(prompts)])
    return statistics.mean(t.ttft_s for t in timelines.values()), wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--budgets", default="256,128,64,32", help="comma-separated --max-num-batched-tokens values")
    parser.add_argument("--runs", type=int, default=4, help="runs per budget, the first a warm-up")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    engines = {b: LLM(spec_mode="off", max_num_batched_tokens=b) for b in budgets}
    some = engines[budgets[0]]
    prompts = [some.encode_prompt(STREAM_PROMPTS[i % len(STREAM_PROMPTS)], chat=True) for i in range(args.streams)]
    times: dict[int, list[tuple[float, float]]] = {b: [] for b in budgets}
    for run in range(args.runs):
        for budget, llm in engines.items():
            measured = burst(llm, prompts)
            if run:
                times[budget].append(measured)
    print(f"{args.streams} chat prompts at once ({sum(map(len, prompts))} tokens), "
          f"medians of {args.runs - 1} runs after a warm-up")
    print("| budget | mean time to first token s | burst s |")
    print("|---|---|---|")
    for budget in budgets:
        ttft = statistics.median(t for t, _ in times[budget])
        whole = statistics.median(w for _, w in times[budget])
        print(f"| {budget} | {ttft:.3f} | {whole:.3f} |")


if __name__ == "__main__":
    main()
