"""Greedy decode tok/s of the engine at 1 and 16 streams, this checkout against a git
revision, for a change to the serving path that must not slow decode (the KV layout).

    .venv/bin/python benchmarks/decode_streams.py REV [--passes 5] [--tokens 128]

The revision is checked out into a temporary git worktree. Each pass runs one process per
build (this checkout's .venv, each build's sources first on ``PYTHONPATH``), alternating
which goes first, so the machine's drift hits both alike; each process measures every
stream count once after a warm-up. The table gives each build's median tok/s and the
median of the per-pass ratios. Speculation is off (the lane's cost is not the question),
the default model, eager, 2 threads, ``--max-num-seqs`` 16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STREAMS = (1, 16)
PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle gear works.",
           "List five uses of vinegar at home.", "Describe the water cycle to a child."]


def measure(tokens: int) -> dict[int, float]:
    """tok/s at each stream count in this process (the build on ``sys.path``)."""
    import torch

    from speclane.config import EngineConfig
    from speclane.engine.engine import LLMEngine
    from speclane.request import SamplingParams

    torch.set_num_threads(2)
    engine = LLMEngine(EngineConfig().replace(spec_mode="off", drafter="none", max_num_seqs=max(STREAMS)))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    sampling = SamplingParams(max_tokens=tokens, ignore_eos=True)

    def run(streams: int, tag: str) -> float:
        for i in range(streams):
            engine.add_request(f"{tag}-{streams}-{i}", prompts[i % len(prompts)], sampling)
        while engine.has_unfinished():  # prefill ticks first, then time the decode
            engine.step()
            if all(r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running.values()) \
                    and not engine.scheduler.waiting:
                break
        generated, started = 0, time.perf_counter()
        while engine.has_unfinished():
            generated += sum(len(o.token_ids) for o in engine.step())
        return generated / (time.perf_counter() - started)

    for streams in STREAMS:
        run(streams, "warm")
    return {streams: run(streams, "timed") for streams in STREAMS}


def run_build(tree: Path, tokens: int) -> dict[int, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, __file__, "--measure", "--tokens", str(tokens)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", help="the git revision to compare this checkout against")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per stream")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one process's measurement
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.tokens)))
        return 0
    if not args.rev:
        parser.error("give the git revision to compare against")
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "rev"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), args.rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            builds = {"this checkout": ROOT, args.rev: other}
            results: dict[str, list[dict[int, float]]] = {name: [] for name in builds}
            for p in range(args.passes):
                order = list(builds) if p % 2 == 0 else list(reversed(builds))
                for name in order:
                    results[name].append(run_build(builds[name], args.tokens))
                    print(f"pass {p + 1}: {name}: {results[name][-1]}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)
    print(f"| streams | this checkout tok/s | {args.rev} tok/s | this / {args.rev} (median of {args.passes} passes) |")
    print("|---|---|---|---|")
    for streams in STREAMS:
        ours = [r[streams] for r in results["this checkout"]]
        theirs = [r[streams] for r in results[args.rev]]
        ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
        print(f"| {streams} | {statistics.median(ours):.1f} | {statistics.median(theirs):.1f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
