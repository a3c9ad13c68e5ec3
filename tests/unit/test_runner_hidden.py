"""The runner's hand-off of hidden states (``HiddenObserver.observe_tick``): one call per
forward, every request's kept positions in order, rejected drafts never shown. A toy model,
the suffix drafter (whose drafts it rejects now and then), against speculation off."""

from __future__ import annotations

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
