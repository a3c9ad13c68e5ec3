"""Stage 1 of ``speclane train-mtp``: the frozen target writes its own training text.

The target answers the training prompts greedily, many requests at a time through the
real engine, and a hidden-state recorder (a ``HiddenObserver`` on the runner) keeps
the target's final hidden state at every position. Each finished request becomes a
``Sample``: its tokens and those hidden states. Because decoding is greedy, every
generated token is the target's own argmax: the labels are the target's predictions.

Samples are written in shards as they finish, so an interrupted run resumes where it
stopped (prompts are taken in a fixed order; finished prompt indexes are recorded).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from speclane.drafters.base import HiddenSpan
from speclane.engine.engine import LLMEngine
from speclane.request import SamplingParams
from speclane.training.samples import Sample


class HiddenRecorder:
    """Keeps every request's hidden states, position by position (bfloat16 copies)."""

    def __init__(self) -> None:
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.next_position: dict[str, int] = {}

    def observe_tick(self, spans: Sequence[HiddenSpan], hidden: torch.Tensor) -> None:
        for request, start, row, rows in spans:
            rid = request.request_id
            expected = self.next_position.get(rid, 0)
            if start != expected:
                raise AssertionError(f"{rid}: hidden states for position {start}, expected {expected}")
            self.rows.setdefault(rid, []).append(hidden[row : row + rows].to(torch.bfloat16).clone())
            self.next_position[rid] = start + rows

    def pop(self, request_id: str) -> torch.Tensor:
        self.next_position.pop(request_id, None)
        return torch.cat(self.rows.pop(request_id), dim=0)


def load_samples(data_dir: Path) -> tuple[list[Sample], set[int]]:
    samples: list[Sample] = []
    done: set[int] = set()
    for shard in sorted(data_dir.glob("shard-*.pt")):
        payload = torch.load(shard, weights_only=True)
        samples.extend(Sample.from_dict(d) for d in payload["samples"])
        done.update(payload["prompt_indexes"])
    return samples, done


def generate_samples(
    engine: LLMEngine,
    prompts: list[list[int]],
    data_dir: Path,
    max_new_tokens: int,
    concurrency: int,
    shard_size: int = 64,
    log=lambda line: print(line, file=sys.stderr, flush=True),
) -> list[Sample]:
    """Answer every prompt not already in ``data_dir``; returns all samples (old and new).
    ``engine`` runs without the prefix cache: a position read from it has no hidden state."""
    if engine.scheduler.kv.enable_prefix_cache:
        raise ValueError("generate_samples needs every position's hidden state: run the engine with prefix_cache off")
    data_dir.mkdir(parents=True, exist_ok=True)
    samples, done = load_samples(data_dir)
    todo = [i for i in range(len(prompts)) if i not in done]
    if not todo:
        log(f"[data] {len(samples)} samples already generated in {data_dir}")
        return samples
    log(f"[data] {len(samples)} samples on disk; generating {len(todo)} more ({concurrency} at a time)")
    recorder = HiddenRecorder()
    engine.runner.hidden_observers.append(recorder)
    sampling = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
    pending_shard: list[Sample] = []
    pending_indexes: list[int] = []
    shard_no = len(list(data_dir.glob("shard-*.pt")))
    queue = list(todo)
    in_flight: dict[str, int] = {}
    outputs: dict[str, list[int]] = {}
    started = time.perf_counter()
    new_tokens = 0
    finished = 0
    last_log = started

    def flush() -> None:
        nonlocal shard_no, pending_shard, pending_indexes
        if not pending_shard:
            return
        path = data_dir / f"shard-{shard_no:04d}.pt"
        torch.save({"samples": [s.to_dict() for s in pending_shard], "prompt_indexes": pending_indexes}, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)  # a shard is complete or absent
        shard_no += 1
        pending_shard, pending_indexes = [], []

    try:
        while queue or in_flight:
            while queue and len(in_flight) < concurrency:
                index = queue.pop(0)
                rid = f"train-{index}"
                engine.add_request(rid, prompts[index], sampling, speculative=False)
                in_flight[rid] = index
            for out in engine.step():
                outputs.setdefault(out.request_id, []).extend(out.token_ids)
                if not out.finished:
                    continue
                index = in_flight.pop(out.request_id)
                hidden = recorder.pop(out.request_id)
                request_tokens = list(prompts[index]) + outputs.pop(out.request_id)
                sample = Sample(request_tokens[: hidden.shape[0] + 1], len(prompts[index]), hidden)
                samples.append(sample)
                pending_shard.append(sample)
                pending_indexes.append(index)
                new_tokens += len(sample.token_ids) - sample.num_prompt_tokens
                finished += 1
                if len(pending_shard) >= shard_size:
                    flush()
            now = time.perf_counter()
            if now - last_log > 15 or (not queue and not in_flight):
                rate = new_tokens / (now - started)
                left = len(todo) - finished
                eta = left * (now - started) / max(finished, 1)
                log(f"[data] {finished}/{len(todo)} prompts, {new_tokens} tokens, {rate:.0f} tok/s, ETA {eta / 60:.1f} min")
                last_log = now
    finally:
        engine.runner.hidden_observers.remove(recorder)
        flush()
    return samples

