"""``speclane bench drafters``' added tables without engines or servers: paired ratios per
category, the 'all' rows, the better llama.cpp n-gram type, and what each server is sent."""

from __future__ import annotations

import math

from speclane.bench import drafters_vs_llama as vs
from speclane.bench.common import median_ratio, times
from speclane.bench.drafters_load import load_ratios
from speclane.bench.drafts_set import DraftPrompt
from speclane.bench.http_streams import StreamResult, decode_rate, speculation_counts
from speclane.config import EngineConfig


def test_median_ratio_pairs_values_and_leaves_out_what_did_not_measure():
    assert median_ratio([2.0, 3.0, 10.0], [1.0, 2.0, 2.0]) == 2.0  # ratios 2, 1.5, 5
    assert median_ratio([2.0, 0.0, float("nan")], [1.0, 1.0, 1.0]) == 2.0
    assert math.isnan(median_ratio([0.0], [1.0]))
    assert times(median_ratio([], [])) == "-"


def test_load_ratios_pair_each_pass_with_the_off_pass_beside_it():
    runs = {"copy": {"off": [100.0, 50.0, 100.0], "on": [150.0, 100.0, 120.0]},  # 1.5, 2.0, 1.2
            "chat": {"off": [100.0], "on": [90.0]},
            "empty": {"off": [], "on": []}}
    ratios = load_ratios(runs)
    assert ratios["copy"] == 1.5
    assert ratios["chat"] == 0.9
    assert math.isnan(ratios["empty"])
    assert ratios["all categories"] == (1.5 + 0.9) / 2  # the median of the categories that measured


def _rates(off: list[float], simple: list[float], mod: list[float], ours_off: list[float], auto: list[float]):
    return {"llama.cpp off": off, "llama.cpp ngram-simple": simple, "llama.cpp ngram-mod": mod,
            "speclane off": ours_off, "speclane auto": auto}


def test_rows_compare_each_speculation_with_its_own_off_and_auto_with_the_better_ngram_type():
    rates = {
        "copy": _rates([100.0, 100.0], [200.0, 300.0], [150.0, 150.0], [50.0, 50.0], [100.0, 75.0]),
        "chat": _rates([100.0, 100.0], [90.0, 90.0], [110.0, 100.0], [50.0, 40.0], [55.0, 40.0]),
    }
    copy, chat, pooled = vs.vs_llama_rows(rates)
    # copy: ngram-simple is better (median 250 vs 150); auto / simple per prompt: 0.5, 0.25.
    assert copy == ["copy", 2, 100.0, "2.50x", "1.50x", 50.0, "1.75x", "0.38x (ngram-simple)"]
    # chat: ngram-mod is better (median 105 vs 90); auto / mod per prompt: 0.5, 0.4.
    assert chat == ["chat", 2, 100.0, "0.90x", "1.05x", 45.0, "1.05x", "0.45x (ngram-mod)"]
    # every prompt pooled, each against its own category's better type: 0.5, 0.25, 0.5, 0.4.
    assert pooled == ["all prompts", 4, 100.0, "1.45x", "1.30x", 50.0, "1.30x", "0.45x"]


def test_a_prompt_that_measured_nothing_leaves_the_medians():
    rows = vs.vs_llama_rows({"x": _rates([0.0, 100.0], [0.0, 200.0], [0.0, 100.0], [0.0, 50.0], [0.0, 100.0])})
    assert rows[0] == ["x", 2, 100.0, "2.00x", "1.00x", 50.0, "2.00x", "0.50x (ngram-simple)"]


def test_decode_rate_counts_the_tokens_after_the_first_chunk():
    assert decode_rate(StreamResult(0.0, 3.0, 11, 1.0)) == 5.0
    assert math.isnan(decode_rate(StreamResult(0.0, 3.0, 1, 1.0)))
    assert math.isnan(decode_rate(StreamResult(0.0, 3.0, 10, None)))


