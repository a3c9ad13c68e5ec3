"""``speclane bench vs-llama-cpp``'s logic without servers: the time to first token of
streams, the busy neighbour process, and the tables' ratios and ranges."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from speclane.bench import vs_llama_cpp as vs
from speclane.bench.http_streams import StreamResult, histogram_totals
from speclane.engine.stats import EngineCounters


def test_mean_ttft_counts_a_stream_without_content_whole():
    results = [StreamResult(0.0, 2.0, 10, 0.5), StreamResult(1.0, 3.0, 10, 1.25), StreamResult(0.0, 4.0, 0, None)]
    assert vs.mean_ttft(results) == (0.5 + 0.25 + 4.0) / 3


def test_the_busy_process_runs_only_inside_the_block():
    def spinning() -> set[int]:
        return {int(p) for p in os.listdir("/proc") if p.isdigit() and _is_busy_loop(p)}

    before = spinning()
    with vs.busy_process():
        inside = spinning() - before
        assert len(inside) == 1
    assert not (spinning() - before)


def _is_busy_loop(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"while True: pass" in f.read()
    except OSError:
        return False


def test_speculation_table_gives_median_and_range_of_paired_ratios():
    spec = {8: {"off": [100.0, 200.0, 100.0], "auto": [120.0, 200.0, 100.0], "ngram": [110.0, 180.0, 130.0],
                "mtp": [100.0, 200.0, 100.0]}}
    alone = {16: {"off": [50.0, 60.0, 40.0], "auto": [50.0, 66.0, 36.0], "ngram": [55.0, 60.0, 40.0],
                  "mtp": [45.0, 60.0, 44.0], vs.OFF_AGAIN: [49.0, 63.0, 40.0]}}
    table = vs._spec_table(spec, alone, tokens=64, runs=3)
    # The HTTP path has no A/A arm; engines alone do: a second off engine against the first.
    assert table.rows == [[8, "HTTP, openai client", 100.0, "1.00x (1.00-1.20)", "1.10x (0.90-1.30)", "1.00x (1.00-1.00)", "-"],
                          [16, "engines alone, ticks interleaved", 50.0, "1.00x (0.90-1.10)", "1.00x (1.00-1.10)", "1.00x (0.90-1.10)",
                           "1.00x (0.98-1.05)"]]


def test_sustained_clients_get_rows_of_their_own_and_a_note():
    alone = {8: {"off": [100.0], "auto": [100.0], "ngram": [100.0], "mtp": [100.0]}}
    sustained = {8: {"off": [100.0, 90.0], "auto": [105.0, 99.0], "ngram": [100.0, 81.0], "mtp": [95.0, 90.0]}}
    table = vs._spec_table({}, alone, tokens=64, runs=2, sustained=sustained, sustain_s=2.0)
    assert table.rows[-1] == [8, "engines alone, ticks interleaved, sustained clients", 95.0, "1.08x (1.05-1.10)", "0.95x (0.90-1.00)",
                              "0.97x (0.95-1.00)", "-"]
    assert any(note.startswith("Sustained clients:") and "its ticks have taken 2 s each run" in note for note in table.notes)
    assert not any("sustained" in row[1] for row in vs._spec_table({}, alone, tokens=64, runs=1).rows)


def test_lane_work_counts_the_rows_drafts_add_from_the_engine_counters():
    counters = EngineCounters()
    work = vs.LaneWork()
    for ticks, drafted, accepted, tokens in ((129, 13, 9, 2048), (129, 7, 1, 2048)):
        before = vs.LaneWork.reading(counters)
        counters.ticks += ticks
        counters.draft_tokens += drafted
        counters.accepted_tokens += accepted
        work.add(counters, before, tokens)
    assert (work.ticks, work.drafted, work.accepted, work.decode_rows) == (258, 20, 10, 4086)
    off = vs.LaneWork(ticks=250, decode_rows=4096)
    assert work.summary(off) == "+0.5% rows, 10/20 accepted, ticks 1.03x"
    alone = {16: dict.fromkeys(("off", "auto", "ngram", "mtp"), [50.0])}
    table = vs._spec_table({}, alone, tokens=64, runs=1, work={16: {"off": off, "auto": work, "ngram": off, "mtp": work}})
    assert table.rows[-1] == [16, "engines alone: the work (all batch runs, warm-up included)", "-", "+0.5% rows, 10/20 accepted, ticks 1.03x",
                              "+0.0% rows, 0/0 accepted, ticks 1.00x", "+0.5% rows, 10/20 accepted, ticks 1.03x", "-"]


def test_noisy_table_reports_the_kept_fraction():
    table = vs._noisy_table({"speclane": [0.5, 0.75, 0.25], "llama.cpp": [0.4]}, tokens=64, repeats=3)
    assert table.rows == [["speclane", "0.50", "0.50, 0.75, 0.25"], ["llama.cpp", "0.40", "0.40"]]


def test_single_table_compares_http_and_engine_decode_rates_not_whole_requests():
    arms = {name: vs.StreamArm("http://x", "m", 1, 64) for name in (vs.SPEC_OFF, "speclane, lane on")}
    arms[vs.SPEC_OFF].decode_rates = [90.0, 95.0, 60.0]
    single = {vs.SPEC_OFF: [70.0, 72.0, 71.0], "speclane, lane on": [150.0, 140.0, 160.0],
              "llama.cpp llama-server": [100.0, 100.0, 100.0], vs.ENGINE_BESIDE_HTTP: [100.0, 100.0, 50.0]}
    table = vs._single_table({"speclane": [100.0, 90.0, 110.0], "llama.cpp": [200.0]}, single, arms, 64, 2, 3, 3)
    assert [row[1:] for row in table.rows] == [[100.0, 200.0, "0.50x"], [71.0, 100.0, "0.71x"], [150.0, 100.0, "1.50x"]]
    # the HTTP decode rate (after the first chunk) over the engine-alone run beside it in the
    # same alternation: 0.90, 0.95, 1.20 -> 0.95x; not the whole request's 71, nor the
    # medians of the two (90 / 100), nor the engine-alone phase's 100
    assert "speculation off: 0.95x (range 0.90-1.20" in table.notes[0]


def test_single_table_has_the_light_client_and_chunk_per_tick_rows_each_against_its_own_client():
    names = (vs.SPEC_OFF, vs.SPEC_OFF + vs.LIGHT, vs.UNPACED, vs.UNPACED + vs.LIGHT)
    arms = {name: vs.StreamArm("http://x", "m", 1, 64) for name in names}
    for name, rates in zip(names, ([80.0] * 3, [90.0] * 3, [95.0] * 3, [99.0] * 3), strict=True):
        arms[name].decode_rates = rates
    single = {vs.SPEC_OFF: [60.0] * 3, vs.SPEC_OFF + vs.LIGHT: [70.0] * 3, vs.UNPACED: [66.0] * 3,
              vs.UNPACED + vs.LIGHT: [77.0] * 3, vs.REFERENCE: [30.0] * 3, vs.REFERENCE + vs.LIGHT: [35.0] * 3,
              vs.ENGINE_BESIDE_HTTP: [100.0] * 3}
    table = vs._single_table({"speclane": [100.0]}, single, arms, 64, 2, 3, 3)
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["one streamed chat completion over HTTP (speculation off, light client)"] == [70.0, 35.0, "2.00x"]
    assert rows["one streamed chat completion over HTTP (speculation off, a chunk per tick)"] == \
        [66.0, 30.0, "2.20x"]
    assert rows["one streamed chat completion over HTTP (speculation off, a chunk per tick, light client)"] \
        == [77.0, 35.0, "2.20x"]
    for label, fraction in (("speculation off", "0.80x"), ("speculation off, light client", "0.90x"),
                            ("speculation off, a chunk per tick", "0.95x"),
                            ("speculation off, a chunk per tick, light client", "0.99x")):
        assert f"{label}: {fraction}" in table.notes[0]


def test_the_light_client_reads_a_servers_stream():
    """light_streams over a served event stream (httpx's mock transport): the usage's
    tokens, the first content chunk's time, the drafts; a stream without usage is an error."""
    import httpx

    from speclane.bench.http_streams import light_streams

    def events(usage: bool) -> bytes:
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
                  {"choices": [{"index": 0, "delta": {"content": " there"}}]}]
        if usage:
            chunks.append({"choices": [], "usage": {"completion_tokens": 2,
                                                    "speculative": {"draft_tokens": 4, "accepted_tokens": 1}}})
        return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, content=events(body["messages"][0]["content"] != "no usage"),
                              headers={"content-type": "text/event-stream"})

    results = light_streams("http://server", "m", ["a", "b"], 16, {"user": "t"}, transport=httpx.MockTransport(handler))
    assert [r.completion_tokens for r in results] == [2, 2] and [r.drafts for r in results] == [(4, 1), (4, 1)]
    assert all(r.started <= r.first_token <= r.finished for r in results)
    assert {b["messages"][0]["content"] for b in seen} == {"a", "b"}
    assert all(b["stream"] and b["max_tokens"] == 16 and b["user"] == "t" and b["temperature"] == 0 for b in seen)
    with pytest.raises(RuntimeError, match="no usage"):
        light_streams("http://server", "m", ["no usage"], 16, transport=httpx.MockTransport(handler))


