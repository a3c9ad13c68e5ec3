"""Stage 2 of ``speclane train-mtp``: train the MTP head on the target's own text.

The target is frozen; only the head learns. Each training window of a sample gives,
at every position p, the target's hidden state h_p, the next token and the label:
the token two ahead, which in the generated part is the target's own greedy choice.
The head is trained for ``--draft-steps`` recursive steps at once, each step seeing
exactly what drafting will show it: step s at position p gets the previous step's
output in place of h_p, and attends to true entries before p - s + 1 plus its own
recursive entries (``recursive_mask``).

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
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from speclane.kernels.build import missing_cpu_flags
from speclane.models.llama import LlamaModel
from speclane.models.mtp_head import MTPConfig, MTPHead
from speclane.models.mtp_store import (
    save_head,
    target_fingerprint,
)
from speclane.training.capture import Sample
from speclane.training.evaluate import acceptance_report

IGNORE = -100
WINDOW = 256  # positions per training window (the head's attention window)
PROMPT_CONTEXT = 48  # prompt positions kept before the generated part, as attention context


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def choose_draft_vocab(samples: list[Sample], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` most frequent generated tokens (then prompt tokens, then by id)."""
    generated = Counter(t for s in samples for t in s.token_ids[s.num_prompt_tokens :])
    prompts = Counter(t for s in samples for t in s.token_ids[: s.num_prompt_tokens])
    order = [t for t, _ in generated.most_common()]
    seen = set(order)
    order += [t for t, _ in prompts.most_common() if t not in seen]
    seen.update(order)
    order += [t for t in range(vocab_size) if t not in seen]
    chosen = order[: min(size, vocab_size)]
    total = sum(generated.values())
    covered = sum(generated[t] for t in chosen)
    log(f"[train] draft vocabulary {len(chosen)} tokens covers {covered / max(total, 1):.2%} of generated tokens")
    return torch.tensor(chosen, dtype=torch.long)


def head_from_target(model: LlamaModel, draft_vocab: torch.Tensor) -> MTPHead:
    cfg = model.config
    config = MTPConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        draft_vocab=len(draft_vocab),
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        window=WINDOW,
    )
    head = MTPHead(config)
    with torch.no_grad():
        head.vocab_ids.copy_(draft_vocab)
        # Start as "the target's own hidden state, passed through": residual branches at
        # zero (o, down), fc reading the hidden half only. The untrained head then ranks
        # tokens like the target's head does; training moves it one token further ahead.
        # (Starting from a copy of the target's last layer was measured worse: that
        # layer's outputs are large and the first hundred steps go to undoing them.)
        for linear in (head.qkv, head.gate_up):
            linear.weight.normal_(0.0, 0.02)
        head.o.weight.zero_()
        head.down.weight.zero_()
        h = cfg.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, :h] = torch.eye(h)
    head.attach_target(model.embedding_table(), model.head_table())
    return head


def recursive_mask(length: int, step: int) -> torch.Tensor:
    """[T, step * T] bool: which keys query i of recursive step ``step`` (1-based) sees.

    Keys are the concatenated entries of steps 1..step. Step-1 entries are the true
    ones (from the target's hidden states); query i of step s stands for a draft made
    s - 1 positions after the last true entry, so it sees true entries j <= i - s + 1,
    and the recursive entry of step r at exactly i - (s - r).
    """
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    parts = [j <= i - (step - 1)]
    parts += [j == i - (step - r) for r in range(2, step + 1)]
    return torch.cat(parts, dim=1)


def make_batch(samples: list[Sample], vocab_index: torch.Tensor, rng: random.Random) -> dict[str, torch.Tensor]:
    """Windows of up to ``WINDOW`` positions with right padding."""
    rows = []
    for s in samples:
        n_pos = s.hidden.shape[0]  # positions 0 .. n_pos - 1 have hidden states
        first_gen = max(0, s.num_prompt_tokens - 2)  # first position whose label is generated
        lo = max(0, first_gen - PROMPT_CONTEXT)
        latest = max(lo, n_pos - WINDOW)
        start = rng.randint(lo, max(lo, min(latest, first_gen)))
        end = min(n_pos, start + WINDOW)
        positions = torch.arange(start, end)
        tokens = torch.tensor(s.token_ids)
        nxt = tokens[positions + 1]
        label_pos = positions + 2
        labels = torch.full((len(positions),), IGNORE, dtype=torch.long)
        ok = (label_pos < len(tokens)) & (label_pos >= s.num_prompt_tokens)
        mapped = vocab_index[tokens[label_pos.clamp(max=len(tokens) - 1)]]
        labels[ok] = mapped[ok]
        rows.append((s.hidden[start:end].float(), nxt, positions, labels))
    length = max(r[0].shape[0] for r in rows)
    hid = torch.zeros(len(rows), length, rows[0][0].shape[1])
    nxt = torch.zeros(len(rows), length, dtype=torch.long)
    pos = torch.zeros(len(rows), length, dtype=torch.long)
    lab = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for b, (h, n, p, lbl) in enumerate(rows):
        t = h.shape[0]
        hid[b, :t], nxt[b, :t], pos[b, :t], lab[b, :t] = h, n, p, lbl
    return {"hidden": hid, "next": nxt, "positions": pos, "labels": lab}


