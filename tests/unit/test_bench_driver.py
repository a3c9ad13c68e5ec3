"""The benchmarks' runs are each a new tenant: the same prompts sent run after run must not
draft from an earlier run's answers (the suffix drafter's source is its tenant's recent
outputs). In-process runs do not read an earlier run's prompts from the prefix cache either;
speclane's HTTP runs share them (``cache_scope: "global"``), as llama-server's slots keep theirs."""

from __future__ import annotations

import pytest

from speclane.bench import vs_llama_cpp as vs
from speclane.bench.driver import Job, drive
from speclane.bench.http_streams import new_tenant
from speclane.engine.engine import RequestOutput
from speclane.request import SamplingParams


class RecordingEngine:
    """Answers every request with one token at the next step, and records its options."""

    def __init__(self) -> None:
        self.options: dict[str, dict] = {}
        self.running: list[str] = []

    def add_request(self, request_id, prompt_token_ids, sampling, **options) -> None:
        self.options[request_id] = options
        self.running.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.running)

    def step(self) -> list[RequestOutput]:
        done, self.running = self.running, []
        return [RequestOutput(request_id=rid, text="x", token_ids=[1], finished=True, finish_reason="length",
                              prompt_tokens=1, completion_tokens=1)
                for rid in done]

    def abort_request(self, request_id: str) -> None:
        self.running.remove(request_id)

    def run_until_done(self) -> list[RequestOutput]:
        return self.step()

    def clock(self) -> float:
        return 0.0


def test_each_drive_is_a_tenant_of_its_own_and_a_named_tenant_is_kept():
    engine = RecordingEngine()
    sampling = SamplingParams(max_tokens=1)
    for run in range(2):
        drive(engine, [Job(f"a{run}", [1], sampling), Job(f"b{run}", [1], sampling),
                       Job(f"named{run}", [1], sampling, options={"tenant": "A"})])
    tenants = {rid: options["tenant"] for rid, options in engine.options.items()}
    assert tenants["a0"] == tenants["b0"] != tenants["a1"] == tenants["b1"]  # one run's jobs together
    assert tenants["named0"] == tenants["named1"] == "A"


def test_http_runs_of_speclane_carry_a_new_user_and_llama_cpps_none():
    first, second = new_tenant({"speculative": False}), new_tenant()
    assert first["speculative"] is False and first["user"] != second["user"]
    assert first["cache_scope"] == second["cache_scope"] == "global", "prompts cached across runs, as llama-server's"
    ours = vs.StreamArm("http://x", "m", 8, 64, {"speculative": False})
    assert ours.request_extra()["user"] != ours.request_extra()["user"]
    theirs = vs.StreamArm("http://y", "m", 8, 64, fresh_tenant=False)
    assert theirs.request_extra() is None


def test_cold_arms_ask_for_prompts_no_cache_holds():
    ours = vs.StreamArm("http://x", "m", 8, 64, {"speculative": False}, cold=True)
    first, second = ours.request_extra(), ours.request_extra()
    assert first["speculative"] is False and first["user"] != second["user"]
    assert "cache_scope" not in first, "a new tenant's own part of the prefix cache: empty"
    theirs = vs.StreamArm("http://y", "m", 8, 64, vs.COLD_LLAMA_SERVER, fresh_tenant=False, cold=True)
    assert theirs.request_extra() == {"cache_prompt": False}
    assert vs.same_client_reference(vs.SPEC_OFF + vs.COLD) == vs.REFERENCE + vs.COLD
    assert vs.same_client_reference(vs.SPEC_OFF + vs.LIGHT) == vs.REFERENCE + vs.LIGHT
    assert vs.same_client_reference(vs.SPEC_OFF) == vs.REFERENCE


class FakeClock:
    """The driver's perf_counter: it moves only when a fake engine's tick costs time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class CostlyEngine(RecordingEngine):
    """Every running request gets a token per tick; a request finishes after ``length``
    tokens; each tick costs ``tick_s`` of the fake clock and is logged by name."""

    def __init__(self, name: str, tick_s: float, clock: FakeClock, log: list[str], length: int = 3) -> None:
        super().__init__()
        self.name, self.tick_s, self.clock_, self.log, self.length = name, tick_s, clock, log, length
        self.tokens: dict[str, int] = {}

    def step(self) -> list[RequestOutput]:
        self.clock_.now += self.tick_s
        self.log.append(self.name)
        outputs = []
        for rid in list(self.running):
            self.tokens[rid] = self.tokens.get(rid, 0) + 1
            finished = self.tokens[rid] == self.length
            if finished:
                self.running.remove(rid)
            outputs.append(RequestOutput(request_id=rid, text="x", token_ids=[1], finished=finished,
                                         finish_reason="length" if finished else None, prompt_tokens=1, completion_tokens=1))
        return outputs

    def run_until_done(self) -> list[RequestOutput]:
        self.running = []
        return []


def test_interleaved_engines_tick_in_turn_and_each_rate_counts_its_own_ticks_only(monkeypatch):
    from speclane.bench import driver

    clock, log = FakeClock(), []
    monkeypatch.setattr(driver, "time", clock)
    engines = {"fast": CostlyEngine("fast", 0.010, clock, log, length=4),
               "slow": CostlyEngine("slow", 0.030, clock, log, length=8)}
    sampling = SamplingParams(max_tokens=8)
    jobs = {name: [Job(f"{name}-{i}", [1], sampling) for i in range(2)] for name in engines}
    busy = driver.drive_interleaved(engines, jobs)
    assert (busy["fast"].tokens, busy["slow"].tokens) == (8, 16)
    # Rates from each engine's own ticks: 4 ticks of 10 ms, 8 of 30 ms, whatever ran between.
    assert busy["fast"].seconds == pytest.approx(0.040) and busy["slow"].seconds == pytest.approx(0.240)
    assert busy["fast"].rate == pytest.approx(200.0) and busy["slow"].rate == pytest.approx(16 / 0.24)
    # A round ticks each engine with work once: while both run, neither gets two rounds ahead.
    for end in range(1, 2 * 4 + 1):
        counts = [log[:end].count(name) for name in engines]
        assert abs(counts[0] - counts[1]) <= 1, log
    assert log[8:] == ["slow"] * 4, "the engine left with work ticks alone"
    assert len({options["tenant"] for options in engines["fast"].options.values()}) == 1
    assert engines["fast"].options["fast-0"]["tenant"] != engines["slow"].options["slow-0"]["tenant"]


def test_interleaved_clients_stop_each_engine_at_its_own_ticks_window(monkeypatch):
    from speclane.bench import driver

    clock, log = FakeClock(), []
    monkeypatch.setattr(driver, "time", clock)
    # Ticks of 1/64 s and 1/32 s, a window of 10/64 s: sums exact in binary.
    engines = {"a": CostlyEngine("a", 1 / 64, clock, log), "b": CostlyEngine("b", 1 / 32, clock, log)}
    busy = driver.drive_clients_interleaved(engines, [[1], [2]], SamplingParams(max_tokens=3), seconds=10 / 64)
    assert (log.count("a"), log.count("b")) == (10, 5), "each engine ticks until its own ticks took the window"
    assert (busy["a"].tokens, busy["b"].tokens) == (20, 10)  # two clients, a token each a tick
    assert busy["a"].rate == pytest.approx(128.0) and busy["b"].rate == pytest.approx(64.0)
    tenants = [options["tenant"] for engine in engines.values() for options in engine.options.values()]
    assert len(tenants) > 4 and len(set(tenants)) == len(tenants), "every request a tenant of its own"
    assert not any(engine.running for engine in engines.values()), "what ran past the window was aborted"
