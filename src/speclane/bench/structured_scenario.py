"""``speclane bench structured``: what a grammar costs, and what its forced tokens earn.

1. Constrained decoding cost: the 14 JSON-schema answers of ``structured_cases``
   decoded under their schema, against unconstrained decoding of as many tokens from
   the same prompts (``ignore_eos``, same token count per request: a decode step's cost
   does not depend on which token it emits), speculation off in both arms so only the
   grammar differs; one stream after another and 8 at once.
2. Forced-token drafting: schema-shaped answers with several fixed keys, lane on vs
   off, one stream; the outputs must be identical (the table says so per case).

Arms alternate (A B A B) and the table reports medians, so machine noise hits both.
"""

from __future__ import annotations

import time

from speclane.bench.common import Table, alternate, median
from speclane.bench.driver import Job, batch_tokens, drive, progress
from speclane.bench.factory import EngineFactory
from speclane.bench.structured_cases import CASES, FIXED_KEY_CASES, SchemaCase
from speclane.grammar.spec import GrammarSpec
from speclane.request import SamplingParams

MAX_TOKENS = 200


def structured(factory: EngineFactory, quick: bool = False) -> list[Table]:
    return [constrained_cost(factory, quick=quick), forced_drafting(factory, quick=quick)]


def _jobs(factory: EngineFactory, engine, cases: tuple[SchemaCase, ...], tag: str, *, constrained: bool,
          lengths: dict[str, int] | None = None, speculative: bool = False) -> list[Job]:
    jobs = []
    for case in cases:
        options: dict = {"speculative": speculative}
        if constrained:
            options["grammar"] = engine.compile_grammar(GrammarSpec.json_schema(case.schema))
            sampling = SamplingParams(max_tokens=MAX_TOKENS)
        else:  # the same number of tokens, no grammar
            sampling = SamplingParams(max_tokens=(lengths or {})[case.name], ignore_eos=True)
        jobs.append(Job(f"{tag}-{case.name}-{time.perf_counter_ns()}", factory.chat_ids(case.prompt), sampling,
                        options=options))
    return jobs


def constrained_cost(factory: EngineFactory, quick: bool = False) -> Table:
    engine = factory.engine(spec_mode="off")
    reference_jobs = _jobs(factory, engine, CASES, "ref", constrained=True)
    reference, _ = drive(engine, reference_jobs)
    lengths = {case.name: len(reference[job.request_id].token_times) for case, job in zip(CASES, reference_jobs, strict=True)}
    table = Table("Constrained decoding cost: JSON-schema answers vs unconstrained decoding of as many tokens",
                  ["streams", "constrained tok/s", "unconstrained tok/s", "ratio", "tokens per arm"])
    for streams in (1, 8):
        progress(f"structured cost, {streams} stream(s)")

        def arm(constrained: bool, streams: int = streams) -> float:
            jobs = _jobs(factory, engine, CASES, "arm", constrained=constrained, lengths=lengths)
            wall = 0.0
            tokens = 0
            for start in range(0, len(jobs), streams):  # `streams` at a time
                timelines, seconds = drive(engine, jobs[start : start + streams])
                wall += seconds
                tokens += batch_tokens(timelines)
            return tokens / wall

        runs = alternate({"constrained": lambda: arm(True), "free": lambda: arm(False)}, repeats=2 if quick else 3)
        a, b = median(runs["constrained"]), median(runs["free"])
        table.add(streams, a, b, f"{a / b:.2f}x", sum(lengths.values()))
    table.notes.append(f"The {len(CASES)} schemas of speclane.bench.structured_cases, greedy, speculation off in both "
                       "arms; the unconstrained arm decodes exactly as many tokens per request as the constrained answer "
                       "had (ignore_eos), from the same prompts. Per-request wall time includes the prefill in both.")
    return table


def forced_drafting(factory: EngineFactory, quick: bool = False) -> Table:
    engine = factory.engine()  # the default lane
    table = Table("Forced-token drafting: schema-shaped answers, lane on vs off (one stream)",
                  ["answer", "tokens", "lane on tok/s", "lane off tok/s", "speed-up", "accepted drafts",
                   "identical output"])
    on_total = off_total = 0.0
    for case in FIXED_KEY_CASES:
        progress(f"structured forced drafting: {case.name}")
        texts: dict[bool, str] = {}
        accepted: list[int] = []

        def arm(speculative: bool, case: SchemaCase = case, texts: dict[bool, str] = texts,
                accepted: list[int] = accepted) -> float:
            timelines, wall = drive(engine, _jobs(factory, engine, (case,), "forced", constrained=True,
                                                  speculative=speculative))
            (tl,) = timelines.values()
            texts[speculative] = tl.text
            if speculative:
                accepted.append(int(tl.usage.get("speculative", {}).get("accepted_tokens", 0)))
            return len(tl.token_times) / wall

        runs = alternate({"on": lambda: arm(True), "off": lambda: arm(False)}, repeats=3 if quick else 5)
        on, off = median(runs["on"]), median(runs["off"])
        on_total += 1 / on
        off_total += 1 / off
        tokens = len(factory.tokenizer.encode(texts[True]))
        table.add(case.name, tokens, on, off, f"{on / off:.2f}x", f"{median(accepted[1:]):.0f}",  # [0]: the warm-up
                  "yes" if texts[True] == texts[False] else "NO")
    n = len(FIXED_KEY_CASES)
    table.add("all (harmonic mean)", "", n / on_total, n / off_total, f"{off_total / on_total:.2f}x", "", "")
    table.notes.append(f"Greedy, the default lane ({factory.base.lane.drafter} drafter, adaptive K). Under a grammar a round's draft is the "
                       "drafter's proposal cut to what the grammar allows, then the tokens the grammar forces "
                       "(fixed keys, quotes, colons), verified in the same forward as a normal round.")
    return table
