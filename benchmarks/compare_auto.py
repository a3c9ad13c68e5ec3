"""Auto's choices on the TUNING half of the drafts set (single stream, greedy): the check
behind its defaults, made where no reported number comes from (``speclane bench
drafters`` reports the held-out half).

    .venv/bin/python benchmarks/compare_auto.py [--per-category 5] [--max-tokens 64] [--skip ARM,...]

Arms: speculation off; suffix; mtp; auto as ``--drafter auto`` builds it (the suffix
drafter and the MTP head, scored per millisecond with the engine's calibrated step cost);
auto with prompt lookup competing too; auto scoring per expected token (its step cost
withdrawn); with ``--probe-rounds``, auto at each of several head probe intervals
(``HEAD_PROBE_ROUNDS``, 0 for none); with ``--seed-after``, at each of several waits before
a request's head is seeded (``HEAD_SEED_AFTER``). Each prompt is answered by every arm in turn, ``--passes`` times, each pass its
own tenant; a prompt's ratio is each arm's best pass over off's best pass (decode rate
after the first token). Prints the median ratio per category and overall, and the rounds
each auto arm gave each drafter.
"""

from __future__ import annotations

import argparse
import statistics

from speclane.bench import drafts_set
from speclane.bench.drafters_scenario import answer_prompt, rate_of
from speclane.bench.factory import EngineFactory
from speclane.config import EngineConfig
from speclane.drafters.ngram import NgramDrafter


def answer_rate(engine, ids: list[int], prediction: list[int], tenant: str, new_tokens: int) -> tuple[float, str]:
    run = answer_prompt(engine, ids, prediction, tenant, new_tokens)
    return rate_of(run), run.text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--skip", default="", help="comma-separated arms to leave out")
    parser.add_argument("--probe-rounds", default="",
                        help="comma-separated head probe intervals to add as arms ('auto, probe N'; 0: no probe)")
    parser.add_argument("--seed-after", default="",
                        help="comma-separated rounds without a cheap draft before a request's head is seeded, "
                             "added as arms ('auto, seed after N')")
    args = parser.parse_args()
    factory = EngineFactory(EngineConfig.from_flat(num_threads=2))
    engines = {"off": factory.engine(spec_mode="off"),
               "suffix": factory.engine(spec_mode="slice", drafter="suffix"),
               "mtp": factory.engine(spec_mode="slice", drafter="mtp"),
               "auto": factory.engine(spec_mode="slice", drafter="auto"),
               "auto with lookup": factory.engine(spec_mode="slice", drafter="auto"),
               "auto per token": factory.engine(spec_mode="slice", drafter="auto")}
    assert engines["auto"].drafter.step_ms is not None, "auto got no step cost (adaptive K off?)"
    engines["auto with lookup"].drafter.lookup = NgramDrafter()
    engines["auto per token"].drafter.step_ms = None
    for n in filter(None, args.probe_rounds.split(",")):
        engine = engines[f"auto, probe {n}"] = factory.engine(spec_mode="slice", drafter="auto")
        engine.drafter.probe_rounds = int(n) or 1 << 30
    for n in filter(None, args.seed_after.split(",")):
        engine = engines[f"auto, seed after {n}"] = factory.engine(spec_mode="slice", drafter="auto")
        engine.drafter.seed_after = int(n)
    for name in args.skip.split(","):
        engines.pop(name, None)
    tok = factory.tokenizer
    groups = {c: ps[: args.per_category] for c, ps in drafts_set.by_category(drafts_set.load("tune")).items()}
    arms = [a for a in engines if a != "off"]
    ratios = {c: {a: [] for a in arms} for c in groups}
    differ = 0
    for engine in engines.values():
        answer_rate(engine, factory.chat_ids("Hello"), [], "warm-up", 8)
    for category, prompts in groups.items():
        for p in prompts:
            ids, prediction = p.token_ids(tok)
            best: dict[str, float] = {}
            texts: dict[str, str] = {}
            for r in range(args.passes):
                for name, engine in engines.items():
                    rate, texts[name] = answer_rate(engine, ids, prediction, f"{category}#{r}", args.max_tokens)
                    best[name] = max(best.get(name, 0.0), rate)
            differ += any(texts[a] != texts["off"] for a in arms)
            for a in arms:
                if best["off"] > 0 and best[a] > 0:
                    ratios[category][a].append(best[a] / best["off"])
            print(f"{category} {p.id}: " + " ".join(f"{a} {best[a] / best['off']:.2f}" for a in arms), flush=True)
    print(f"\n| category | prompts | {' | '.join(arms)} |\n|---|---|{'---|' * len(arms)}")
    for c in groups:
        print(f"| {c} | {len(groups[c])} | " + " | ".join(f"{statistics.median(ratios[c][a]):.2f}x" for a in arms) + " |")
    every = {a: [r for c in groups for r in ratios[c][a]] for a in arms}
    print(f"| all | {len(every[arms[0]])} | " + " | ".join(f"{statistics.median(every[a]):.2f}x" for a in arms) + " |")
    print(f"prompts where some arm's text differs from off: {differ}")
    for name in engines:
        if name.startswith("auto"):
            print(name, "rounds by drafter:", engines[name].drafter.chosen, "head probes:", engines[name].drafter.probes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
