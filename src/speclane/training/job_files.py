"""``speclane train-mtp --export-job`` and ``--import-head``: the two ends of a head trained
on another machine by ``torch_job`` (see there). Both run here, with the engine."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from speclane.engine.engine import LLMEngine
from speclane.models.loader import resolve_model
from speclane.models.mtp_store import CONFIG, load_head, save_head, target_fingerprint
from speclane.models.tokenizer import Tokenizer
from speclane.training.capture import generate_samples
from speclane.training.evaluate import acceptance_report
from speclane.training.objective import log
from speclane.training.prompts import FOLLOW_UPS
from speclane.training.torch_job import JOB

ANSWER_MARK = "<<speclane: the answer>>"


def follow_up_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The tokens that follow an answer's stop token when the user asks ``text`` next:
    the rest of the answer's turn, the user's turn, and the assistant's new turn."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "?"},
                                              {"role": "assistant", "content": ANSWER_MARK},
                                              {"role": "user", "content": text}])
    for stop in sorted(tokenizer.eos_token_ids):
        end = tokenizer.id_to_token(stop)
        if end and ANSWER_MARK + end in rendered:
            return tokenizer.encode(rendered.split(ANSWER_MARK + end, 1)[1], add_special_tokens=False)
    raise ValueError("the chat template does not end an assistant turn with a stop token: no follow-up turns")


def export_job(engine: LLMEngine, model_name: str, prompts: list[list[int]], job_dir: Path,
               args: argparse.Namespace) -> Path:
    model_file = resolve_model(model_name)
    if model_file.suffix != ".gguf":
        raise SystemExit(f"--export-job needs a GGUF model file, not {model_file}")
    job_dir.mkdir(parents=True, exist_ok=True)
    held = max(1, int(len(prompts) * args.held_out))
    job = {
        "command": " ".join(sys.argv),
        "model_file": "model.gguf",
        "target": target_fingerprint(engine.model, model_name),
        "prompts": prompts,
        "held_out_prompts": list(range(len(prompts) - held, len(prompts))),
        "follow_ups": [follow_up_ids(engine.tokenizer, text) for text in FOLLOW_UPS],
        "stop_ids": sorted(engine.tokenizer.eos_token_ids),
        "settings": {"max_new_tokens": args.max_new_tokens, "follow_up_tokens": args.follow_up_tokens,
                     "follow_ups_per_answer": args.follow_ups_per_answer,
                     "draft_vocab": args.draft_vocab, "draft_steps": args.draft_steps, "batch_size": args.batch_size,
                     "lr": args.lr, "steps": args.steps, "seed": args.seed},
    }
    shutil.copyfile(model_file, job_dir / job["model_file"])
    (job_dir / JOB).write_text(json.dumps(job) + "\n")
    log(f"[job] {len(prompts)} prompts ({held} held out) and {model_file.name} in {job_dir}: "
        f"python -m speclane.training.torch_job {job_dir} OUT --device cuda")
    return job_dir


def import_head(engine: LLMEngine, model_name: str, head_dir: Path, out: Path, args: argparse.Namespace) -> Path:
    """Check ``head_dir`` is for the loaded model, measure its acceptance as ``train_head``
    does (the engine's greedy text of the job's held-out prompts) and write OUT/mtp-head."""
    job = json.loads((out / "job" / JOB).read_text())
    head = load_head(head_dir, engine.model, model_name)
    meta = json.loads((head_dir / CONFIG).read_text())
    held_out = [job["prompts"][i] for i in job["held_out_prompts"]]
    samples = generate_samples(engine, held_out, out / "held-out-data", job["settings"]["max_new_tokens"],
                               args.concurrency)
    report = acceptance_report(head, samples, num_draft_tokens=job["settings"]["draft_steps"])
    log(f"[import] held-out acceptance per draft position {report['acceptance_per_position']}, "
        f"mean accepted per round {report['mean_accepted']:.2f} ({report['rounds']} rounds)")
    path = save_head(head, out / "mtp-head", target_fingerprint(engine.model, model_name),
                     training=meta.get("training", {}), acceptance=report)
    log(f"[import] head written to {path}")
    return path
