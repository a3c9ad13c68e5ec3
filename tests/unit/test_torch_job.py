"""A head trained where the target runs in transformers (``training.torch_job``): the
transformers target is our model's target (same GGUF, same hidden states and greedy
text), its batched answers are each prompt's own, and a job runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.unit.gguf_files import forward, write_llama

from speclane.config import ModelConfig
from speclane.models.build import build_model
from speclane.models.loader import read_gguf
from speclane.models.mtp_store import CONFIG, WEIGHTS
from speclane.training import torch_job
from speclane.training.prompts import FOLLOW_UPS
from speclane.training.torch_target import TorchTarget

pytest.importorskip("transformers")  # the target's runtime (imported when a target loads)

LAYERS = [("F32",) * 7, ("Q8_0",) * 7]
PROMPTS = [[3, 17, 42, 5], [9, 9, 1, 30, 2, 14, 60], [7], [11, 12, 13, 14, 15]]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("torch-job") / "tiny.gguf", LAYERS)


@pytest.fixture(scope="module")
def target(tiny_gguf) -> TorchTarget:
    return TorchTarget.from_gguf(tiny_gguf, "cpu")


def quiet(_: str) -> None:
    pass


def test_transformers_target_has_our_models_hidden_states_and_greedy_text(tiny_gguf, target):
    ours = build_model(read_gguf(tiny_gguf, None), ModelConfig(dtype="float32", quantization="none", kernels="torch"))
    answer = target.answer([PROMPTS[0]], 6, stop_ids=[], batch_size=1, log=quiet)[0]
    text = PROMPTS[0] + answer
    [sample] = target.samples([text], [len(PROMPTS[0])], batch_size=1)
    hidden, logits = forward(ours, text)
    assert sample.hidden.shape == (len(text) - 1, hidden.shape[1])
    assert torch.allclose(sample.hidden.float(), hidden[:-1], rtol=2e-2, atol=2e-2)  # bfloat16 copies
    # Each answer token is our model's greedy choice after the tokens before it.
    assert logits[len(PROMPTS[0]) - 1 : -1].argmax(-1).tolist() == answer


def test_batched_answers_are_each_prompts_own(target):
    batched = target.answer(PROMPTS, 8, stop_ids=[], batch_size=len(PROMPTS), log=quiet)
    alone = [target.answer([p], 8, stop_ids=[], batch_size=1, log=quiet)[0] for p in PROMPTS]
    assert batched == alone
    assert all(len(a) == 8 for a in batched)
    samples = target.samples([p + a for p, a in zip(PROMPTS, batched, strict=True)], [len(p) for p in PROMPTS], 4)
    for p, a, s in zip(PROMPTS, batched, samples, strict=True):
        [single] = target.samples([p + a], [len(p)], 1)
        assert s.token_ids == p + a and s.num_prompt_tokens == len(p)
        assert torch.allclose(s.hidden.float(), single.hidden.float(), atol=2e-2)


def test_an_answer_ends_at_its_first_stop_token_and_keeps_it(target):
    free = target.answer([PROMPTS[1]], 8, stop_ids=[], batch_size=1, log=quiet)[0]
    stop = free[2]
    stopped = target.answer([PROMPTS[1]], 8, stop_ids=[stop], batch_size=1, log=quiet)[0]
    assert stopped == free[: free.index(stop) + 1]


def test_no_batch_begins_after_the_deadline(target):
    assert target.answer(PROMPTS, 4, stop_ids=[], batch_size=2, log=quiet, deadline=0.0) == [[] for _ in PROMPTS]


def test_a_job_answers_follow_ups_caps_its_epochs_and_writes_a_head(tiny_gguf, target, tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "model.gguf").symlink_to(tiny_gguf)
    answers = target.answer(PROMPTS, 6, stop_ids=[], batch_size=4, log=quiet)
    stop = answers[0][0]  # the first prompt's answer stops at once: it is asked follow-ups, the others are not
    assert all(stop not in a for a in answers[1:])
    job = {
        "command": "test", "model_file": "model.gguf",
        "target": {"model": "tiny", "embed_mean_abs": float(target.embedding_table()[:512].abs().mean())},
        "prompts": PROMPTS * 3, "held_out_prompts": [0], "follow_ups": [[21, 22], [23]], "stop_ids": [stop],
        "settings": {"max_new_tokens": 6, "follow_up_tokens": 4, "follow_ups_per_answer": 2, "draft_vocab": 32,
                     "draft_steps": 2, "batch_size": 4, "lr": 2e-3, "steps": 1000, "seed": 0},
    }
    (job_dir / torch_job.JOB).write_text(json.dumps(job))
    torch_job.run(job_dir, tmp_path / "out", "cpu", train_minutes=5.0, gen_batch=8, data_minutes=5.0, max_epochs=1.0)
    training = json.loads((tmp_path / "out" / "training.json").read_text())
    assert training["follow_up_turns"] == 3 * 2  # prompt 0, three times over, two follow-ups each
    # First turns of one stop token teach nothing (no label two ahead): prompt 0's three are not samples.
    assert training["samples"] + training["held_out_samples"] == 3 * (len(PROMPTS) - 1) + 6
    assert training["held_out_samples"] == 2  # job prompt 0's two follow-up turns
    assert training["steps"] == int(1.0 * training["samples"] / 4)  # one pass: the epoch cap, not the 1000 steps
    head = tmp_path / "out" / "mtp-head"
    meta = json.loads((head / CONFIG).read_text())
    assert (head / WEIGHTS).exists() and meta["mtp"]["draft_vocab"] == 32 and meta["target"] == job["target"]


def test_a_job_for_another_model_file_is_refused(tiny_gguf, target, tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "model.gguf").symlink_to(tiny_gguf)
    job = {"model_file": "model.gguf", "target": {"embed_mean_abs": 123.0}, "settings": {}}
    (job_dir / torch_job.JOB).write_text(json.dumps(job))
    with pytest.raises(SystemExit, match="embedding fingerprint"):
        torch_job.run(job_dir, tmp_path / "out", "cpu", 1.0, 4, 1.0, 1.0)


def test_follow_up_ids_continue_the_models_chat_template():
    from speclane.models.loader import resolve_model
    from speclane.models.tokenizer import Tokenizer
    from speclane.training.job_files import follow_up_ids

    try:
        tokenizer = Tokenizer.from_gguf(resolve_model("smollm2-135m-instruct"))
    except Exception as exc:  # the model package is part of `make install`
        pytest.skip(f"smollm2 is not installed: {exc}")
    question, answer = "What is tea?", "A drink made from leaves."
    first = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}]))
    answered = first + tokenizer.encode(answer) + [tokenizer.eos_token_id]
    whole = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question},
                                                            {"role": "assistant", "content": answer},
                                                            {"role": "user", "content": FOLLOW_UPS[0]}]))
    assert answered + follow_up_ids(tokenizer, FOLLOW_UPS[0]) == whole