def recursive_outputs(head: MTPHead, batch: dict[str, torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Block outputs [B, T, H] of each recursive step, all positions at once."""
    hidden = batch["hidden"]
    length = hidden.shape[1]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outputs = []
    for s in range(1, steps + 1):
        x = head.inputs(hidden, batch["next"])
        q, k, v = head.project(x, batch["positions"])
        keys.append(k)
        values.append(v)
        out = head.finish(x, q, torch.cat(keys, dim=1), torch.cat(values, dim=1), recursive_mask(length, s))
        outputs.append(out)
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # o_{p-1} stands in for h_p
    return outputs


def recursive_loss(head: MTPHead, batch: dict[str, torch.Tensor], steps: int) -> tuple[torch.Tensor, list[float]]:
    total = batch["hidden"].new_zeros(())
    per_step = []
    for s, out in enumerate(recursive_outputs(head, batch, steps), start=1):
        labels = batch["labels"].clone()
        labels[:, : s - 1] = IGNORE  # no previous output to stand in for h there
        loss = F.cross_entropy(head.draft_logits(out).flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        total = total + loss * (0.8 ** (s - 1))
        per_step.append(float(loss.detach()))
    return total, per_step


def use_bf16(precision: str) -> bool:
    """``--precision``: auto is bfloat16 autocast where the CPU has native bfloat16 dot products."""
    if precision == "auto":
        return not missing_cpu_flags("avx512bf16")
    return precision == "bf16"


def train_head(model: LlamaModel, model_name: str, samples: list[Sample], out: Path, args: argparse.Namespace) -> Path:
    started = time.perf_counter()
    bf16 = use_bf16(args.precision)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    held = max(1, int(len(samples) * args.held_out)) if len(samples) > 1 else 0
    train_set, held_out = samples[: len(samples) - held], samples[len(samples) - held :]
    vocab = choose_draft_vocab(train_set, args.draft_vocab, model.config.vocab_size)
    head = head_from_target(model, vocab)
    vocab_index = torch.full((model.config.vocab_size,), IGNORE, dtype=torch.long)
    vocab_index[vocab] = torch.arange(len(vocab))
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 50) * max(0.05, 1 - step / max(args.steps, 1)))
    checkpoint = out / "checkpoint.pt"
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        head.load_state_dict(state["head"])
        head.attach_target(model.embedding_table(), model.head_table())
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step = state["step"]
        rng.setstate(state["rng"])
        log(f"[train] resumed at step {step} from {checkpoint}")
    log(f"[train] {len(train_set)} training samples, {len(held_out)} held out; {args.steps} steps of {args.batch_size}, "
        f"{'bfloat16 autocast' if bf16 else 'float32'}")
    head.train()
    last_log = time.perf_counter()
    smoothed: list[float] | None = None
    first_losses: list[float] | None = None
    while step < args.steps:
        batch = make_batch(rng.sample(train_set, min(args.batch_size, len(train_set))), vocab_index, rng)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, per_step = recursive_loss(head, batch, args.draft_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        first_losses = first_losses or per_step
        smoothed = per_step if smoothed is None else [0.9 * a + 0.1 * b for a, b in zip(smoothed, per_step, strict=True)]
        now = time.perf_counter()
        if now - last_log > 20 or step == args.steps:
            rate = (now - started) / step
            log(f"[train] step {step}/{args.steps} loss per draft step {' '.join(f'{x:.3f}' for x in smoothed)} "
                f"({rate:.2f} s/step, ETA {(args.steps - step) * rate / 60:.1f} min)")
            last_log = now
        if step % args.checkpoint_every == 0 or step == args.steps:
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "step": step, "rng": rng.getstate()}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").rename(checkpoint)
    head.eval()
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
        "first_loss": first_losses,
        "final_loss": smoothed,
        "train_minutes": round((time.perf_counter() - started) / 60, 1),
    }
    path = save_head(head, out / "mtp-head", target_fingerprint(model, model_name), training=training, acceptance=report)
    (out / "report.json").write_text(json.dumps({"training": training, "acceptance": report}, indent=2))
    log(f"[train] head written to {path}")
    return path

