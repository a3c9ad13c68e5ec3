"""The simulator (``speclane simulate``): it must drive the real scheduler exactly as the
engine does, and its measurements must be reproducible.

The central test runs one small scenario both ways: the real engine (toy model, real
runner and verification, a drafter that proposes exactly as many correct tokens as a
script says) and the simulator (cost-model runner, the same script as its acceptance
source), with arrivals in ticks and a clock that advances one unit per tick. Both must
make the same lane decisions at the same ticks and end with the same counters. The rest
checks the fake runner against the runner's contract, seeded workloads, the bounds on a
small run, the calibration fit and the command's outputs.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

import pytest
import torch

from speclane.bench.calibration_record import calibration_record
from speclane.config import EngineConfig, LaneConfig, SchedulerConfig
from speclane.drafters.base import Draft
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import Request, SamplingParams
from speclane.scheduler.plan import ScheduledSeq, SchedulerPlan
from speclane.sim.acceptance import RateAcceptance, ScriptedAcceptance
from speclane.sim.bounds import jain
from speclane.sim.calibrate import fit, per_position_rate
from speclane.sim.cost import CostModel
from speclane.sim.experiment import Setup, run_policies, run_policy
from speclane.sim.policies import lane_policies
from speclane.sim.runner import CostModelRunner
from speclane.sim.simulator import Simulator
from speclane.sim.workload import SimJob, Tenant, WorkloadSpec, arrival_rate, make_workload

VOCAB = 16
K = 3
MAX_MODEL_LEN = 64
ONE_TICK = CostModel(base_ms=1000.0, decode_token_ms=0.0, prefill_token_ms=0.0, verify_row_ms=0.0)


# -- the scenario, run both ways ----------------------------------------------------------
@dataclass(frozen=True)
class Story:
    rid: str
    tenant: str
    priority: int
    arrival_tick: int
    num_prompt_tokens: int
    max_tokens: int
    speculative: bool = True


STORIES = [
    Story("a0", "A", 0, 0, 5, 40),
    Story("a1", "A", 0, 0, 11, 18),  # two ticks of prefill at 8 tokens per tick
    Story("b0", "B", 0, 1, 6, 16),
    Story("c0", "C", 0, 2, 4, 14, speculative=False),
    Story("a2", "A", 0, 3, 7, 12),
    Story("u0", "C", -1, 9, 5, 10),  # urgent: preempts whoever holds the lane
    Story("b1", "B", 0, 12, 9, 20),
    Story("d0", "D", 0, 14, 6, 10),  # waits for a KV slot (4 running at most)
]


def _script(seed: int = 7) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {s.rid: [rng.randint(0, K) for _ in range(s.max_tokens)] for s in STORIES}


def _prompt(story: Story) -> list[int]:
    return [1 + (i * 7 + len(story.rid)) % (VOCAB - 1) for i in range(story.num_prompt_tokens)]


def _engine_config(**lane: object) -> EngineConfig:
    # Fixed K: the simulator's scheduler has no measured step cost (its cost model is in
    # ticks), so adaptive K would make the real engine draft differently from it. No prefix
    # cache: the simulator's jobs have token counts, not tokens, and the stories' prompts
    # share their first tokens, which the real engine would read from the cache.
    return EngineConfig().replace(dtype="float32", quantization="none", max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                                  max_num_batched_tokens=8, num_draft_tokens=K, drafter="ngram",
                                  spec_adaptive_k=False, prefix_cache=False, **lane)


class ScriptedDrafter:
    """Proposes the target's own next ``script[i]`` tokens (known from a classic run),
    then wrong ones: greedy verification accepts exactly ``min(script[i], k)``."""

    name = "scripted"
    needs_hidden_states = False

    def __init__(self, reference: dict[str, list[int]], script: dict[str, list[int]]):
        self.reference = reference
        self.script = script
        self.rounds: dict[str, int] = {}

    def propose(self, request: Request, k: int, may_seed: bool = True) -> Draft:
        rid = request.request_id
        i = self.rounds.get(rid, 0)
        self.rounds[rid] = i + 1
        accepted = min(self.script[rid][i], k)
        pos = request.num_output_tokens
        ref = self.reference[rid]
        drafts = ref[pos : pos + accepted]
        drafts += [(ref[pos + accepted] + 1) % VOCAB] if accepted < k else []
        drafts += [1] * (k - len(drafts))
        return Draft(drafts)

    def finish(self, request: Request) -> None:
        pass

    def release(self, request_id: str) -> None:
        pass


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy forward is tiny; OpenMP threads only add jitter on a shared machine
    yield toy_model(toy_config(vocab_size=VOCAB), seed=5)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(model) -> dict[str, list[int]]:
    """Each request's greedy continuation, from a classic (speculation off) engine."""
    engine = LLMEngine.from_parts(_engine_config(spec_mode="off"), model, toy_tokenizer(VOCAB))
    for s in STORIES:
        engine.add_request(s.rid, _prompt(s), SamplingParams(max_tokens=s.max_tokens, ignore_eos=True))
    tokens: dict[str, list[int]] = {s.rid: [] for s in STORIES}
    for out in engine.run_until_done():
        tokens[out.request_id].extend(out.token_ids)
    return tokens


