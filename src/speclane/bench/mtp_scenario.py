"""``speclane bench mtp``: the MTP drafter on chat outside its head's training.

Ordinary chat questions that were never the head's training prompts (``CHAT_PROMPTS``; a
test checks they are disjoint from ``speclane.training.prompts``), greedy, default model.
They are not held out from the drafting policy: adaptive K's stopping rule was chosen on
them (``benchmarks/mtp_draft_length_replay.py``); the drafts set's held-out half
(``bench drafters``) is the evaluation nothing was tuned on.
Engines over the same model — speculation off, the n-gram drafter, the MTP drafter
as served (prompt lookup first, the head elsewhere, adaptive K), its head alone
(``--no-mtp-lookup``), and as served but drafting 2 every round (fixed K) — answer every
prompt in turn (A B C D E per prompt, so machine noise hits each alike). Reports tok/s
over all prompts, acceptance per draft position, mean accepted drafts per round, the
share of rounds drafted by lookup, and whether each arm's text equals speculation off.
"""

from __future__ import annotations

import time

from speclane.bench.common import Table, median
from speclane.bench.driver import Job, drive, progress
from speclane.bench.factory import EngineFactory
from speclane.bench.prompts import CHAT_PROMPTS
from speclane.request import SamplingParams


def _answer(engine, ids: list[int], new_tokens: int) -> tuple[int, float, str]:
    jobs = [Job(f"m{time.perf_counter()}", ids, SamplingParams(max_tokens=new_tokens))]
    timelines, wall = drive(engine, jobs)
    tl = next(iter(timelines.values()))
    return len(tl.token_times), wall, tl.text


def mtp(factory: EngineFactory, new_tokens: int = 128, repeats: int = 2, quick: bool = False) -> list[Table]:
    prompts = CHAT_PROMPTS[:3] if quick else CHAT_PROMPTS
    new_tokens = 32 if quick else new_tokens
    repeats = 1 if quick else repeats
    k = factory.base.lane.max_draft_tokens  # one stream at a time: a lone stream's depth
    engines = {
        "off": factory.engine(spec_mode="off"),
        "ngram": factory.engine(spec_mode="slice", drafter="ngram"),
        "mtp": factory.engine(spec_mode="slice", drafter="mtp"),
        "mtp head only": factory.engine(spec_mode="slice", drafter="mtp", mtp_lookup=False),
        # Two drafts every round, adaptive K off: what the drafter gives when it always
        # drafts, the reference adaptive K is measured against (it should leave ~0 of it
        # on the table; without its stopping rule it leaves 10-15%).
        "mtp K=2 fixed": factory.engine(spec_mode="slice", drafter="mtp", num_draft_tokens=2, spec_adaptive_k=False),
    }
    ids = [factory.chat_ids(p) for p in prompts]
    for engine in engines.values():  # warm-up
        _answer(engine, ids[0], 8)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    texts: dict[str, list[str]] = {name: [] for name in engines}
    for r in range(repeats):
        tokens = dict.fromkeys(engines, 0)
        wall = dict.fromkeys(engines, 0.0)
        for i, prompt_ids in enumerate(ids):
            progress(f"mtp pass {r + 1}/{repeats} prompt {i + 1}/{len(ids)}")
            for name, engine in engines.items():
                n, seconds, text = _answer(engine, prompt_ids, new_tokens)
                tokens[name] += n
                wall[name] += seconds
                if r == 0:
                    texts[name].append(text)
        for name in engines:
            rates[name].append(tokens[name] / wall[name])
    off = median(rates["off"])
    table = Table(f"Chat outside the head's training, greedy, {len(prompts)} prompts x up to {new_tokens} tokens, "
                  f"adaptive K up to {k}", [
        "drafter", "tok/s", "runs", "vs off", "acceptance", "accepted / round", "tokens / round", "drafting ms / round",
        "lookup rounds", "text == off"])
    positions = Table("Acceptance per draft position (slice rounds; position j counts rounds whose drafts 0..j-1 were accepted)",
                      ["drafter"] + [f"pos {j + 1}" for j in range(k)])
    # Adaptive K drafts where recent acceptance pays, so these are the drafted stretches'
    # rates, not the drafter's on the whole text (training.evaluate.acceptance_report replays that).
    positions.notes.append("Counts only the rounds adaptive K chose to draft (a selection of the easier stretches); "
                           "the head's rate over whole answers is the offline replay's (training.evaluate.acceptance_report).")
    for name, engine in engines.items():
        c = engine.counters
        rounds = c.slice_rounds
        acc = c.accepted_tokens / c.draft_tokens if c.draft_tokens else 0.0
        same = sum(a == b for a, b in zip(texts[name], texts["off"], strict=True))
        rate = median(rates[name])
        table.add(name, rate, ", ".join(f"{x:.1f}" for x in rates[name]), f"{rate / off:.2f}x",
                  f"{acc:.0%}" if rounds else "-", f"{c.accepted_tokens / rounds:.2f}" if rounds else "-",
                  f"{(c.accepted_tokens + rounds) / rounds:.2f}" if rounds else "-", _drafting_ms(engine),
                  _lookup_share(engine), f"{same}/{len(prompts)}")
        if rounds:
            by_pos = c.acceptance_by_position()
            positions.add(name, *[f"{by_pos[j]:.0%}" if j < len(by_pos) else "-" for j in range(k)])
    table.notes.append("The prompts are none of the MTP head's training prompts, but adaptive K's stopping rule was "
                       "chosen on them (benchmarks/mtp_draft_length_replay.py): bench drafters' held-out half is the "
                       "set nothing was tuned on.")
    table.notes.append("Default engine (bfloat16 activations, int4 GGUF weights), one round per tick; "
                       "counters include the warm-up. 'text == off': greedy answers identical to speculation off "
                       "(all of them with our int4 and attention kernels, which compute every row alone; with "
                       "torch's kernels (--kernels torch) a verify's rows round differently and a near-tie can flip).")
    return [table, positions]


def _lookup_share(engine) -> str:
    """Of the MTP drafter's proposals, the share drafted by prompt lookup (not its head)."""
    drafter = engine.drafter
    if drafter is None or not getattr(drafter, "proposals", 0):
        return "-"
    return f"{drafter.lookup_proposals / drafter.proposals:.0%}"


def _drafting_ms(engine) -> str:
    drafter = engine.drafter
    if drafter is None or not getattr(drafter, "proposals", 0):
        return "-"
    return f"{drafter.propose_seconds / drafter.proposals * 1000:.1f}"
