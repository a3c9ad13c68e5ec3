"""The most drafts a round of a lone stream (K: ``--lone-draft-tokens``, set here with
``--num-draft-tokens`` alike) for ``--drafter auto`` on the TUNING half of the drafts set,
single stream, greedy: first answers and repeated ones. Made where no reported number
comes from (``speclane bench drafters`` reports the held-out half).

    .venv/bin/python benchmarks/compare_k.py [--k 4,8] [--per-category 5] [--max-tokens 64]

Per prompt: speculation off (its better of two runs), then for each K an engine answers
once as a new tenant (a first answer: its suffix store holds none of this prompt's text)
and twice more as the same tenant (a repeated answer, its better run: the store holds the
first, as a client that sends the same request again meets it). Prints, per category and
overall, the median of each K's rate over off's (decode rate after the first token).
"""

from __future__ import annotations

import argparse
import statistics
import time

from speclane.bench import drafts_set
from speclane.bench.drafters_scenario import answer_prompt, rate_of
from speclane.bench.factory import EngineFactory
from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine


def decode_rate(engine: LLMEngine, ids: list[int], prediction: list[int], tenant: str, new_tokens: int) -> float:
    return rate_of(answer_prompt(engine, ids, prediction, tenant, new_tokens))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="4,8", help="comma-separated K values, an arm each")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    factory = EngineFactory(EngineConfig.from_flat(num_threads=2))
    off = factory.engine(spec_mode="off")
    arms = {f"K={k}": factory.engine(spec_mode="slice", drafter="auto", num_draft_tokens=int(k), lone_draft_tokens=int(k))
            for k in args.k.split(",")}
    for engine in (off, *arms.values()):
        decode_rate(engine, factory.chat_ids("Hello"), [], "warm-up", 8)
    tok = factory.tokenizer
    groups = {c: ps[: args.per_category] for c, ps in drafts_set.by_category(drafts_set.load("tune")).items()}
    ratios = {c: {(arm, kind): [] for arm in arms for kind in ("first", "repeat")} for c in groups}
    for category, prompts in groups.items():
        for p in prompts:
            ids, prediction = p.token_ids(tok)
            base = max(decode_rate(off, ids, prediction, f"off {time.perf_counter()}", args.max_tokens) for _ in range(2))
            for arm, engine in arms.items():
                tenant = f"{arm} {category} {time.perf_counter()}"
                first = decode_rate(engine, ids, prediction, tenant, args.max_tokens)
                repeat = max(decode_rate(engine, ids, prediction, tenant, args.max_tokens) for _ in range(2))
                if base > 0:
                    ratios[category][(arm, "first")].append(first / base)
                    ratios[category][(arm, "repeat")].append(repeat / base)
        print(f"{category}: " + " ".join(f"{arm} {kind} {statistics.median(v):.2f}x"
                                         for (arm, kind), v in ratios[category].items()), flush=True)
    columns = list(ratios[next(iter(groups))])
    print(f"\n| category | {' | '.join(f'{arm}, {kind}' for arm, kind in columns)} |\n|---|{'---|' * len(columns)}")
    for category in groups:
        print(f"| {category} | " + " | ".join(f"{statistics.median(ratios[category][c]):.2f}x" for c in columns) + " |")
    print("| all | " + " | ".join(f"{statistics.median([r for cat in groups for r in ratios[cat][c]]):.2f}x"
                                  for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
