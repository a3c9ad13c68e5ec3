"""``speclane bench drafters``: each drafter's speed-up on the held-out half of the drafts set.

The evaluation set (``bench/drafts_set.py``): seven categories, from verbatim copy to open
chat; drafter parameters are tuned on its other half (``benchmarks/tune_drafters.py``), so
nothing here was tuned on these prompts. Engines over the same model (speculation off,
``ngram``, ``suffix``, ``mtp`` where the model has a head, and ``auto``) answer every
prompt in turn (one arm after another per prompt, so machine noise hits each alike),
single stream, greedy. The prompts of a category are sent as one tenant, in file order,
so the suffix drafter's tenant store holds that category's earlier answers and never the
answer it is drafting; a repeated pass (the best pass of each arm counts, against load
spikes on a shared machine) is a tenant of its own.

Reports per category the median over prompts of each arm's decode rate (tokens after the
first, over their time) divided by speculation off's on the same prompt; the drafted and
accepted tokens; whether each arm's text equals speculation off; and which drafter
``auto``'s rounds took. Then two more tables on the same held-out half: each category's
prompts as ``drafters_load.STREAMS`` concurrent streams, the lane against speculation off
(``bench/drafters_load.py``), and a subset of each category's prompts against llama.cpp's
server n-gram speculation on the same GGUF file (``bench/drafters_vs_llama.py``).
"""

from __future__ import annotations

import time

from speclane.bench import draft_ceiling, drafts_set
from speclane.bench.common import Table, median
from speclane.bench.drafters_load import STREAMS, streams_table
from speclane.bench.drafters_vs_llama import vs_llama_table
from speclane.bench.driver import Job, Timeline, drive, progress
from speclane.bench.factory import EngineFactory
from speclane.drafters.registry import has_mtp_head
from speclane.drafters.suffix_index import SuffixParams
from speclane.request import SamplingParams

# The suffix drafter with draft trees (``--suffix-tree-branches``), beside its default (chains).
TREE_BRANCHES = 3
TREE_ARM = f"suffix, trees of {TREE_BRANCHES}"


def answer_prompt(engine, ids: list[int], prediction: list[int], tenant: str, new_tokens: int) -> Timeline:
    """One greedy answer of up to ``new_tokens`` through ``engine``, as ``tenant``."""
    job = Job(f"d{time.perf_counter()}", ids, SamplingParams(max_tokens=new_tokens),
              options={"tenant": tenant, "prediction_token_ids": prediction})
    timelines, _ = drive(engine, [job])
    return next(iter(timelines.values()))


