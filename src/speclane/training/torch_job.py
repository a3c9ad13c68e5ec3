"""Train an MTP head where the target runs in transformers, typically on a GPU.

``speclane train-mtp --out DIR --export-job`` writes DIR/job on a machine with speclane:
the chat prompts as token ids (our tokenizer and chat template), the follow-up turns,
the stop tokens, the target's fingerprint and a copy of the GGUF file. This module
needs only torch, transformers and gguf (no kernels, no server), so the job runs on a
bare GPU machine:

    python -m speclane.training.torch_job DIR/job OUT --device cuda --train-minutes 4

The target answers every prompt greedily, then answers follow-up turns after its own
answer (so the head also learns answers that reuse earlier turns), and the head
trains on both turns with ``objective``'s loop, for as many steps as fit the minutes
given and ``--max-epochs`` passes. OUT receives ``mtp-head/`` (the head, as
``save_head`` writes it) and ``training.json``. Back here, ``speclane train-mtp --out DIR
--import-head OUT/mtp-head`` measures its acceptance with the engine on the job's
held-out prompts and writes DIR/mtp-head.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

from speclane.models.mtp_store import embedding_mean_abs, same_embedding, save_head
from speclane.training.objective import (
    IGNORE,
    FitSettings,
    choose_draft_vocab,
    fit,
    held_out_loss,
    initial_head,
    log,
)
from speclane.training.torch_target import TorchTarget

JOB = "job.json"
PROBE_STEPS = 12


def conversations(target: TorchTarget, job: dict, gen_batch: int, deadline: float) -> tuple[list[list[int]], list[int], list[int], int]:
    """Every training text (prompt + answer, then prompt + answer + follow-up + answer), its
    prompt length, the index of the job prompt it came from, and how many are second turns."""
    prompts, follow_ups, stops = job["prompts"], job["follow_ups"], job["stop_ids"]
    settings = job["settings"]
    first = target.answer(prompts, settings["max_new_tokens"], stops, gen_batch, log, deadline)
    texts, lengths, origin = [], [], []
    second_prompts, second_origin = [], []
    for i, (prompt, answer) in enumerate(zip(prompts, first, strict=True)):
        if len(answer) >= 2:  # a label is the token two ahead: one generated token gives none
            texts.append(prompt + answer)
            lengths.append(len(prompt))
            origin.append(i)
        if answer and answer[-1] in stops:  # a finished answer: the user asks on, in a few ways
            for j in range(min(settings.get("follow_ups_per_answer", 1), len(follow_ups))):
                second_prompts.append(prompt + answer + follow_ups[(i * 7 + j) % len(follow_ups)])
                second_origin.append(i)
    firsts = len(texts)
    second = target.answer(second_prompts, settings["follow_up_tokens"], stops, gen_batch, log, deadline)
    for prompt, answer, i in zip(second_prompts, second, second_origin, strict=True):
        if len(answer) >= 2:
            texts.append(prompt + answer)
            lengths.append(len(prompt))
            origin.append(i)
    return texts, lengths, origin, len(texts) - firsts


def run(job_dir: Path, out: Path, device: str, train_minutes: float, gen_batch: int, data_minutes: float,
        max_epochs: float) -> Path:
    started = time.perf_counter()
    job = json.loads((job_dir / JOB).read_text())
    settings = job["settings"]
    target = TorchTarget.from_gguf(job_dir / job["model_file"], device)
    actual = embedding_mean_abs(target.embedding_table())
    if not same_embedding(job["target"], actual):
        raise SystemExit(f"{job['model_file']}: embedding fingerprint {actual:.6f}, the job's target has "
                         f"{job['target'].get('embed_mean_abs')}")
    texts, lengths, origin, second_turns = conversations(target, job, gen_batch, started + data_minutes * 60)
    samples = target.samples(texts, lengths, gen_batch)
    data_took = (time.perf_counter() - started) / 60
    held_prompts = set(job["held_out_prompts"])
    train_set = [s for s, i in zip(samples, origin, strict=True) if i not in held_prompts]
    held_out = [s for s, i in zip(samples, origin, strict=True) if i in held_prompts]
    generated = sum(len(s.token_ids) - s.num_prompt_tokens for s in train_set)
    log(f"[data] {len(train_set)} training samples ({generated} generated tokens), {len(held_out)} held out, "
        f"{data_took:.1f} min")
    vocab_size = target.embedding_table().shape[0]
    vocab = choose_draft_vocab(train_set, settings["draft_vocab"], vocab_size, log)
    head = initial_head(target.mtp_config(len(vocab)), vocab, target.embedding_table(), target.head_table()).to(device)
    vocab_index = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    vocab_index[vocab] = torch.arange(len(vocab))
    fit_settings = FitSettings(steps=PROBE_STEPS, batch_size=settings["batch_size"], lr=settings["lr"],
                               draft_steps=settings["draft_steps"], seed=settings["seed"], bf16=True)
    fit(copy.deepcopy(head), train_set, vocab_index, fit_settings, log, device)  # warm-up: the first steps are slow
    probe_started = time.perf_counter()
    fit(copy.deepcopy(head), train_set, vocab_index, fit_settings, log, device)
    per_step = (time.perf_counter() - probe_started) / PROBE_STEPS
    # Passes over the data are capped as well as time: a GPU trains a one-block head for
    # tens of epochs in minutes, and beyond a few it memorises its training windows.
    epoch_steps = max_epochs * len(train_set) / settings["batch_size"]
    fit_settings = replace(fit_settings, steps=max(1, int(min(settings["steps"], train_minutes * 60 / per_step, epoch_steps))))
    epochs = fit_settings.steps * settings["batch_size"] / len(train_set)
    log(f"[train] {per_step * 1000:.0f} ms a step of {settings['batch_size']} windows: {fit_settings.steps} steps "
        f"({epochs:.1f} epochs)")
    fitted = fit(head, train_set, vocab_index, fit_settings, log, device)
    held_loss = held_out_loss(head, held_out, vocab_index, fit_settings, device) if held_out else []
    log(f"[train] held-out loss per draft step {' '.join(f'{x:.3f}' for x in held_loss)}")
    training = {
        "command": job["command"] + f" && python -m speclane.training.torch_job JOB OUT --device {device} "
                   f"--train-minutes {train_minutes:g} --data-minutes {data_minutes:g} --max-epochs {max_epochs:g}",
        "samples": len(train_set),
        "held_out_samples": len(held_out),
        "generated_tokens": generated,
        "follow_up_turns": second_turns,
        "steps": fit_settings.steps,
        "epochs": round(epochs, 2),
        "batch_size": settings["batch_size"],
        "draft_steps": settings["draft_steps"],
        "precision": "bf16",
        "device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else device,
        "data_minutes": round(data_took, 1),
        "held_out_loss": [round(x, 4) for x in held_loss],
        **fitted,
    }
    head = head.cpu()
    path = save_head(head, out / "mtp-head", job["target"], training=training)
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    log(f"[train] head written to {path} in {(time.perf_counter() - started) / 60:.1f} min")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m speclane.training.torch_job", description=__doc__.split("\n\n")[0])
    p.add_argument("job", type=Path, help="the folder `speclane train-mtp --export-job` wrote")
    p.add_argument("out", type=Path, help="where the head and training.json go")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--train-minutes", type=float, default=5.0, help="time the head's training may take")
    p.add_argument("--data-minutes", type=float, default=math.inf,
                   help="no batch of prompts is begun after this (the longest prompts go last)")
    p.add_argument("--max-epochs", type=float, default=4.0, help="passes over the training samples at most")
    p.add_argument("--gen-batch", type=int, default=512, help="sequences answered at once")
    args = p.parse_args(argv)
    run(args.job, args.out, args.device, args.train_minutes, args.gen_batch, args.data_minutes, args.max_epochs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