def test_a_light_client_row_compares_with_llama_servers_light_client_row():
    names = (vs.SPEC_OFF, vs.REFERENCE, vs.SPEC_OFF + vs.LIGHT, vs.REFERENCE + vs.LIGHT)
    arms = {8: {name: vs.StreamArm("http://x", "m", 8, 64, light_client=name.endswith(vs.LIGHT)) for name in names}}
    for arm, ttft in zip(arms[8].values(), (0.05, 0.2, 0.04, 0.08), strict=True):
        arm.ttfts.append(ttft)
    rates = {8: dict(zip(names, ([400.0], [200.0], [480.0], [160.0]), strict=True))}
    rows = {row[1]: row for row in vs._streams_table(arms, rates, 64, 1).rows}
    assert rows[vs.SPEC_OFF][3] == "2.00x" and rows[vs.SPEC_OFF][5] == "0.25x"
    assert rows[vs.SPEC_OFF + vs.LIGHT][3] == "3.00x" and rows[vs.SPEC_OFF + vs.LIGHT][5] == "0.50x"
    assert arms[8][vs.REFERENCE + vs.LIGHT].send is vs.light_streams and arms[8][vs.REFERENCE].send is vs.concurrent_streams


def test_a_speclane_arm_records_the_engines_time_to_first_token_beside_the_clients(monkeypatch):
    readings = iter([{vs.TTFT_METRIC: (1.0, 10)}, {vs.TTFT_METRIC: (1.4, 18)}])  # before and after the run
    monkeypatch.setattr(vs, "histogram_totals", lambda url, names: next(readings))
    ours = vs.StreamArm("http://x", "m", 8, 64)
    results = [StreamResult(started=0.0, finished=1.0, completion_tokens=64, first_token=0.08) for _ in range(8)]
    ours.send = lambda *args: results
    ours()
    assert ours.ttfts == [pytest.approx(0.08)] and ours.engine_ttfts == [pytest.approx(0.05)]  # 0.4 s over 8 requests
    theirs = vs.StreamArm("http://y", "m", 8, 64, fresh_tenant=False)  # llama-server: no such metric
    theirs.send = lambda *args: results
    theirs()
    assert theirs.engine_ttfts == []
    rows = {row[1]: row for row in vs._streams_table({8: {vs.SPEC_OFF: ours, vs.REFERENCE: theirs}},
                                                     {8: {vs.SPEC_OFF: [400.0], vs.REFERENCE: [200.0]}}, 64, 1).rows}
    assert rows[vs.SPEC_OFF][6] == pytest.approx(0.05) and rows[vs.REFERENCE][6] == "-"


