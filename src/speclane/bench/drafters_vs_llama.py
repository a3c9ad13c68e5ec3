"""``speclane bench drafters`` against llama.cpp: its server's n-gram speculation and
speclane's ``auto`` drafter on the same held-out prompts, the same GGUF file, one stream.

Five servers run side by side, each idle while another is measured: ``llama-server``
without speculation, with ``--spec-type ngram-simple`` and with ``--spec-type ngram-mod``
(each type at llama.cpp's own n-gram sizes and draft lengths, as a user who names the type
gets it), ``speclane serve --drafter auto`` and ``speclane serve --spec-mode off``. Every
prompt goes to each server in turn as one greedy streamed chat completion over the same
client, ``passes`` times; a server's rate on a prompt is its decode rate after the first
token. Each speculation's ratio is per prompt against its own server without speculation,
so each engine's plain speed cancels; speclane's ``auto`` against llama.cpp's better n-gram
type of the category compares rates.

Two tables, because both servers remember answers: ``ngram-mod`` keeps one n-gram pool for
the server's lifetime, shared by every slot and request, and speclane's suffix drafter keeps
each tenant's recent outputs (speclane's requests carry the category as tenant, ``user``,
the same in every pass). The first pass measures answers neither server has written
before; the later passes (their best, against load spikes) answers both wrote in the first:
the same greedy text again, which a server-wide pool drafts from. The code-edit-prediction
prompts' ``prediction`` goes to speclane only: llama.cpp's server has no such field, so that
row compares speclane with the prediction against llama.cpp without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speclane.bench.common import Table, median, median_ratio, times
from speclane.bench.drafts_set import DraftPrompt
from speclane.bench.driver import progress
from speclane.bench.gguf_scenario import busy_elsewhere, load_note
from speclane.bench.http_streams import decode_rate, stream_chat
from speclane.bench.llama_cpp import find_llama_cpp_tool, llama_server
from speclane.bench.servers import speclane_server
from speclane.config import EngineConfig
from speclane.models.loader import ModelLoadError, resolve_model

SPEC_TYPES = ("ngram-simple", "ngram-mod")
SPECLANE = {"speclane off": ["--spec-mode", "off"], "speclane auto": ["--drafter", "auto"]}
PREDICTION_CATEGORY = "code-edit-prediction"
CONTEXT = 2048  # llama-server's KV cache: the longest held-out prompt and its answer fit
COLUMNS = ["category", "prompts", "llama.cpp off tok/s", "ngram-simple / off", "ngram-mod / off",
           "speclane off tok/s", "speclane auto / off", "speclane auto / llama.cpp best n-gram"]


def vs_llama_rows(rates: Mapping[str, Mapping[str, list[float]]]) -> list[list[Any]]:
    """The table's rows from per-prompt rates (category -> server -> one rate per prompt,
    in the same prompt order for every server): each speculation over its own server
    without it, median of per-prompt ratios; speclane ``auto`` over the category's better
    n-gram type (the higher median rate), per prompt; then every prompt pooled."""
    rows: list[list[Any]] = []
    pooled: dict[str, list[float]] = {name: [] for name in (*_servers(), "best n-gram")}
    for category, by_server in rates.items():
        best = max(SPEC_TYPES, key=lambda t: _or_zero(_measured_median(by_server[f"llama.cpp {t}"])))
        rows.append([category, len(by_server["llama.cpp off"]), *_row(by_server, by_server[f"llama.cpp {best}"], best)])
        for name in _servers():
            pooled[name] += by_server[name]
        pooled["best n-gram"] += by_server[f"llama.cpp {best}"]
    if rows:
        rows.append(["all prompts", len(pooled["llama.cpp off"]), *_row(pooled, pooled["best n-gram"], "")])
    return rows


def vs_llama_table(config: EngineConfig, groups: Mapping[str, list[DraftPrompt]], new_tokens: int,
                   passes: int) -> list[Table]:
    """The tables for ``groups`` (category -> the prompts to send): the first pass, and the
    later passes where ``passes`` > 1; or one table saying why llama.cpp did not run."""
    title = ("Held-out drafts set vs llama.cpp's server n-gram speculation{}: decode rate after the first token, "
             f"median per category (one stream over HTTP, greedy, up to {new_tokens} tokens, the same GGUF file)")
    first = Table(title.format(", answers neither server wrote before"), COLUMNS)
    binary = find_llama_cpp_tool("llama-server")
    gguf = _gguf(config.model.model)
    if binary is None or gguf is None:
        first.notes.append("Not run: " + ("llama.cpp's llama-server was not found (PATH or ~/.cache/speclane-anchors)."
                                          if binary is None else f"the model {config.model.model!r} is not a GGUF file, "
                                          "which llama.cpp needs."))
        return [first]
    threads = config.model.num_threads or 2
    load_before, others = os.getloadavg()[0], busy_elsewhere()
    with contextlib.ExitStack() as stack:
        progress("drafters vs llama.cpp: starting servers")
        urls = {"llama.cpp off": stack.enter_context(llama_server(binary, gguf, threads, context=CONTEXT)).url}
        for spec_type in SPEC_TYPES:
            server = llama_server(binary, gguf, threads, context=CONTEXT, extra=["--spec-type", spec_type])
            urls[f"llama.cpp {spec_type}"] = stack.enter_context(server).url
        for name, extra in SPECLANE.items():
            urls[name] = stack.enter_context(speclane_server(config, extra)).url
        model = config.model.model
        for url in urls.values():
            stream_chat(url, model, "Hello!", 8)  # warm-up
        by_pass, drafts = _measure(urls, model, groups, new_tokens, passes)
    tables = [first]
    if passes > 1:
        tables.append(Table(title.format(", answers both servers wrote in the first pass"), COLUMNS))
    for table, rates in zip(tables, (by_pass[0], _best_later(by_pass)), strict=False):
        for row in vs_llama_rows(rates):
            table.add(*row)
    for name, (drafted, accepted) in drafts[0].items():
        if name not in ("llama.cpp off", "speclane off"):
            first.notes.append(f"{name}: {accepted}/{drafted} drafted tokens accepted in the first pass"
                               + (f", {drafts[1][name][1]}/{drafts[1][name][0]} in the later passes" if passes > 1 else "")
                               + " (as each server reports it).")
    first.notes.append(f"Every prompt goes to each server in turn, {passes} pass(es). This table: the first pass; "
                       + ("the next: the best of the later passes. " if passes > 1 else "")
                       + "A rate is completion tokens after the first content chunk over their time. Each '/ off' is "
                       "the median of per-prompt ratios against the same engine without speculation; the last column "
                       "compares speclane auto's rate with llama.cpp's better n-gram type in that category (named).")
    first.notes.append("Both servers remember answers: ngram-mod's n-gram pool lives as long as the server and is "
                       "shared by every request (every earlier prompt's answers, of every category, are in it); "
                       "speclane's suffix drafter reads its tenant's recent outputs (the category's earlier answers: "
                       "the category is the tenant, user, the same in every pass). So in the first pass neither has "
                       "seen the prompt's answer; in the later passes both have, and both can draft the repeated "
                       "greedy answer.")
    first.notes.append(f"llama-server -t {threads} -c {CONTEXT} -np 1 --jinja, with --spec-type ngram-simple or ngram-mod "
                       "at llama.cpp's default n-gram sizes and draft lengths; speclane serve --drafter auto "
                       "(adaptive K) and --spec-mode off.")
    first.notes.append(f"{PREDICTION_CATEGORY}: the prediction goes to speclane only (llama.cpp's server has no "
                       "prediction field), so its last column compares speclane with the prediction against llama.cpp "
                       "without it; it is part of the 'all prompts' row too.")
    tables[-1].notes.append(load_note(load_before, os.getloadavg()[0], len(os.sched_getaffinity(0)), threads, others))
    return tables


Rates = dict[str, dict[str, list[float]]]  # category -> server -> one rate per prompt


def _measure(urls: Mapping[str, str], model: str, groups: Mapping[str, list[DraftPrompt]], new_tokens: int,
             passes: int) -> tuple[list[Rates], list[dict[str, tuple[int, int]]]]:
    """Per pass, category and server, each prompt's decode rate; per server, the drafted and
    accepted tokens of the first pass's requests and of the later passes'."""
    by_pass: list[Rates] = [{c: {name: [] for name in urls} for c in groups} for _ in range(passes)]
    drafts = [dict.fromkeys(urls, (0, 0)) for _ in range(2)]
    total = sum(len(ps) for ps in groups.values())
    done = 0
    for category, prompts in groups.items():
        for prompt in prompts:
            done += 1
            progress(f"drafters vs llama.cpp {category} {done}/{total}")
            for r in range(passes):
                for name, url in urls.items():
                    extra = _speclane_body(prompt, category) if name in SPECLANE else None
                    result = stream_chat(url, model, prompt.messages, new_tokens, extra)
                    by_pass[r][category][name].append(_or_zero(decode_rate(result)))
                    counts = drafts[min(r, 1)]
                    counts[name] = (counts[name][0] + result.drafts[0], counts[name][1] + result.drafts[1])
    return by_pass, drafts


def _best_later(by_pass: list[Rates]) -> Rates:
    """Each prompt's best rate over the passes after the first."""
    later = by_pass[1:]
    if not later:
        return {}
    return {c: {name: [max(rates) for rates in zip(*(p[c][name] for p in later), strict=True)] for name in servers}
            for c, servers in later[0].items()}


