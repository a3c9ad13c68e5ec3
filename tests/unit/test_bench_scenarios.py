"""Benchmark scenarios and reports without the real model: definitions, plots, JSON.

- Workload definitions are fixed and reproducible (the fairness scenario's arrivals are
  committed constants; the simulator's workloads are seeded).
- The benchmark's lane policies are the simulator's three policies.
- Every plot is produced from synthetic data and is a real PNG, not an empty canvas.
- ``speclane bench hol`` runs end to end on a toy model (monkeypatched factory): its table,
  the engine counters that prove which path ran, the ITL CDF plot.
- report.json carries the ``calibration`` block that ``speclane simulate --calibrate`` reads.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from speclane.bench import cli as bench_cli
from speclane.bench import lane_scenarios as ls
from speclane.bench import plots
from speclane.bench.common import Table, classic_stream_gaps, stream_gaps, write_report
from speclane.bench.driver import Job, Timeline
from speclane.config import EngineConfig, LaneConfig
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams
from speclane.scheduler.lane import LaneEvent
from speclane.sim import plots as sim_plots
from speclane.sim.calibrate import fit, load_calibration
from speclane.sim.cost import CostModel
from speclane.sim.policies import lane_policies

MIN_PNG_BYTES = 10_000  # an empty 800x400 canvas is about 5 KB
VOCAB = 16


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > MIN_PNG_BYTES


class TextFactory:
    """Stands in for ``EngineFactory`` where a scenario only needs prompt ids."""

    def chat_ids(self, text: str) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text][:48]


class ToyFactory(TextFactory):
    """``EngineFactory`` over a toy model: engines with the scenario's lane options."""

    def __init__(self, config: EngineConfig):
        self.base = config.replace(dtype="float32", quantization="none", max_model_len=256, num_threads=1)
        self.tokenizer = toy_tokenizer(VOCAB)
        self.model = toy_model(toy_config(vocab_size=VOCAB), seed=2)

    def engine(self, **options: object) -> LLMEngine:
        return LLMEngine.from_parts(self.base.replace(**options), self.model, self.tokenizer)