def test_histogram_totals_reads_a_histograms_sum_and_count(monkeypatch):
    text = ("# HELP speclane_time_to_first_token_seconds Arrival to first generated token.\n"
            "# TYPE speclane_time_to_first_token_seconds histogram\n"
            'speclane_time_to_first_token_seconds_bucket{le="0.1"} 3.0\n'
            'speclane_time_to_first_token_seconds_bucket{le="+Inf"} 4.0\n'
            "speclane_time_to_first_token_seconds_count 4.0\n"
            "speclane_time_to_first_token_seconds_sum 0.25\n")
    monkeypatch.setattr(httpx, "get", lambda url: httpx.Response(200, text=text))
    assert histogram_totals("http://x", [vs.TTFT_METRIC]) == {vs.TTFT_METRIC: (0.25, 4)}
    assert histogram_totals("http://x", ["speclane_other_seconds"]) == {}


def test_depth_runs_alternate_the_engine_and_llama_bench_at_each_depth_of_context(monkeypatch, tmp_path):
    from speclane.config import EngineConfig

    class FakeLLM:
        def __init__(self, config):
            self.config = config

        def encode_prompt(self, text, chat):
            assert not chat, "a plain-text context, as llama-bench's"
            return list(range(len(text.split())))

        def generate(self, prompts, sampling):
            return []

    engine_calls, bench_calls = [], []
    monkeypatch.setattr(vs, "LLM", FakeLLM)
    monkeypatch.setattr(vs, "engine_decode_rate", lambda llm, ids, tokens: (engine_calls.append((llm.config, len(ids), tokens)), 100.0)[1])
    monkeypatch.setattr(vs, "decode_rate", lambda binary, gguf, threads, tokens, repeats, depth, flash_attention:
                        (bench_calls.append((depth, tokens, flash_attention)), 40.0)[1])
    runs = vs._depth_runs(EngineConfig(), tmp_path / "llama-bench", tmp_path / "m.gguf", 2, 64, 2, (1024, 4096))
    assert [(n, tokens) for _, n, tokens in engine_calls] == [(1024, 64)] * 2 + [(4096, 64)] * 2  # the context: n tokens
    config = engine_calls[0][0]
    assert config.model.max_model_len >= 4096 + 64 and config.lane.spec_mode == "off"
    assert bench_calls == [(1024, 64, True)] * 2 + [(4096, 64, True)] * 2
    assert runs == {1024: {"speclane": [100.0, 100.0], "llama.cpp": [40.0, 40.0]},
                    4096: {"speclane": [100.0, 100.0], "llama.cpp": [40.0, 40.0]}}
    table = vs._depth_table(runs, tokens=64, threads=2, repeats=2)
    assert table.rows == [[1024, 100.0, 40.0, "2.50x"], [4096, 100.0, 40.0, "2.50x"]]
    assert "-p 0 -n 64 -t 2 -d n -fa 1" in table.notes[0] and "2 runs each" in table.notes[0]
    without = vs._depth_table({1024: {"speclane": [90.0]}}, tokens=64, threads=2, repeats=1)
    assert without.rows[0][2] == "not run"
