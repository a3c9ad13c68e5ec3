"""Stage 2 of ``speclane train-mtp``: train the MTP head on the target's own text.

The objective and the loop are ``objective``'s; this stage picks the precision, holds
out samples for the acceptance report, checkpoints in ``--out`` and writes the head.

Checkpoints (``checkpoint.pt``) are written every ``--checkpoint-every`` steps; a
rerun of the same command resumes from the last one.

Precision: the matmuls run under bfloat16 autocast where the CPU multiplies bfloat16
natively (AVX512_BF16 / AMX; ``--precision auto``), the weights, their gradients and the
optimizer staying float32. On an AMX Xeon a step of 4 windows takes 0.37 s instead of
0.62; elsewhere bfloat16 would be emulated, so auto keeps
float32 there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from speclane.kernels.build import missing_cpu_flags
from speclane.models.llama import LlamaModel
from speclane.models.mtp_head import MTPConfig, MTPHead
from speclane.models.mtp_store import (
    save_head,
    target_fingerprint,
)
from speclane.training.evaluate import acceptance_report
from speclane.training.objective import (
    IGNORE,
    WINDOW,
    FitSettings,
    choose_draft_vocab,
    fit,
    initial_head,
    log,
)
from speclane.training.samples import Sample


def mtp_config_of(model: LlamaModel, draft_vocab: int) -> MTPConfig:
    cfg = model.config
    return MTPConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads,
                     num_kv_heads=cfg.num_kv_heads, draft_vocab=draft_vocab, rms_norm_eps=cfg.rms_norm_eps,
                     rope_theta=cfg.rope_theta, window=WINDOW)


def head_from_target(model: LlamaModel, draft_vocab: torch.Tensor) -> MTPHead:
    return initial_head(mtp_config_of(model, len(draft_vocab)), draft_vocab, model.embedding_table(), model.head_table())


def use_bf16(precision: str) -> bool:
    """``--precision``: auto is bfloat16 autocast where the CPU has native bfloat16 dot products."""
    if precision == "auto":
        return not missing_cpu_flags("avx512bf16")
    return precision == "bf16"


def train_head(model: LlamaModel, model_name: str, samples: list[Sample], out: Path, args: argparse.Namespace) -> Path:
    bf16 = use_bf16(args.precision)
    held = max(1, int(len(samples) * args.held_out)) if len(samples) > 1 else 0
    train_set, held_out = samples[: len(samples) - held], samples[len(samples) - held :]
    vocab = choose_draft_vocab(train_set, args.draft_vocab, model.config.vocab_size, log)
    head = head_from_target(model, vocab)
    vocab_index = torch.full((model.config.vocab_size,), IGNORE, dtype=torch.long)
    vocab_index[vocab] = torch.arange(len(vocab))
    settings = FitSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, draft_steps=args.draft_steps,
                           seed=args.seed, bf16=bf16, checkpoint_every=args.checkpoint_every)
    log(f"[train] {len(train_set)} training samples, {len(held_out)} held out; {args.steps} steps of {args.batch_size}, "
        f"{'bfloat16 autocast' if bf16 else 'float32'}")
    fitted = fit(head, train_set, vocab_index, settings, log, checkpoint=out / "checkpoint.pt",
                 reattach=lambda h: h.attach_target(model.embedding_table(), model.head_table()))
    report = acceptance_report(head, held_out, num_draft_tokens=args.draft_steps)
    log(f"[train] held-out acceptance per draft position {report['acceptance_per_position']}, "
        f"mean accepted per round {report['mean_accepted']:.2f} (K={args.draft_steps}, {report['rounds']} rounds)")
    training = {
        "command": " ".join(sys.argv),
        "samples": len(train_set),
        "held_out_samples": len(held_out),
        "generated_tokens": sum(len(s.token_ids) - s.num_prompt_tokens for s in train_set),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "draft_steps": args.draft_steps,
        "precision": "bf16" if bf16 else "fp32",
        **fitted,
    }
    path = save_head(head, out / "mtp-head", target_fingerprint(model, model_name), training=training, acceptance=report)
    (out / "report.json").write_text(json.dumps({"training": training, "acceptance": report}, indent=2))
    log(f"[train] head written to {path}")
    return path
