"""``speclane bench drafters``, under load: each category's held-out prompts as concurrent
streams through one engine, the lane (``auto`` drafter) against speculation off.

Per category, ``STREAMS`` held-out prompts (as many as the category has, if fewer) start
together through one engine, greedy, up to the single-stream table's token count; the
aggregate rate is every stream's tokens over the batch's wall time (what ``bench
throughput`` measures). The two engines alternate (``common.alternate``), each pass its
own tenant, and each pass's ratio is taken against the off pass beside it.

The streams of a category are one tenant (the category's, one per pass): a category
stands for one application's traffic, whose streams share the suffix drafter's tenant
store; a pass never drafts from an earlier pass's answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from speclane.bench.common import Table, alternate, median, median_ratio, times
from speclane.bench.driver import Job, batch_rate, drive, progress
from speclane.bench.factory import EngineFactory
from speclane.engine.engine import LLMEngine
from speclane.request import SamplingParams

STREAMS = 8

Prompt = tuple[list[int], list[int]]  # prompt ids, prediction ids (empty: none)


def load_ratios(runs: Mapping[str, Mapping[str, list[float]]]) -> dict[str, float]:
    """Per category, the median over passes of on / off (each pass against the off pass
    beside it), and under ``"all categories"`` the median of the categories' ratios."""
    ratios = {category: median_ratio(arms["on"], arms["off"]) for category, arms in runs.items()}
    measured = [r for r in ratios.values() if r == r]  # NaN: a category that measured nothing
    return ratios | {"all categories": median(measured)}


def streams_table(factory: EngineFactory, groups: Mapping[str, list[Prompt]], new_tokens: int,
                  repeats: int) -> Table:
    """The table for ``groups`` (category -> its prompts, encoded; the first ``STREAMS`` run)."""
    engines = {"off": factory.engine(spec_mode="off"), "on": factory.engine(spec_mode="slice", drafter="auto")}
    warm = next(iter(groups.values()))[0]
    for engine in engines.values():  # warm-up, a tenant of its own
        drive(engine, [Job("warm-up", warm[0], SamplingParams(max_tokens=8), options={"tenant": "warm-up"})])
    runs: dict[str, dict[str, list[float]]] = {}
    same = streams = 0
    for category, prompts in groups.items():
        progress(f"drafters under load: {category}")
        texts: dict[str, list[list[str]]] = {name: [] for name in engines}
        arms = {name: _arm(engine, category, prompts[:STREAMS], new_tokens, texts[name])
                for name, engine in engines.items()}
        runs[category] = alternate(arms, repeats, warmup=False)
        for on, off in zip(texts["on"], texts["off"], strict=True):
            same += sum(a == b for a, b in zip(on, off, strict=True))
            streams += len(off)
    ratios = load_ratios(runs)
    table = Table(f"Held-out drafts set under load: {STREAMS} concurrent streams per category, aggregate tok/s, "
                  f"lane (auto drafter) on vs off (greedy, up to {new_tokens} tokens)",
                  ["category", "streams", "off tok/s", "on tok/s", "on / off"])
    for category, arms in runs.items():
        table.add(category, min(STREAMS, len(groups[category])), median(arms["off"]), median(arms["on"]),
                  times(ratios[category]))
    table.add("all categories", sum(min(STREAMS, len(p)) for p in groups.values()), "-", "-",
              times(ratios["all categories"]))
    table.notes.append(f"'text == off' (each stream's greedy answer identical with the lane on and off): {same}/{streams}.")
    table.notes.append(f"A category's streams start together through one engine and are one tenant (the category's, "
                       f"a new one each pass), as one application's traffic: they share the suffix drafter's tenant "
                       f"store, and no pass drafts from an earlier pass's answers. Aggregate: every stream's tokens over "
                       f"the batch's wall time. Engines alternate, {repeats} pass(es) each after a warm-up; tok/s are "
                       "medians; on / off is the median of each pass against the off pass beside it, and the 'all "
                       "categories' row the median of the categories' ratios.")
    return table


def _arm(engine: LLMEngine, category: str, prompts: list[Prompt], new_tokens: int, texts: list[list[str]]) -> Callable[[], float]:
    """One pass of ``prompts`` as concurrent streams through ``engine``: their aggregate
    tok/s; each pass appends its answers to ``texts``."""

    def run() -> float:
        tenant = f"{category}#{len(texts)}"
        jobs = [Job(f"{tenant}/{i}/{time.perf_counter()}", ids, SamplingParams(max_tokens=new_tokens),
                    options={"tenant": tenant, "prediction_token_ids": prediction})
                for i, (ids, prediction) in enumerate(prompts)]
        timelines, wall = drive(engine, jobs)
        texts.append([timelines[job.request_id].text for job in jobs])
        return batch_rate(timelines, wall)

    return run
