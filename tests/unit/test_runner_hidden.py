"""The runner's hand-off of hidden states (``HiddenObserver.observe_tick``): one call per
forward, every request's kept positions in order, rejected drafts never shown. A toy model,
the suffix drafter (whose drafts it rejects now and then), against speculation off."""

from __future__ import annotations

from dataclasses import replace

import torch

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine
from speclane.models.toy import toy_config, toy_model, toy_tokenizer
from speclane.request import SamplingParams
from speclane.training.capture import HiddenRecorder

VOCAB = 16
PROMPTS = {"a": [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], "b": [5, 6, 5, 6, 5, 6, 2], "c": [9, 8, 7]}


def recorded(spec_mode: str) -> tuple[dict[str, torch.Tensor], int, int, LLMEngine]:
    config = EngineConfig().replace(dtype="float32", quantization="none", max_model_len=256, num_threads=1,
                                    spec_mode=spec_mode, drafter="suffix", spec_adaptive_k=False, prefix_cache=False)
    engine = LLMEngine.from_parts(config, toy_model(toy_config(vocab_size=VOCAB), seed=2), toy_tokenizer(VOCAB))
    if engine.runner.drafter is not None:
        engine.runner.drafter.params = replace(engine.runner.drafter.params, max_resync=3)  # resynchronised drafts: some rejected
    recorder, calls, forwards = HiddenRecorder(), [0], [0]
    observe_tick = recorder.observe_tick

    def counted(spans, hidden):
        calls[0] += 1
        observe_tick(spans, hidden)

    recorder.observe_tick = counted
    engine.runner.hidden_observers.append(recorder)
    execute = engine.runner.execute

    def execute_counted(plan):
        forwards[0] += bool(plan.seqs)
        return execute(plan)

    engine.runner.execute = execute_counted
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return {rid: recorder.pop(rid) for rid in PROMPTS}, calls[0], forwards[0], engine


def test_every_kept_position_once_in_order_in_one_call_per_forward():
    spec, calls, forwards, engine = recorded("slice")
    off, _, _, _ = recorded("off")
    assert engine.counters.draft_tokens > engine.counters.accepted_tokens > 0  # drafts kept and rejected
    assert calls == forwards
    for rid, prompt in PROMPTS.items():
        # The recorder raises on a gap or a repeat; every computed position is there: the
        # prompt and the output but its last token.
        assert spec[rid].shape[0] == off[rid].shape[0] == len(prompt) + 12 - 1
        torch.testing.assert_close(spec[rid], off[rid], atol=2e-2, rtol=0)  # bfloat16 copies of the same states


def test_a_trees_kept_branch_and_a_chains_accepted_prefix_are_the_rows_handed_on():
    """``_share_hidden`` alone: a chain keeps its fed token and accepted drafts (a prefix of
    its rows), a draft tree its fed token and the accepted branch's nodes (rows by index);
    the observer gets one tensor of those rows, in order, and each request's span."""
    from types import SimpleNamespace

    from speclane.engine.runner import ModelRunner

    seen = []
    runner = ModelRunner.__new__(ModelRunner)
    runner.hidden_observers = [SimpleNamespace(observe_tick=lambda spans, hidden: seen.append((spans, hidden)))]
    a, b, c = (SimpleNamespace(request=SimpleNamespace(request_id=rid), start=start) for rid, start in
               (("a", 10), ("b", 20), ("c", 0)))
    hidden = torch.arange(11.0).unsqueeze(1).repeat(1, 3)  # row i holds i
    # a: 1 fed + 3 drafts, 2 accepted; b: 1 fed + a tree of 4 nodes, branch 0 -> 2 kept; c: a 3-token chunk
    runner._share_hidden([a, b, c], [[5, 6, 7, 8], [1, 2, 3, 4, 5], [1, 2]], [3, [0, 1, 3], 2], hidden)
    ((spans, tick),) = seen
    assert [(s[0].request_id, s[1], s[2], s[3]) for s in spans] == [("a", 10, 0, 3), ("b", 20, 3, 3), ("c", 0, 6, 2)]
    assert tick[:, 0].tolist() == [0, 1, 2, 4, 5, 7, 9, 10]
    seen.clear()
    runner._share_hidden([c], [[1, 2, 3]], [3], hidden[:3])  # every row kept: the forward's own tensor
    assert seen[0][1].data_ptr() == hidden.data_ptr()  # no gather
