"""What the MTP head learns and how: the training objective and loop, on any torch device.

The target is frozen; only the head learns. Each training window of a sample gives,
at every position p, the target's hidden state h_p, the next token and the label:
the token two ahead, which in the generated part is the target's own greedy choice.
The head is trained for ``draft_steps`` recursive steps at once, each step seeing
exactly what drafting will show it: step s at position p gets the previous step's
output in place of h_p, and attends to true entries before p - s + 1 plus its own
recursive entries (``recursive_mask``).

This module needs torch alone (no kernels, no engine), so the same loop trains a head
on the CPU beside the engine (``train_mtp``) and on a GPU where the target runs in
transformers (``torch_job``).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from speclane.models.mtp_head import MTPConfig, MTPHead
from speclane.training.samples import Sample

IGNORE = -100
WINDOW = 256  # positions per training window (the head's attention window)
PROMPT_CONTEXT = 48  # prompt positions kept before the generated part, as attention context

Log = Callable[[str], None]


def log(line: str) -> None:
    """Training's progress lines, on stderr (stdout stays for a command's results)."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class FitSettings:
    steps: int
    batch_size: int
    lr: float
    draft_steps: int
    seed: int = 0
    bf16: bool = False  # bfloat16 autocast of the head's matmuls (weights and optimizer stay float32)
    checkpoint_every: int = 100
    log_every_s: float = 20.0


def choose_draft_vocab(samples: list[Sample], size: int, vocab_size: int, log: Log) -> torch.Tensor:
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


def initial_head(config: MTPConfig, draft_vocab: torch.Tensor, embedding: torch.Tensor, head_table: torch.Tensor) -> MTPHead:
    """A new head over ``draft_vocab``, attached to the target's embedding and output head."""
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
        h = config.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, :h] = torch.eye(h)
    head.attach_target(embedding, head_table)
    return head


def recursive_mask(length: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[T, step * T] bool: which keys query i of recursive step ``step`` (1-based) sees.

    Keys are the concatenated entries of steps 1..step. Step-1 entries are the true
    ones (from the target's hidden states); query i of step s stands for a draft made
    s - 1 positions after the last true entry, so it sees true entries j <= i - s + 1,
    and the recursive entry of step r at exactly i - (s - r).
    """
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    parts = [j <= i - (step - 1)]
    parts += [j == i - (step - r) for r in range(2, step + 1)]
    return torch.cat(parts, dim=1)


def make_batch(samples: list[Sample], vocab_index: torch.Tensor, rng: random.Random,
               device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Windows of up to ``WINDOW`` positions with right padding, on ``device``."""
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
        rows.append((s.hidden[start:end], nxt, positions, labels))
    length = max(r[0].shape[0] for r in rows)
    hid = torch.zeros(len(rows), length, rows[0][0].shape[1], device=device)
    nxt = torch.zeros(len(rows), length, dtype=torch.long)
    pos = torch.zeros(len(rows), length, dtype=torch.long)
    lab = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    for b, (h, n, p, lbl) in enumerate(rows):
        t = h.shape[0]
        hid[b, :t] = h.to(device, torch.float32)
        nxt[b, :t], pos[b, :t], lab[b, :t] = n, p, lbl
    return {"hidden": hid, "next": nxt.to(device), "positions": pos.to(device), "labels": lab.to(device)}


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
        mask = recursive_mask(length, s, hidden.device)
        out = head.finish(x, q, torch.cat(keys, dim=1), torch.cat(values, dim=1), mask)
        outputs.append(out)
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # o_{p-1} stands in for h_p
    return outputs


def recursive_loss(head: MTPHead, batch: dict[str, torch.Tensor], steps: int) -> tuple[torch.Tensor, list[float]]:
    total = batch["hidden"].new_zeros(())
    per_step = []
    for s, out in enumerate(recursive_outputs(head, batch, steps), start=1):
        labels = batch["labels"].clone()
        labels[:, : s - 1] = IGNORE  # no previous output to stand in for h there
        loss = F.cross_entropy(head.draft_logits(out).flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        total = total + loss * (0.8 ** (s - 1))
        per_step.append(float(loss.detach()))
    return total, per_step


@torch.no_grad()
def held_out_loss(head: MTPHead, samples: list[Sample], vocab_index: torch.Tensor, settings: FitSettings,
                  device: torch.device | str) -> list[float]:
    """The loss per recursive step over ``samples`` (one window each, a fixed draw)."""
    rng = random.Random(settings.seed + 1)
    totals = [0.0] * settings.draft_steps
    batches = 0
    for at in range(0, len(samples), settings.batch_size):
        batch = make_batch(samples[at : at + settings.batch_size], vocab_index, rng, device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=settings.bf16):
            _, per_step = recursive_loss(head, batch, settings.draft_steps)
        totals = [a + b for a, b in zip(totals, per_step, strict=True)]
        batches += 1
    return [t / max(batches, 1) for t in totals]


def fit(head: MTPHead, train_set: list[Sample], vocab_index: torch.Tensor, settings: FitSettings, log: Log,
        device: torch.device | str = "cpu", checkpoint: Path | None = None,
        reattach: Callable[[MTPHead], None] | None = None) -> dict[str, object]:
    """Train ``head`` in place on ``device``; resumes from ``checkpoint`` where one exists
    (``reattach`` re-attaches the target's tables after a state is loaded). Returns the
    first and last (smoothed) loss per recursive step and the minutes it took."""
    started = time.perf_counter()
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    total_steps = max(settings.steps, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 50) * max(0.05, 1 - step / total_steps))
    step = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        head.load_state_dict(state["head"])
        if reattach is not None:
            reattach(head)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step = state["step"]
        rng.setstate(state["rng"])
        log(f"[train] resumed at step {step} from {checkpoint}")
    head.train()
    device_type = torch.device(device).type
    last_log = time.perf_counter()
    smoothed: list[float] | None = None
    first_losses: list[float] | None = None
    while step < settings.steps:
        batch = make_batch(rng.sample(train_set, min(settings.batch_size, len(train_set))), vocab_index, rng, device)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=settings.bf16):
            loss, per_step = recursive_loss(head, batch, settings.draft_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        first_losses = first_losses or per_step
        smoothed = per_step if smoothed is None else [0.9 * a + 0.1 * b for a, b in zip(smoothed, per_step, strict=True)]
        now = time.perf_counter()
        if now - last_log > settings.log_every_s or step == settings.steps:
            rate = (now - started) / step
            log(f"[train] step {step}/{settings.steps} loss per draft step {' '.join(f'{x:.3f}' for x in smoothed)} "
                f"({rate:.3f} s/step, ETA {(settings.steps - step) * rate / 60:.1f} min)")
            last_log = now
        if checkpoint is not None and (step % settings.checkpoint_every == 0 or step == settings.steps):
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "step": step, "rng": rng.getstate()}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").rename(checkpoint)
    head.eval()
    return {"first_loss": first_losses, "final_loss": smoothed,
            "train_minutes": round((time.perf_counter() - started) / 60, 1)}