def _speclane_body(prompt: DraftPrompt, tenant: str) -> dict[str, Any]:
    body: dict[str, Any] = {"user": tenant}
    if prompt.prediction:
        body["prediction"] = {"type": "content", "content": prompt.prediction}
    return body


def _row(by_server: Mapping[str, list[float]], best: list[float], best_name: str) -> list[Any]:
    off, ours_off, auto = by_server["llama.cpp off"], by_server["speclane off"], by_server["speclane auto"]
    against_best = times(median_ratio(auto, best))
    return [_measured_median(off), *[times(median_ratio(by_server[f"llama.cpp {t}"], off)) for t in SPEC_TYPES],
            _measured_median(ours_off), times(median_ratio(auto, ours_off)),
            f"{against_best} ({best_name})" if best_name else against_best]


def _servers() -> Sequence[str]:
    return ("llama.cpp off", *(f"llama.cpp {t}" for t in SPEC_TYPES), *SPECLANE)


def _gguf(model: str) -> Path | None:
    """The model's GGUF file, or None where it is not one (or cannot be found)."""
    try:
        path = resolve_model(model)
    except ModelLoadError:
        return None
    return path if path.is_file() and path.suffix == ".gguf" else None


def _measured_median(rates: list[float]) -> float:
    """Median of the rates that measured something (a prompt with fewer than two tokens counts 0)."""
    return median([r for r in rates if r > 0])


def _or_zero(rate: float) -> float:
    return rate if rate == rate else 0.0  # NaN: nothing to measure