def test_only_speclane_gets_the_tenant_and_the_prediction_and_each_pass_is_kept_apart(monkeypatch):
    sent: list[tuple[str, dict | None]] = []
    # Servers in _servers() order, pass by pass: off, ngram-simple, ngram-mod, speclane off, speclane auto.
    rates = iter([5.0, 1.0, 2.0, 3.0, 4.0, 10.0, 9.0, 1.0, 1.0, 1.0, 6.0, 2.0, 8.0, 2.0, 7.0])

    def fake_stream(url, model, messages, max_tokens, extra=None):
        sent.append((url, extra))
        rate = next(rates)  # a result whose decode rate is ``rate``: 1 + rate tokens in a second
        return StreamResult(0.0, 2.0, 1 + int(rate), 1.0, (4, int(rate) % 4))

    monkeypatch.setattr(vs, "stream_chat", fake_stream)
    urls = {name: name for name in vs._servers()}
    prompt = DraftPrompt("p1", "code-edit-prediction", "heldout", ({"role": "user", "content": "edit"},), "x = 1")
    by_pass, drafts = vs._measure(urls, "m", {"code-edit-prediction": [prompt]}, new_tokens=8, passes=3)
    assert by_pass[0]["code-edit-prediction"] == {"llama.cpp off": [5.0], "llama.cpp ngram-simple": [1.0],
                                                  "llama.cpp ngram-mod": [2.0], "speclane off": [3.0],
                                                  "speclane auto": [4.0]}
    # The later passes' best, apart from the first.
    assert vs._best_later(by_pass)["code-edit-prediction"] == {
        "llama.cpp off": [10.0], "llama.cpp ngram-simple": [9.0], "llama.cpp ngram-mod": [8.0], "speclane off": [2.0],
        "speclane auto": [7.0]}
    assert drafts[0] == {"llama.cpp off": (4, 1), "llama.cpp ngram-simple": (4, 1), "llama.cpp ngram-mod": (4, 2),
                         "speclane off": (4, 3), "speclane auto": (4, 0)}
    assert drafts[1]["llama.cpp ngram-mod"] == (8, 1 + 0) and drafts[1]["speclane auto"] == (8, 1 + 3)
    for url, extra in sent:
        if url.startswith("llama.cpp"):
            assert extra is None
        else:
            assert extra is not None and extra["prediction"] == {"type": "content", "content": "x = 1"}
    # One tenant in every pass: its suffix store holds the first pass's answer, as ngram-mod's pool does.
    assert [extra["user"] for url, extra in sent if url == "speclane auto"] == ["code-edit-prediction"] * 3
    assert vs._best_later(by_pass[:1]) == {}


def test_speculation_counts_read_speclane_usage_or_llama_cpp_timings():
    speclane = {"speculative": {"draft_tokens": 12, "accepted_tokens": 9, "rounds": 4}}
    assert speculation_counts({}, speclane) == (12, 9)
    assert speculation_counts({"timings": {"draft_n": 55, "draft_n_accepted": 11, "predicted_n": 35}}, {}) == (55, 11)
    assert speculation_counts({"timings": {"predicted_n": 35}}, {}) == (0, 0)  # llama.cpp drafted nothing
    assert speculation_counts({}, {}) is None


def test_without_llama_server_the_table_says_so_and_runs_nothing(monkeypatch):
    def no_server(*args, **kwargs):
        raise AssertionError("no server may start")

    monkeypatch.setattr(vs, "find_llama_cpp_tool", lambda name: None)
    monkeypatch.setattr(vs, "speclane_server", no_server)
    table, = vs.vs_llama_table(EngineConfig(), {"open-chat": []}, new_tokens=8, passes=2)
    assert table.rows == []
    assert table.notes == ["Not run: llama.cpp's llama-server was not found (PATH or ~/.cache/speclane-anchors)."]


def test_auto_is_paired_per_prompt_with_the_categorys_best_single_drafter():
    from speclane.bench.drafters_scenario import auto_vs_best

    # suffix has the higher median over off (1.5 vs 1.2): auto is compared with it, prompt by prompt.
    ratios = {"ngram": [1.2, 1.2, 1.2], "suffix": [1.5, 1.4, 1.6], "auto": [1.4, 1.5, 1.5]}
    rates = [{"off": 100.0, "ngram": 120.0, "suffix": 150.0, "auto": 140.0},
             {"off": 100.0, "ngram": 120.0, "suffix": 140.0, "auto": 150.0},
             {"off": 100.0, "ngram": 120.0, "suffix": 160.0, "auto": 0.0}]  # auto measured nothing here
    assert auto_vs_best(rates, ratios, ["ngram", "suffix"]) == "1.00x (0.93-1.07, suffix)"
    assert auto_vs_best(rates, {"ngram": [], "suffix": [], "auto": [1.0]}, ["ngram", "suffix"]) == "-"