def drafters(factory: EngineFactory, quick: bool = False, new_tokens: int = 64, repeats: int = 2,
             per_category: int | None = None) -> list[Table]:
    """``per_category``: the first n held-out prompts of each category (None: all 15; quick: 2)."""
    per_category = 2 if quick else per_category
    new_tokens = 48 if quick else new_tokens
    repeats = 1 if quick else repeats
    arms = ["ngram", "suffix", TREE_ARM]
    lane = factory.base.lane
    if has_mtp_head(factory.base.model.model, lane.mtp_head):
        arms.append("mtp")
    arms.append("auto")
    engines = {"off": factory.engine(spec_mode="off")}
    engines.update({name: factory.engine(spec_mode="slice", drafter=name) for name in arms if name != TREE_ARM})
    engines[TREE_ARM] = factory.engine(spec_mode="slice", drafter="suffix", suffix_tree_branches=TREE_BRANCHES)
    heldout = drafts_set.by_category(drafts_set.load("heldout"))
    groups = {c: ps[:per_category] for c, ps in heldout.items()}
    tok = factory.tokenizer
    encoded = {p.id: p.token_ids(tok) for ps in heldout.values() for p in ps}
    warm = next(iter(encoded.values()))
    for engine in engines.values():  # warm-up (a tenant of its own)
        answer_prompt(engine, warm[0], [], "warm-up", 8)
    ratios: dict[str, dict[str, list[float]]] = {c: {a: [] for a in arms} for c in groups}
    counts: dict[str, dict[str, list[int]]] = {c: {a: [0, 0] for a in arms} for c in groups}  # drafted, accepted
    rates: dict[str, list[dict[str, float]]] = {c: [] for c in groups}  # per prompt: each arm's best rate
    same = dict.fromkeys(arms, 0)
    answers: dict[str, list[tuple[list[int], list[int], list[int]]]] = {c: [] for c in groups}  # prompt, prediction, answer
    total = sum(len(ps) for ps in groups.values())
    done = 0
    for category, prompts in groups.items():
        for p in prompts:
            done += 1
            progress(f"drafters {category} {done}/{total}")
            ids, prediction = encoded[p.id]
            # Each pass is a tenant of its own: a repeat never drafts from its own earlier answer.
            passes = [{name: answer_prompt(engine, ids, prediction, f"{category}#{r}", new_tokens)
                       for name, engine in engines.items()} for r in range(repeats)]
            runs = passes[0]
            rate = {name: max(rate_of(run[name]) for run in passes) for name in engines}  # the least disturbed pass
            off = runs["off"]
            answers[category].append((ids, prediction, off.token_ids))
            rates[category].append(rate)
            for name in arms:
                run = runs[name]
                if rate["off"] > 0 and rate[name] > 0:
                    ratios[category][name].append(rate[name] / rate["off"])
                spec = run.usage.get("speculative", {})
                counts[category][name][0] += int(spec.get("draft_tokens", 0))
                counts[category][name][1] += int(spec.get("accepted_tokens", 0))
                same[name] += run.text == off.text
    k = lane.max_draft_tokens  # a single stream: alone in its ticks
    speed = Table(f"Held-out drafts set: decode speed-up over speculation off, median per category "
                  f"(single stream, greedy, up to {new_tokens} tokens, adaptive K up to {k})",
                  ["category", "prompts", *arms, "auto / best single drafter"])
    accept = Table("Drafted tokens accepted, per category (accepted / drafted)", ["category", *arms])
    for category in groups:
        speed.add(category, len(groups[category]),
                  *[f"{median(ratios[category][a]):.2f}x" if ratios[category][a] else "-" for a in arms],
                  auto_vs_best(rates[category], ratios[category], [a for a in arms if a != "auto"]))
        accept.add(category, *[_rate(*counts[category][a]) for a in arms])
    every = [r for c in groups for r in ratios[c]["auto"]]
    speed.add("all prompts", total, *[f"{median([r for c in groups for r in ratios[c][a]]):.2f}x" for a in arms], "")
    speed.notes.append("'text == off' (greedy answers identical to speculation off): "
                       + ", ".join(f"{a} {same[a]}/{total}" for a in arms) + ".")
    auto = engines["auto"].drafter
    chosen = getattr(auto, "chosen", {})
    if chosen:
        rounds = sum(chosen.values()) or 1
        speed.notes.append("auto's drafted rounds by drafter: " + ", ".join(f"{s} {n / rounds:.0%}" for s, n in chosen.items())
                           + f" ({getattr(auto, 'probes', 0)} head rounds run as probes); auto's per-prompt speed-up below 1.0x on {sum(r < 1 for r in every)} of {len(every)} prompts.")
    trees = engines[TREE_ARM].runner
    speed.notes.append(f"'{TREE_ARM}': {trees.tree_rounds} rounds drafted a tree, {trees.branch_rounds} of them accepted a "
                       "branch other than the first; its branches need an estimated probability of at least "
                       f"{SuffixParams().branch_min_prob}. The default is chains (--suffix-tree-branches 1): on the tuning "
                       "half, trees estimated 0.98-1.00x of chains with the same min_prob at every setting tried "
                       "(benchmarks/tune_drafters.py --trees).")
    speed.notes.append("'auto / best single drafter': per prompt, auto's rate over the rate of the category's best "
                       "single drafter (the highest median above) on the same prompt, median and range over the "
                       "category's prompts: a paired ratio, steadier than the two medians' quotient.")
    speed.notes.append(f"Each prompt is answered by every arm in turn, {repeats} pass(es), each pass its own tenant; the "
                       "ratio is per prompt (decode rate after the first token, each arm's best pass, its least "
                       "disturbed), so prefill is left out and the arms' passes are made side by side, prompt by "
                       "prompt. The acceptance counts and 'text == off' are the first pass's. Parameters were tuned on "
                       "the other half of the set (benchmarks/tune_drafters.py).")
    tables = [speed, accept]
    step_cost = engines["auto"].scheduler.step_cost
    if step_cost is not None:
        tables.append(ceiling_table(answers, step_cost.ms, k))
    load = streams_table(factory, {c: [encoded[p.id] for p in ps[:STREAMS]] for c, ps in heldout.items()}, new_tokens,
                         repeats=1 if quick else 3)
    llama = vs_llama_table(factory.base, {c: ps[:2 if quick else 4] for c, ps in heldout.items()}, new_tokens,
                           passes=repeats + 1)  # the first pass, and the later ones' best
    return [*tables, load, *llama]


