"""Tune the copying drafters' parameters on the evaluation set's tuning half, never the held-out one.

    PYTHONPATH=src python benchmarks/tune_drafters.py [--max-tokens 64] [--references refs.json] [--trees]
                                                      [--k 4,6,8] [--drafter suffix|ngram]

1. The default model's greedy answer to every ``tune`` prompt of ``bench/data/drafts.jsonl``,
   speculation off (greedy output is the same with any drafter, so one answer serves every
   setting); ``--references`` caches them in a JSON file.
2. A replay per setting (``bench/draft_ceiling.walk``): each answer is decoded again in
   rounds, the drafter proposing up to K tokens from the prompt and the answer so far (and
   the prediction); a round keeps
   the accepted path of the proposal (a chain's matching prefix, a tree's longest
   matching branch) plus one token. The prompts of a category are one
   tenant, answered in file order, so the tenant store holds the category's earlier answers.
3. The estimated speed-up of a category: its tokens at the plain step's cost, over the
   rounds' cost, a round of n drafts costing the default engine's measured step of 1 + n
   rows (``engine/calibration.py``) plus the drafter's measured time.

The score of a setting is the geometric mean over categories of the estimated speed-up,
so no category is given up for another. Settings within ``TIE`` of the best score are
ties (the replay times the drafter's own Python, which moves a score by ~0.1% between
runs): of those, the one that changes fewest of the current defaults (K, against the
lane's default, included) is chosen. The script prints every setting tried with its
per-category estimates, then the one chosen; ``SuffixParams``' defaults are set from it.
``--trees`` tunes the draft-tree parameters with ``min_prob`` (``TREE_GRID``) on top of
``SuffixParams``' other defaults; a tree of n nodes costs the step of 1 + n rows, as a
chain of n drafts does. ``--k`` runs the grid at each of several most-drafts-per-round
values (a lone stream's, ``--lone-draft-tokens``; default: the lane's), so K is chosen on
the same half and by the same score. ``--drafter ngram`` replays the n-gram drafter over
``NGRAM_GRID`` instead (its resync; ``NgramDrafter``'s defaults are set from it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from speclane import draft_tree
from speclane.bench import drafts_set
from speclane.bench.draft_ceiling import walk
from speclane.bench.factory import EngineFactory
from speclane.config import EngineConfig
from speclane.drafters.base import Drafter
from speclane.drafters.ngram import NgramDrafter
from speclane.drafters.suffix import SuffixDrafter
from speclane.drafters.suffix_index import SuffixParams
from speclane.engine import calibration
from speclane.request import Request, SamplingParams

GRID = {
    "min_prob": [0.05, 0.1, 0.2, 0.35],
    "spec_factor": [0.25, 0.5, 1.0, 2.0, 3.0],
    "prior": [0.5, 2.0, 6.0],
    "max_match": [4, 8, 32],
    "max_resync": [0, 1, 3],
}
NGRAM_GRID = {"resync_ngram": [0, 3]}  # the n-gram drafter's (--drafter ngram)
TIE = 0.005  # relative: scores this close are one score (module docstring)
TREE_GRID = {
    "min_prob": [0.1, 0.2, 0.35],
    "max_branches": [1, 2, 3],
    "branch_min_prob": [0.02, 0.05, 0.1, 0.2],
}


def references(factory: EngineFactory, prompts: list[drafts_set.DraftPrompt], max_tokens: int,
               cache: Path | None) -> dict[str, dict]:
    """Prompt and greedy answer token ids of every prompt (speculation off, batched)."""
    if cache is not None and cache.exists():
        return json.loads(cache.read_text())
    engine = factory.engine(spec_mode="off", max_num_seqs=16)
    out: dict[str, dict] = {}
    for p in prompts:
        ids, prediction = p.token_ids(factory.tokenizer)
        out[p.id] = {"category": p.category, "prompt": ids, "prediction": prediction}
        engine.add_request(p.id, ids, SamplingParams(max_tokens=max_tokens))
    answers: dict[str, list[int]] = {p.id: [] for p in prompts}
    while engine.has_unfinished():
        for step in engine.step():
            answers[step.request_id].extend(step.token_ids)
    for rid, tokens in answers.items():
        out[rid]["answer"] = tokens
    if cache is not None:
        cache.write_text(json.dumps(out))
    return out


class _Rounds:
    """``walk``'s proposer: a drafter's rounds on one answer, their time kept."""

    def __init__(self, drafter: Drafter, request: Request, answer: list[int], k: int) -> None:
        self.drafter, self.request, self.answer, self.k = drafter, request, answer, k
        self.drafting_ms = 0.0

    def __call__(self, done: int, n: int) -> tuple[int, int]:
        started = time.perf_counter()
        draft = self.drafter.propose(self.request, min(self.k, n))
        self.drafting_ms += (time.perf_counter() - started) * 1000
        answer = self.answer
        path, _ = draft_tree.accept(draft.token_ids, draft.parents, lambda row, depth: answer[done + depth])
        self.request.output_token_ids.extend(answer[done : done + len(path) + 1])
        return len(draft.token_ids), len(path)


def replay_prompts(refs: dict[str, dict], drafter: Drafter, k: int, step_ms: list[float]
                   ) -> dict[str, tuple[str, float, float]]:
    """Per prompt (in ``refs``' order, a category one tenant): its category, the plain
    decode's ms and the drafter's (at most ``k`` drafts a round), its own time included."""
    out: dict[str, tuple[str, float, float]] = {}
    for rid, ref in refs.items():
        category, answer = ref["category"], ref["answer"]
        request = Request(request_id=rid, prompt_token_ids=ref["prompt"], sampling=SamplingParams(max_tokens=len(answer) + 1),
                          tenant=category, prediction_token_ids=ref["prediction"])
        rounds = _Rounds(drafter, request, answer, k)
        spent = walk(answer, rounds, step_ms[: k + 1]) + rounds.drafting_ms
        drafter.finish(request)
        drafter.release(rid)
        out[rid] = (category, len(answer) * step_ms[0], spent)
    return out


def replay(refs: dict[str, dict], drafter: Drafter, k: int, step_ms: list[float]) -> dict[str, float]:
    """Estimated speed-up per category of a fresh ``drafter`` (module docstring)."""
    plain: dict[str, float] = {}
    spent: dict[str, float] = {}
    for category, plain_ms, spent_ms in replay_prompts(refs, drafter, k, step_ms).values():
        plain[category] = plain.get(category, 0.0) + plain_ms
        spent[category] = spent.get(category, 0.0) + spent_ms
    return {c: plain[c] / spent[c] for c in plain}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def changes(setting: dict[str, object], k: int, defaults: object, default_k: int) -> int:
    """How many of a setting's values, K included, differ from the current defaults."""
    return sum(value != getattr(defaults, name) for name, value in setting.items()) + (k != default_k)


def describe(setting: dict[str, object], k: int) -> str:
    return f"K={k}, " + ", ".join(f"{name}={value}" for name, value in setting.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--references", type=Path, help="JSON cache of the greedy answers")
    parser.add_argument("--trees", action="store_true", help="tune the draft-tree parameters (TREE_GRID) only")
    parser.add_argument("--drafter", choices=["suffix", "ngram"], default="suffix",
                        help="ngram: replay the n-gram drafter over NGRAM_GRID instead")
    parser.add_argument("--k", default="", help="comma-separated K values to tune over (default: a lone stream's K)")
    args = parser.parse_args()
    if args.trees and args.drafter == "ngram":
        parser.error("--trees tunes the suffix drafter's trees; the n-gram drafter drafts chains")
    grid = NGRAM_GRID if args.drafter == "ngram" else TREE_GRID if args.trees else GRID
    config = EngineConfig.from_flat(num_threads=2)
    factory = EngineFactory(config)
    prompts = drafts_set.load("tune")  # the tuning half only
    refs = references(factory, prompts, args.max_tokens, args.references)
    ks = [int(v) for v in args.k.split(",")] if args.k else [config.lane.max_draft_tokens]
    engine = factory.engine(spec_mode="off")
    step_ms = list(calibration.step_cost(engine.model, engine.cache, max(ks) + 1).ms_by_rows[: max(ks) + 1])
    print(f"{len(refs)} tuning prompts, K {', '.join(map(str, ks))}, step ms by rows 1..{max(ks) + 1}: "
          f"{', '.join(f'{m:.2f}' for m in step_ms)}")
    categories = list(drafts_set.by_category(prompts))
    print("setting | " + " | ".join(categories) + " | geomean")
    defaults = NgramDrafter() if args.drafter == "ngram" else SuffixParams()  # what a tie keeps nearest to
    tried: list[tuple[float, dict[str, object], int]] = []
    for k in ks:
        for values in itertools.product(*grid.values()):
            setting = dict(zip(grid, values, strict=True))
            drafter = NgramDrafter(**setting) if args.drafter == "ngram" else SuffixDrafter(replace(SuffixParams(), **setting))
            speedups = replay(refs, drafter, k, step_ms)
            score = geomean(list(speedups.values()))
            tried.append((score, setting, k))
            print(f"{describe(setting, k)} | " + " | ".join(f"{speedups[c]:.2f}" for c in categories) + f" | {score:.3f}",
                  flush=True)
    top = max(score for score, _, _ in tried)
    ties = [t for t in tried if t[0] >= top * (1 - TIE)]
    score, setting, k = min(ties, key=lambda t: (changes(t[1], t[2], defaults, config.lane.max_draft_tokens), -t[0]))
    print(f"chosen: {describe(setting, k)} (estimated geomean speed-up {score:.3f} on the tuning half; best {top:.3f}, "
          f"{len(ties)} setting(s) within {TIE:.1%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