# -- definitions ----------------------------------------------------------------------------
def test_fairness_workload_is_fixed_and_reproducible():
    first = ls.fairness_workload(TextFactory(), quick=False)
    again = ls.fairness_workload(TextFactory(), quick=False)
    assert [(j.request_id, j.arrival_s, j.options, j.sampling, j.prompt_token_ids) for j in first] == [
        (j.request_id, j.arrival_s, j.options, j.sampling, j.prompt_token_ids) for j in again]
    arrivals = {j.request_id: j.arrival_s for j in first}
    assert arrivals == {"A0": 0.0, "A1": 1.0, "A2": 3.0, "A3": 5.0, "B0": 1.5, "C0": 2.0,
                        "B1": 3.5, "C1": 4.0, "B2": 5.5, "C2": 6.0}
    assert Counter(j.options["tenant"] for j in first) == {"A": 4, "B": 3, "C": 3}
    assert max(first, key=lambda j: j.sampling.max_tokens).request_id == "A0"  # A streams long
    quick = ls.fairness_workload(TextFactory(), quick=True)
    assert [j.sampling.max_tokens for j in quick] == [j.sampling.max_tokens // 2 for j in first]
    assert all(j.sampling.ignore_eos for j in first), "fixed lengths: every run does the same work"


def test_bench_policies_are_the_simulators():
    sim = lane_policies(LaneConfig())
    bench = {name: LaneConfig(**options) for name, options in ls.POLICIES.items()}
    assert set(sim) == set(bench)
    for name, lane in bench.items():
        assert (lane.fairness, lane.spec_grant_rounds) == (sim[name].fairness, sim[name].spec_grant_rounds)


def test_every_scenario_of_the_issue_is_registered():
    assert {"speedup", "hol", "fairness", "priority", "throughput"} <= set(bench_cli.SCENARIOS)


# -- plots from synthetic data --------------------------------------------------------------
def _synthetic_lane_data() -> dict:
    timelines, events = {}, []
    for i, tenant in enumerate("AABBC"):
        rid = f"{tenant}{i}"
        job = Job(rid, [1, 2, 3], SamplingParams(max_tokens=8), arrival_s=0.2 * i, options={"tenant": tenant})
        timelines[rid] = Timeline(job, added_s=0.2 * i, added_clock=100.0 + 0.2 * i,
                                  token_times=[0.2 * i + 0.05 * k for k in range(40)], finished_s=0.2 * i + 2.0)
    t = 100.0
    for turn in range(12):
        rid = list(timelines)[turn % 5]
        events.append(LaneEvent(t, "grant", rid, rid[0], 0))
        t += 0.15
        events.append(LaneEvent(t, "preempt" if turn == 5 else "yield", rid, rid[0], 0))
    samples = [(0.1 * k, Counter({"A": k, "B": k // 2, "C": k // 3})) for k in range(30)]
    return {"timelines": timelines, "events": events, "clock0": 100.0, "samples": samples}


def test_lane_plots_from_synthetic_timelines(tmp_path):
    data = _synthetic_lane_data()
    assert _is_png(plots.lane_timeline(data, tmp_path / "timeline.png", title="synthetic"))
    assert _is_png(plots.lane_share_over_time(data, tmp_path / "share.png", title="synthetic"))


def test_itl_cdf_from_synthetic_gaps(tmp_path):
    gaps = {"no speculative stream": [0.03 + 0.001 * (i % 7) for i in range(200)],
            "slice": [0.032 + 0.002 * (i % 9) for i in range(200)],
            "burst": [0.03] * 190 + [1.5] * 10}
    assert _is_png(plots.itl_cdf(gaps, tmp_path / "itl.png", "synthetic"))


def test_simulator_plots_from_synthetic_data(tmp_path):
    waits = {"fair": [(16.0, i % 20) for i in range(300)], "hold": [(float("inf"), 5 * i) for i in range(300)]}
    assert _is_png(sim_plots.waits(waits, tmp_path / "waits.png", "synthetic"))
    shares = {"fair": [0.9 + 0.001 * i for i in range(200)], "hold": [0.1 * (1 + i % 30) for i in range(200)]}
    assert _is_png(sim_plots.lane_shares(shares, tmp_path / "shares.png", "synthetic"))


def test_gaps_of_classic_streams_only():
    assert stream_gaps([0.0, 0.1, 0.1, 0.3]) == pytest.approx([0.1, 0.2])
    classic = Timeline(Job("c", [1], SamplingParams(), options={"speculative": False}), token_times=[0.0, 0.5, 0.7])
    spec = Timeline(Job("s", [1], SamplingParams()), token_times=[0.0, 9.0])
    assert classic_stream_gaps({"c": classic, "s": spec}) == pytest.approx([0.5, 0.2])


# -- reports --------------------------------------------------------------------------------
def _decode_and_speedup_tables() -> tuple[Table, Table]:
    steps = Table("One decode step (forward + logits), KV length 200", ["batch", "ms/step", "tok/s"])
    for batch in (1, 4, 8, 16):
        steps.add(batch, 9.0 + 0.6 * batch, 0.0)
    speedup = Table("Single-stream speed-up, greedy, up to 128 new tokens", [
        "task", "speclane spec on tok/s", "spec off tok/s", "on/off", "acceptance", "tokens/round",
        "transformers assisted (prompt lookup 4) tok/s", "transformers plain tok/s", "on / assisted"])
    speedup.add("copy-heavy", 200.0, 100.0, "2.00x", "80%", "3.40", 50.0, 30.0, "4.00x")
    speedup.add("chat", 105.0, 100.0, "1.05x", "25%", "1.30", 31.0, 30.0, "3.39x")
    return steps, speedup


def test_bench_report_carries_calibration_for_simulate(tmp_path):
    steps, speedup = _decode_and_speedup_tables()
    config = EngineConfig.from_flat(lone_draft_tokens=4)  # the tables' rounds are of up to 4 drafts
    write_report(tmp_path / "decode", "speclane bench decode", [steps],
                 bench_cli._report_extra("decode", [steps], {}, config))
    write_report(tmp_path / "speedup", "speclane bench speedup", [speedup],
                 bench_cli._report_extra("speedup", [speedup], {}, config))
    saved = json.loads((tmp_path / "decode" / "report.json").read_text())
    assert saved["calibration"]["step_ms_by_batch"]["16"] == pytest.approx(18.6)
    assert saved["tables"][0]["title"].startswith("One decode step")  # the old fields stay
    cal = fit(load_calibration(tmp_path), CostModel(), num_draft_tokens=4, source=str(tmp_path))
    assert cal.cost.decode_token_ms == pytest.approx(0.6)
    assert cal.cost.base_ms == pytest.approx(10.0 - 0.6)  # the single-stream tick, less one token
    assert cal.cost.verify_row_ms > 0 and cal.acceptance_beta is not None
    assert bench_cli._report_extra("throughput", [], {}, config) == {}


def test_the_speedup_calibration_records_a_lone_requests_depth():
    """The speed-up runs one stream, so its rounds go as deep as a lone request's: simulate
    must read them as such (a K of 4 would make each round's acceptance look like 4 drafts')."""
    _, speedup = _decode_and_speedup_tables()
    config = EngineConfig()
    record = bench_cli._report_extra("speedup", [speedup], {}, config)["calibration"]
    assert record["num_draft_tokens"] == config.lane.lone_draft_tokens == 8
    assert config.lane.num_draft_tokens == 4


def test_calibration_reads_reports_written_before_the_block_existed(tmp_path):
    steps, speedup = _decode_and_speedup_tables()
    write_report(tmp_path, "speclane bench decode", [steps, speedup])  # no extra: an old report
    record = load_calibration(tmp_path / "report.json")
    assert set(record) == {"step_ms_by_batch", "speedup_tasks"}


def test_hol_scenario_end_to_end_on_a_toy_model(tmp_path, monkeypatch, capsys):
    threads = torch.get_num_threads()
    monkeypatch.setattr("speclane.bench.factory.EngineFactory", ToyFactory)
    args = argparse.Namespace(scenario="hol", quick=True, out=str(tmp_path))
    try:
        assert bench_cli.run_bench(args, EngineConfig().replace(num_threads=1)) == 0
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "hol"
    assert "Head-of-line" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    rows = {row[0]: row for row in report["tables"][0]["rows"]}
    assert set(rows) == {"no speculative stream", "5th stream, speculation off", "slice", "burst"}
    counters = report["counters"]
    assert counters["slice"]["slice_rounds"] > 0 and counters["slice"]["burst_rounds"] == 0
    assert counters["burst"]["burst_rounds"] > 0 and counters["burst"]["slice_rounds"] == 0
    assert counters["no speculative stream"]["slice_rounds"] == 0
    assert counters["5th stream, speculation off"]["slice_rounds"] == 0  # the fifth stream decoded classically
    assert rows["slice"][6] == counters["slice"]["slice_rounds"]  # the table shows the same counters
    assert _is_png(out / "itl-cdf.png")


def test_clients_resend_as_soon_as_an_answer_is_done_and_nothing_is_left_running():
    """``drive_clients_interleaved`` (the sustained-throughput table) on a real engine: a closed
    loop of clients over a window of the engine's ticks."""
    from speclane.bench.driver import drive_clients_interleaved

    engine = ToyFactory(EngineConfig()).engine(spec_mode="off")
    sent = []
    add = engine.add_request
    engine.add_request = lambda rid, *a, **k: (sent.append(rid), add(rid, *a, **k))[1]
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    busy = drive_clients_interleaved({"only": engine}, prompts, SamplingParams(max_tokens=3, ignore_eos=True), seconds=2.0)["only"]
    assert busy.seconds >= 2.0
    per_client = Counter(rid.split("-")[0] for rid in sent)
    assert set(per_client) == {"c0", "c1"} and min(per_client.values()) >= 3  # each resent after every answer
    finished = len(sent) - len(prompts)  # one request per client is still open at the window's end (aborted)
    assert busy.tokens >= 3 * finished
    assert not engine.has_unfinished() and engine.scheduler.kv.num_holders == 0


def test_throughput_runs_every_arm_at_once_with_their_ticks_interleaved_beside_an_a_a_arm(monkeypatch):
    """Every arm's engine gets its batch (then its clients) in the same interleaved run, so
    each ratio to speculation off is paired with the off engine's run beside it, and a second
    off engine shows the noise those ratios are read against."""
    from speclane.bench import engine_scenarios as es

    calls = []
    for name in ("drive_interleaved", "drive_clients_interleaved"):
        real = getattr(es, name)
        monkeypatch.setattr(es, name, lambda engines, *a, _real=real, _name=name, **k: (calls.append((_name, set(engines))), _real(engines, *a, **k))[1])
    closed, sustained = es.throughput(ToyFactory(EngineConfig()), quick=True, sustain_s=0.3)
    arms = {"lane on, adaptive K", "lane on, fixed K", "speculation off", es.OFF_AGAIN}
    assert calls == [("drive_interleaved", arms)] * 2 + [("drive_clients_interleaved", arms)]  # a warm-up, a run, clients
    for table in (closed, sustained):
        rows = {row[0]: row for row in table.rows}
        assert set(rows) == arms
        assert rows["speculation off"][4] == "1.00x" and all(row[1] > 0 for row in rows.values())
        assert "interleaved" in table.notes[0]
    closed_rows = {row[0]: row for row in closed.rows}
    assert closed_rows["lane on, fixed K"][5] > 0 and closed_rows[es.OFF_AGAIN][5] == 0  # the lane drafted; off did not


def test_priority_scenario_measures_a_preemption_against_waiting_out_the_grant():
    """The urgent request arrives while the holder holds the lane, whatever the machine's
    speed: preemption hands it the lane at the next round boundary; without preemption
    it waits for the rest of the holder's grant."""
    factory = ToyFactory(EngineConfig().replace(spec_adaptive_k=False))
    (table,) = ls.priority(factory, quick=True)
    rows = {row[0]: row for row in table.rows}
    on, off = rows["on"], rows["off (--no-spec-preempt)"]
    assert on[1] == off[1] == ls.HELD_ROUNDS  # the holder was mid-grant at the arrival
    assert on[2] == 1 and on[4] == 1  # granted at the next tick, by one preemption
    assert off[2] >= ls.GRANT_ROUNDS // 4 - ls.HELD_ROUNDS - 1 and off[4] == 0


def test_fair_lane_shares_count_only_ticks_where_every_tenant_waits():
    from speclane.bench.driver import Job, Timeline

    def timeline(tenant: str, start: float, end: float) -> Timeline:
        return Timeline(Job(f"{tenant}{start}", [1], SamplingParams(max_tokens=1), start, {"tenant": tenant}),
                        added_s=start, finished_s=end)

    timelines = {t.job.request_id: t for t in (timeline("A", 0.0, 10.0), timeline("B", 1.0, 3.0), timeline("C", 2.0, 4.0))}
    # A alone holds the lane until t=2, then the three take turns until B finishes at 3, then A and C.
    held = [(0.5, Counter()), (1.9, Counter(A=10)), (2.2, Counter(A=11, B=1)), (2.5, Counter(A=11, B=1, C=1)),
            (2.9, Counter(A=11, B=1, C=1)), (3.5, Counter(A=20, B=1, C=5))]
    assert ls._contended_rounds(held, timelines) == Counter(A=1, B=1, C=1)
    assert ls._shares(ls._contended_rounds(held, timelines)) == {"A": 1 / 3, "B": 1 / 3, "C": 1 / 3}
    assert ls._shares(ls._contended_rounds(held[:2], timelines)) == {}  # never all three
    # runs pool their rounds: a run where A held 3 and one where B held 1 share 3 : 1
    assert ls._shares(Counter(A=3) + Counter(B=1)) == {"A": 0.75, "B": 0.25}