CEILING_KS = (8, 16)  # the ceilings' most drafts a round: a lone stream's default and the limit


def ceiling_table(answers: dict[str, list[tuple[list[int], list[int], list[int]]]], step_ms, k: int) -> Table:
    """Per category, the median over its prompts of the speed-up each ceiling of
    ``bench/draft_ceiling.py`` estimates on speculation off's greedy answers (a category's
    earlier answers readable, as its tenant's store holds them), rounds priced by the step
    cost adaptive K uses (``step_ms(rows)``)."""
    arms = [(f"copy ceiling, K={n}, anchor 2", n, 2) for n in CEILING_KS] + [(f"copy ceiling, K={n}, any run", n, 0)
                                                                            for n in CEILING_KS]
    table = Table("What the held-out answers allow: estimated speed-up ceilings over speculation off, median per category",
                  ["category", *(name for name, _, _ in arms), *(f"perfect drafter, K={n}" for n in CEILING_KS),
                   f"answer tokens in a run (K={k}, anchor 2)"])
    steps = [step_ms(rows) for rows in range(1, max(CEILING_KS) + 2)]
    for category, prompts in answers.items():
        columns: list[list[float]] = [[] for _ in range(len(arms) + len(CEILING_KS))]
        drafted = tokens = 0
        for i, (prompt, prediction, answer) in enumerate(prompts):
            earlier = [a for _, _, a in prompts[:i]]
            for column, (_, n, anchor) in enumerate(arms):
                ceiling = draft_ceiling.CopyCeiling([prompt, prediction, *earlier], prompt, answer, n, anchor)
                columns[column].append(draft_ceiling.speedup(answer, ceiling, steps[: n + 1]))
                if n == k and anchor == 2:
                    drafted, tokens = drafted + ceiling.drafted, tokens + len(answer)
            for j, n in enumerate(CEILING_KS):
                columns[len(arms) + j].append(draft_ceiling.speedup(answer, draft_ceiling.perfect(n), steps[: n + 1]))
        table.add(category, *(f"{median(c):.2f}x" for c in columns), f"{drafted / max(tokens, 1):.0%}" if k in CEILING_KS else "-")
    table.notes.append("Replays of speculation off's greedy answers (bench/draft_ceiling.py), not wall-clock runs: a round of "
                       "d drafts costs the calibrated forward of 1 + d rows and keeps its drafts that match the answer, plus "
                       "one token. Copy ceiling: at each position the longest run of the answer's next tokens (at most K) "
                       "found in what a copying drafter can read (the prompt, the prediction, the category's earlier answers, "
                       "the answer so far); 'anchor 2': preceded there by the answer's 2 tokens before it (the suffix "
                       "drafter's shortest match); 'any run': no anchor, "
                       "what a copying drafter could reach choosing every run right. Perfect drafter: K drafts a round, "
                       "all kept, what the verify cost leaves on this machine. Text the model writes that is in none of "
                       "these is the MTP head's alone. Rounds here always draft the longest run (a shorter one could "
                       "cost less where the step cost has a bump), and the first token counts as a decode step.")
    return table


def auto_vs_best(rates: list[dict[str, float]], ratios: dict[str, list[float]], singles: list[str]) -> str:
    """Auto against the category's best single drafter (the highest median ratio over
    off), paired per prompt: the median of auto's rate / that drafter's rate, with the
    range, and the drafter's name."""
    scored = [a for a in singles if ratios[a]]
    if not scored or not ratios.get("auto"):
        return "-"
    best = max(scored, key=lambda a: median(ratios[a]))
    paired = [r["auto"] / r[best] for r in rates if r.get("auto", 0) > 0 and r.get(best, 0) > 0]
    if not paired:
        return "-"
    return f"{median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f}, {best})"


def rate_of(run: Timeline) -> float:
    """Decode rate after the first token; 0 where there is none to measure."""
    rate = run.decode_rate
    return rate if rate == rate else 0.0  # NaN: fewer than two tokens


def _rate(drafted: int, accepted: int) -> str:
    return f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
