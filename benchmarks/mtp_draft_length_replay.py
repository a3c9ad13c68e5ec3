"""Replay adaptive K's choices for the MTP head on held-out chat, offline.

    .venv/bin/python benchmarks/mtp_draft_length_replay.py [--head DIR]

The target answers the 16 held-out chat questions (``CHAT_PROMPTS``) greedily, its hidden
states recorded (``training.capture``); the head (quantized as served) then drafts DEPTH
tokens after *every* position of every answer. A policy walks each answer round by round:
it picks K, the drafts are checked against the answer (greedy verification by match), and
the round costs a forward of 1 + K rows plus drafting. Policies: fixed K; adaptive K as
the code has it (``scheduler.draft_length.choose`` with ``AcceptanceEstimate``); and
adaptive K without its stopping rule ("before", at DECAY 0.8).

The cost model is the engine's own: its calibrated step cost (``engine.calibration``) and
the drafting ms per token and per round learnt on a live run of the first four answers
(the head alone, adaptive K), so the replay prices rounds as the lane does. Prompt lookup
is left out: the head's choices are what this measures. Speed is tokens per ms relative to
K = 0 (classic decoding) under that cost model, not a wall-clock measurement.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import torch

from speclane.bench.factory import EngineFactory
from speclane.bench.prompts import CHAT_PROMPTS
from speclane.config import EngineConfig
from speclane.drafters.mtp import default_head_path
from speclane.models.mtp_kernel_step import drafting_head
from speclane.models.mtp_store import load_head
from speclane.request import SamplingParams
from speclane.scheduler import draft_length
from speclane.training.capture import generate_samples

DEPTH = 6  # drafts replayed after each position (adaptive K's k_max is the engine's 4)
K_MAX = 4


def drafts_at_every_position(head, samples) -> list[list[tuple[list[int], list[int]]]]:
    """Per answer, from the prompt's last position on: (the head's DEPTH drafts after
    position p, the answer's tokens at p + 2 ..)."""
    answers = []
    with torch.inference_mode():
        for s in samples:
            tokens, hidden = s.token_ids, s.hidden.float()
            n = hidden.shape[0]
            cache = head.new_cache(0)
            outputs = head.extend(cache, hidden, torch.tensor(tokens[1 : n + 1]), torch.arange(n))
            rounds = {}
            for p in range(n - 1, s.num_prompt_tokens - 2, -1):  # backwards: entries 0..p stay intact
                cache.truncate(p + 1)
                step = head.logits_of(outputs[p : p + 1])
                drafts = []
                for j in range(DEPTH):
                    drafts.append(int(head.vocab_ids[step.best]))
                    if j + 1 < DEPTH:
                        step = head.step(cache, step.out[-1:], [drafts[-1]], want_logits=False)
                rounds[p] = (drafts, list(tokens[p + 2 : p + 2 + DEPTH]))
            answers.append([rounds[p] for p in sorted(rounds)])
    return answers


def walk(answers, cost: draft_length.StepCost, timing: draft_length.DraftTiming, fixed_k: int | None):
    """Tokens per ms of one policy over every answer, and its histogram of K."""
    estimate = draft_length.AcceptanceEstimate()
    tokens, ms, ks = 0, 0.0, Counter()
    for i, rounds in enumerate(answers):
        rid, p = f"a{i}", 0
        while p < len(rounds):
            drafts, truth = rounds[p]
            if fixed_k is None:
                k = draft_length.choose([(rid, K_MAX)], 1, 1, cost, estimate, timing.ms_per_token, timing.ms_per_round)[rid]
            else:
                k = fixed_k
            accepted = 0
            while accepted < min(k, len(truth)) and drafts[accepted] == truth[accepted]:
                accepted += 1
            if k:
                estimate.observe(rid, k, accepted)
            else:
                estimate.idle(rid)
            ks[k] += 1
            tokens += accepted + 1
            ms += cost.ms(1 + k) + (timing.ms_per_round + timing.ms_per_token * k if k else 0.0)
            p += accepted + 1
        estimate.forget(rid)
    return tokens / ms, ks


def before_rule(*args):
    """``choose`` without the stopping rule, at DECAY 0.8."""
    estimate, saved = draft_length.AcceptanceEstimate, (draft_length.DECAY, draft_length.AcceptanceEstimate.optimistic_rate)
    draft_length.DECAY = 0.8
    estimate.optimistic_rate = lambda self, request_id: 0.0  # never overrides the estimate's K = 0
    try:
        return walk(*args)
    finally:
        draft_length.DECAY, estimate.optimistic_rate = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default="", help="an MTP head directory (default: the one shipped for the model)")
    args = parser.parse_args()
    factory = EngineFactory(EngineConfig())
    model_name = factory.base.model.model
    off = factory.engine(spec_mode="off")
    ids = [factory.chat_ids(p) for p in CHAT_PROMPTS]
    with tempfile.TemporaryDirectory() as tmp:
        samples = generate_samples(off, ids, Path(tmp), 128, len(ids), log=lambda line: None)
    head = load_head(Path(args.head) if args.head else default_head_path(model_name), off.runner.model, model_name)
    head = drafting_head(head, off.runner.model.kernels)  # as the engine's drafter runs it
    # The lane's own prices: the step cost it calibrated and the drafting cost it learns.
    live = factory.engine(spec_mode="slice", drafter="mtp", mtp_lookup=False, **({"mtp_head": args.head} if args.head else {}))
    for i, prompt in enumerate(ids[:4]):
        live.add_request(f"w{i}", prompt, SamplingParams(max_tokens=128))
        live.run_until_done()
    cost, timing = live.scheduler.step_cost, live.scheduler.draft_timing
    answers = drafts_at_every_position(head, samples)
    base, _ = walk(answers, cost, timing, 0)
    print(f"cost: {', '.join(f'{ms:.2f}' for ms in cost.ms_by_rows[:6])} ms for 1-6 rows; drafting "
          f"{timing.ms_per_token:.2f} ms per token + {timing.ms_per_round:.2f} per round")
    print(f"{sum(len(a) for a in answers)} positions in {len(answers)} answers\n")
    print("| policy | vs K=0 | rounds at K = 0 / 1 / 2 / 3 / 4 |")
    print("|---|---|---|")
    rows = [(f"fixed K={k}", walk(answers, cost, timing, k)) for k in (1, 2, 3)]
    rows += [("adaptive K, before (no stopping rule, DECAY 0.8)", before_rule(answers, cost, timing, None)),
             ("adaptive K, as served", walk(answers, cost, timing, None))]
    for name, (speed, ks) in rows:
        print(f"| {name} | {speed / base:.3f}x | {' / '.join(str(ks.get(k, 0)) for k in range(5))} |")


if __name__ == "__main__":
    main()
