"""The benchmarks' runs are each a new tenant: the same prompts sent run after run must not
draft from an earlier run's answers (the suffix drafter's source is its tenant's recent
outputs). In-process runs do not read an earlier run's prompts from the prefix cache either;
speclane's HTTP runs share them (``cache_scope: "global"``), as llama-server's slots keep theirs."""

from __future__ import annotations

from speclane.bench import vs_llama_cpp as vs
from speclane.bench.driver import Job, drive, drive_clients
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


def test_a_closed_loop_client_never_shares_a_tenant_with_its_earlier_requests():
    engine = RecordingEngine()
    drive_clients(engine, [[1], [2]], SamplingParams(max_tokens=1), seconds=0.05)
    tenants = [options["tenant"] for options in engine.options.values()]
    assert len(tenants) > 2 and len(set(tenants)) == len(tenants)


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
