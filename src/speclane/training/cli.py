"""``speclane train-mtp``: data from the frozen target, then the head, then a report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from speclane.config import EngineConfig

if TYPE_CHECKING:  # the parser is built without torch; the commands import what they run
    from speclane.models.llama import LlamaModel

TARGET = "target.json"  # in --out: the model its data and head are for


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder: data shards, checkpoints, the head")
    p.add_argument("--prompts", type=int, default=640, help="training prompts the target answers")
    p.add_argument("--max-new-tokens", type=int, default=160, help="tokens the target writes per prompt")
    p.add_argument("--concurrency", type=int, default=32, help="prompts answered at once")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="samples per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--draft-steps", type=int, default=3, help="recursive steps trained (drafts per round it is good at)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head drafts over (most frequent first)")
    p.add_argument("--held-out", type=float, default=0.05, help="fraction of samples kept for the acceptance report")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                   help="the head's training matmuls: bf16 autocast (auto: where the CPU multiplies bfloat16 natively) or fp32")
    p.add_argument("--data-only", action="store_true", help="stop after generating the data")
    p.add_argument("--export-job", action="store_true",
                   help="train elsewhere (a GPU machine with torch and transformers): write OUT/job, the prompts as "
                        "token ids, follow-up turns and the GGUF file, for `python -m speclane.training.torch_job`")
    p.add_argument("--import-head", metavar="HEAD",
                   help="a head torch_job trained from OUT/job: measure its acceptance on the job's held-out prompts "
                        "with the engine and write it to OUT/mtp-head")
    p.add_argument("--follow-up-tokens", type=int, default=256, help="tokens a job's follow-up answers may take")
    p.add_argument("--follow-ups-per-answer", type=int, default=2, help="second turns a job asks after each answer")
    p.add_argument("--seed", type=int, default=0)


def claim_out_folder(out: Path, model: LlamaModel, model_name: str) -> None:
    """``--out`` holds one target's data, checkpoint and head (a head learns one model's
    hidden states): the first run records the target (``target.json``), a later run for
    another model is refused before it would resume from that model's data."""
    from speclane.models.mtp_store import fingerprint_differences, target_fingerprint

    marker = out / TARGET
    if not marker.exists():
        marker.write_text(json.dumps(target_fingerprint(model, model_name), indent=2) + "\n")
        return
    recorded = json.loads(marker.read_text())
    wrong = fingerprint_differences(recorded, model)
    if wrong:
        raise ValueError(f"{out} holds MTP training data of model {recorded.get('model')!r}, not of {model_name!r} "
                         f"(differs in {', '.join(wrong)}); pass another --out")


def check_train_arguments(args: argparse.Namespace) -> None:
    """``ValueError`` for values that would fail (or spin) only after the model has loaded
    and the data has been generated."""
    for name in ("prompts", "max_new_tokens", "concurrency", "steps", "batch_size", "draft_steps", "draft_vocab",
                 "checkpoint_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    for name in ("follow_up_tokens", "follow_ups_per_answer"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0; got {getattr(args, name)}")
    if not 0 <= args.held_out < 1:
        raise ValueError(f"--held-out is the fraction of samples kept out of training, in [0, 1); got {args.held_out}")
    if not args.lr > 0 or args.lr == float("inf"):
        raise ValueError(f"--lr must be a finite number > 0; got {args.lr}")


def run_train_mtp(args: argparse.Namespace, config: EngineConfig) -> int:
    from speclane.engine.engine import LLMEngine
    from speclane.training.capture import generate_samples
    from speclane.training.prompts import training_prompts

    check_train_arguments(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Every position's hidden state is a training row: no prompt position may come from the prefix cache.
    config = config.replace(spec_mode="off", max_num_seqs=max(args.concurrency, 1), prefix_cache=False)
    engine = LLMEngine(config)
    claim_out_folder(out, engine.model, config.model.model)
    tokenizer = engine.tokenizer
    texts = training_prompts(args.prompts, seed=args.seed)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": t}]), add_special_tokens=False)
               for t in texts]
    if args.export_job:
        from speclane.training.job_files import export_job

        export_job(engine, config.model.model, prompts, out / "job", args)
        return 0
    if args.import_head:
        from speclane.training.job_files import import_head

        import_head(engine, config.model.model, Path(args.import_head), out, args)
        return 0
    samples = generate_samples(engine, prompts, out / "data", args.max_new_tokens, args.concurrency)
    data_s = time.perf_counter() - started
    print(f"[data] {len(samples)} samples, {sum(len(s.token_ids) - s.num_prompt_tokens for s in samples)} generated tokens "
          f"({data_s / 60:.1f} min this run)", file=sys.stderr, flush=True)
    if args.data_only:
        return 0
    from speclane.training.train_mtp import train_head

    train_head(engine.model, config.model.model, samples, out, args)
    print(f"[train-mtp] done in {(time.perf_counter() - started) / 60:.1f} min", file=sys.stderr, flush=True)
    return 0