def _run_engine(model, reference, config: EngineConfig, script):
    clock = [0.0]
    engine = LLMEngine.from_parts(config, model, toy_tokenizer(VOCAB), drafter=ScriptedDrafter(reference, script),
                                  clock=lambda: clock[0])
    execute = engine.runner.execute

    def execute_and_tick(plan):  # each forward takes one clock unit (ONE_TICK's cost model)
        result = execute(plan)
        clock[0] += 1.0
        return result

    engine.runner.execute = execute_and_tick
    pending = sorted(STORIES, key=lambda s: s.arrival_tick)
    final = {}
    while pending or engine.has_unfinished():
        while pending and pending[0].arrival_tick <= clock[0]:
            s = pending.pop(0)
            engine.add_request(s.rid, _prompt(s), SamplingParams(max_tokens=s.max_tokens, ignore_eos=True),
                               priority=s.priority, tenant=s.tenant, speculative=s.speculative)
        if not engine.has_unfinished():
            clock[0] = float(pending[0].arrival_tick)
            continue
        for out in engine.step():
            if out.finished:
                final[out.request_id] = (out.completion_tokens, out.speculative)
    return engine, final


def _run_sim(config: EngineConfig, script):
    jobs = [SimJob(s.rid, float(s.arrival_tick), Tenant(s.tenant, 1.0, s.priority), s.num_prompt_tokens,
                   s.max_tokens, s.speculative, 0.0, s.priority) for s in STORIES]
    sim = Simulator(config.scheduler, config.lane, MAX_MODEL_LEN, ONE_TICK, ScriptedAcceptance(script),
                    keep_events=True)
    return sim.run(jobs)


POLICY_OPTIONS = {
    "fair lane": dict(fairness="tenant", spec_grant_rounds=2),
    "round-robin": dict(fairness="request", spec_grant_rounds=2),
    "hold": dict(fairness="request", spec_grant_rounds=0),
    "burst": dict(spec_mode="burst", spec_grant_rounds=0),
}


@pytest.mark.parametrize("policy", list(POLICY_OPTIONS))
def test_simulator_makes_the_real_engines_lane_decisions(model, reference, policy):
    config = _engine_config(**POLICY_OPTIONS[policy])
    script = _script()
    engine, final = _run_engine(model, reference, config, script)
    sim = _run_sim(config, script)

    real_events = [(e.time_s, e.kind, e.request_id) for e in engine.scheduler.lane.events]
    sim_events = [(e.time_s, e.kind, e.request_id) for e in sim.lane_events]
    assert sim_events == real_events
    assert sum(kind == "grant" for _, kind, _ in real_events) >= 3, "the scenario must exercise the lane"
    if policy in ("fair lane", "round-robin"):
        assert {"yield", "preempt"} <= {kind for _, kind, _ in real_events}

    sim_final = {r.request_id: (r.num_output_tokens, r.spec.as_dict()) for r in sim.records}
    assert sim_final == final  # tokens, rounds, drafts, accepted, grants, yields, preemptions, wait_ms
    c = engine.counters
    assert (sim.slice_rounds, sim.burst_rounds, sim.draft_tokens, sim.accepted_tokens) == (
        c.slice_rounds, c.burst_rounds, c.draft_tokens, c.accepted_tokens)
    assert (sim.burst_rounds > 0) == (policy == "burst") and (sim.slice_rounds > 0) == (policy != "burst")


# -- the fake runner on its own ------------------------------------------------------------
def _seq(request: Request, start: int, tokens: tuple[int, ...], sample: bool, k: int = 0) -> ScheduledSeq:
    return ScheduledSeq(request=request, block_table=(0,), start=start, token_ids=tokens, sample=sample, num_draft_tokens=k)


def test_runner_fills_results_as_the_model_runner_does():
    req = Request("r", [1] * 10, SamplingParams(max_tokens=20))
    runner = CostModelRunner(CostModel(base_ms=2, decode_token_ms=1, prefill_token_ms=0.5, verify_row_ms=3),
                             ScriptedAcceptance({"r": [2]}))
    chunk = runner.execute(SchedulerPlan(seqs=(_seq(req, 0, (1,) * 8, sample=False),)))
    assert chunk.seqs[0].token_ids == () and chunk.seqs[0].num_draft_tokens == 0
    assert chunk.elapsed_ms == 2 + 0.5 * 8
    last = runner.execute(SchedulerPlan(seqs=(_seq(req, 8, (1, 1), sample=True),)))
    assert len(last.seqs[0].token_ids) == 1 and last.seqs[0].num_accepted_tokens == 0
    req.num_computed_tokens = 10
    req.output_token_ids.append(1)
    spec = runner.execute(SchedulerPlan(seqs=(_seq(req, 10, (1,), sample=True, k=4),)))
    res = spec.seqs[0]
    # 2 of 4 drafts accepted: 3 new tokens (the accepted drafts and the target's own).
    assert (len(res.token_ids), res.num_accepted_tokens, res.num_draft_tokens) == (3, 2, 4)
    assert spec.elapsed_ms == 2 + 1 * 5 + 3


def test_rate_acceptance_gives_each_request_its_own_stream():
    a = RateAcceptance({"x": 0.7, "y": 0.7}, seed=3)
    b = RateAcceptance({"x": 0.7, "y": 0.7}, seed=3)
    xs = [a.accepted("x", 4) for _ in range(50)]
    for _ in range(17):  # interleaving another request does not shift x's stream
        b.accepted("y", 4)
    assert [b.accepted("x", 4) for _ in range(50)] == xs
    assert 0 < sum(xs) < 50 * 4


# -- workloads ------------------------------------------------------------------------------
def test_workload_is_seeded_and_reproducible():
    spec = WorkloadSpec(num_requests=500, num_tenants=50)
    a, b = make_workload(spec, 1, rate_per_s=3.0), make_workload(spec, 1, rate_per_s=3.0)
    assert a == b
    assert make_workload(spec, 2, rate_per_s=3.0) != a
    arrivals = [j.arrival_s for j in a]
    assert arrivals == sorted(arrivals) and len({j.request_id for j in a}) == 500
    counts = {}
    for j in a:
        counts[j.tenant.name] = counts.get(j.tenant.name, 0) + 1
        assert spec.prompt_range[0] <= j.num_prompt_tokens <= spec.prompt_range[1]
        assert spec.output_range[0] <= j.max_tokens <= spec.output_range[1]
        assert 0 < j.acceptance_rate < 1 and j.priority == j.tenant.priority
    assert max(counts, key=counts.get) == "t0000"  # Zipf: the first tenant is the heaviest
    assert a[0].tenant.priority == 0 or a[0].tenant.name != "t0000"
    assert 450 / 3.0 < arrivals[-1] < 550 / 3.0  # Poisson at 3 requests/s


def test_arrival_rate_follows_the_load():
    spec, cost = WorkloadSpec(), CostModel()
    assert arrival_rate(WorkloadSpec(load=0.5), cost, 16) == pytest.approx(arrival_rate(spec, cost, 16) * 0.5 / spec.load)
    assert arrival_rate(WorkloadSpec(rate_per_s=4.0), cost, 16) == 4.0
    with pytest.raises(ValueError, match="requests"):
        WorkloadSpec(num_requests=0)


# -- bounds on a small run --------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_outcomes():
    spec = WorkloadSpec(num_requests=400, num_tenants=40, prompt_median=64, output_median=48)
    cost = CostModel()
    jobs = make_workload(spec, 0, arrival_rate(spec, cost, 16))
    setup = Setup(SchedulerConfig(), MAX_MODEL_LEN * 16, cost, seed=0)
    return jobs, run_policies(lane_policies(LaneConfig()), jobs, setup, workers=1)


def test_bounds_hold_on_a_small_run(small_outcomes):
    _, outcomes = small_outcomes
    by_slug = {o.policy.split(" ")[0]: o for o in outcomes}
    for o in outcomes:
        b = o.bounds
        assert len(o.result.records) == 400
        assert b.wc_violations == 0 and b.wc_checked == o.result.ticks
        assert b.membership_mismatches == 0
        assert b.max_overrun == 0
        assert len(b.waits) > 100
        assert o.result.burst_rounds == 0 and o.result.slice_rounds > 0
    # Round-robin is FIFO within a priority: the W x budget promise holds for every clean wait.
    assert by_slug["round-robin"].bounds.wait_violations(clean_only=True) == 0
    # Holding for a whole generation shares the lane worst.
    assert by_slug["hold"].bounds.jain < by_slug["fair"].bounds.jain
    assert by_slug["hold"].result.lane_yields == 0


def test_simulation_is_deterministic(small_outcomes):
    jobs, outcomes = small_outcomes
    setup = Setup(SchedulerConfig(), MAX_MODEL_LEN * 16, CostModel(), seed=0)
    name, lane = next(iter(lane_policies(LaneConfig()).items()))
    again = run_policy(name, lane, jobs, setup)
    first = outcomes[0]
    assert again.result.ticks == first.result.ticks
    assert [(r.request_id, r.finished_s, r.spec.as_dict()) for r in again.result.records] == [
        (r.request_id, r.finished_s, r.spec.as_dict()) for r in first.result.records]
    assert again.bounds.jain == first.bounds.jain


def test_jain_index():
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


# -- calibration ------------------------------------------------------------------------------
def test_calibration_recovers_a_known_cost_model():
    truth = CostModel(base_ms=10.0, decode_token_ms=0.5, verify_row_ms=6.0)
    steps = {"title": "One decode step (forward + logits), KV length 200", "columns": ["batch", "ms/step", "tok/s"],
             "rows": [[b, truth.step_ms(decode_tokens=b), 0.0] for b in (1, 4, 8, 16)]}
    off_tick = truth.step_ms(decode_tokens=1)
    on_tick = truth.step_ms(decode_tokens=1 + 4, verify_rows=1)
    rows = [[task, tpr * 1000 / on_tick, 1000 / off_tick, "x", f"{acc:.0%}", f"{tpr:.2f}", 0, 0, "x"]
            for task, acc, tpr in (("copy", 0.8, 3.5), ("code", 0.6, 2.8), ("chat", 0.3, 1.6))]
    speedup = {"title": "Single-stream speed-up, greedy, up to 128 new tokens", "columns": [
        "task", "speclane spec on tok/s", "spec off tok/s", "on/off", "acceptance", "tokens/round", "a", "b", "c"],
        "rows": rows}
    record = calibration_record("", [steps, speedup], num_draft_tokens=4)
    cal = fit(record, CostModel(), num_draft_tokens=4)
    assert cal.cost.decode_token_ms == pytest.approx(0.5, rel=1e-6)
    assert cal.cost.base_ms == pytest.approx(10.0, rel=1e-3)
    assert cal.cost.verify_row_ms == pytest.approx(6.0, rel=1e-2)
    a, b = cal.acceptance_beta
    assert 0.3 < a / (a + b) < 0.9
    assert calibration_record("hol", [steps]) == {}


def test_per_position_rate_inverts_leading_run_acceptance():
    for rate in (0.2, 0.5, 0.9):
        fraction = sum(rate ** i for i in range(1, 5)) / 4
        assert per_position_rate(fraction, 4) == pytest.approx(rate, abs=1e-6)


# -- the command ------------------------------------------------------------------------------
def test_simulate_command_writes_report_and_plots(tmp_path, capsys):
    from speclane import config as cfg
    from speclane.sim.cli import run_simulate

    args = argparse.Namespace(out=str(tmp_path), requests=150, tenants=15, seed=4, calibrate=None)
    assert run_simulate(args, cfg.EngineConfig()) == 0
    printed = capsys.readouterr().out
    assert "Lane bounds" in printed and "fair lane" in printed and "hold" in printed
    report = (tmp_path / "report.md").read_text()
    assert "Jain" in report and "waits.png" in report
    for name in ("waits.png", "lane-share.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    assert (tmp_path / "report.json").stat().st_size > 1_000


def test_simulate_rejects_a_report_without_calibration_data(tmp_path):
    from speclane import config as cfg
    from speclane.sim.cli import run_simulate

    (tmp_path / "report.json").write_text('{"name": "x", "tables": []}')
    args = argparse.Namespace(out=str(tmp_path / "o"), requests=10, tenants=2, seed=0, calibrate=str(tmp_path))
    with pytest.raises(ValueError, match="calibrate"):
        run_simulate(args, cfg.EngineConfig())
