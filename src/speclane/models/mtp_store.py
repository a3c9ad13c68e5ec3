"""MTP heads on disk: ``model.safetensors`` + ``config.json`` naming the target.

A head is only valid for the target it was trained on (it reads that model's hidden
states and shares its embedding and output head), so ``config.json`` records the
target's shape and a fingerprint of its embedding; loading a head for another model
is a clear error, not silent garbage drafts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from speclane.models.mtp_head import MTPConfig, MTPHead

if TYPE_CHECKING:  # a head is saved without the kernels (``training.torch_job`` runs on torch alone)
    from speclane.models.llama import LlamaModel

FORMAT = "speclane-mtp/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


class MTPHeadError(ValueError):
    """A head that cannot be used: missing, corrupt, or trained for another model."""


FINGERPRINT_ROWS = 512  # the embedding's first rows, whose mean |w| identifies the weights


def embedding_mean_abs(embedding: torch.Tensor) -> float:
    """The fingerprint of an embedding table [vocab, hidden] (or its first rows): the mean
    |w| of its first ``FINGERPRINT_ROWS`` rows, equal for the same weights in any dtype or
    container (our loader's, transformers')."""
    return round(float(embedding[:FINGERPRINT_ROWS].float().abs().mean()), 6)


def same_embedding(expected: dict[str, object], mean_abs: float) -> bool:
    """Whether ``mean_abs`` is a fingerprint's ``embed_mean_abs`` (2% apart at most)."""
    recorded = float(expected.get("embed_mean_abs", 0.0))  # type: ignore[arg-type]
    return abs(recorded - mean_abs) <= 0.02 * max(abs(recorded), 1e-6)


def target_fingerprint(model: LlamaModel, model_name: str) -> dict[str, object]:
    cfg = model.config
    # Mean |w| of a fixed slice of the embedding: equal for the same weights in any
    # dtype or container, different for another checkpoint of the same shape.
    embed_mean = embedding_mean_abs(model.embed.rows(torch.arange(min(FINGERPRINT_ROWS, model.config.vocab_size))))
    return {
        "model": model_name,
        "architecture": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "embed_mean_abs": embed_mean,
    }


def save_head(head: MTPHead, folder: Path, target: dict[str, object], **extra: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16 if v.is_floating_point() else torch.int32).contiguous()
             for k, v in head.state_dict().items()}
    save_file(state, str(folder / WEIGHTS))
    meta = {"format": FORMAT, "target": target, "mtp": head.config.to_dict(), **extra}
    (folder / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def fingerprint_differences(expected: dict[str, object], model: LlamaModel) -> list[str]:
    """What of a ``target_fingerprint`` differs from ``model``'s (its name aside: one model
    may be named by a path or a known name): [] for the same model."""
    actual = target_fingerprint(model, "")
    shape_keys = ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads")
    wrong = [k for k in shape_keys if expected.get(k) != actual[k]]
    if not wrong and not same_embedding(expected, float(actual["embed_mean_abs"])):  # type: ignore[arg-type]
        wrong.append("embedding fingerprint")
    return wrong


def check_target(expected: dict[str, object], model: LlamaModel, model_name: str, where: Path) -> None:
    wrong = fingerprint_differences(expected, model)
    if wrong:
        raise MTPHeadError(
            f"MTP head {where} was trained for {expected.get('model')!r}, not for the loaded model {model_name!r} "
            f"(differs in {', '.join(wrong)}); train one with `speclane train-mtp --model {model_name} --out DIR` "
            f"and pass --mtp-head DIR/mtp-head"
        )


def load_head(folder: str | Path, model: LlamaModel, model_name: str) -> MTPHead:
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    config_path, weights_path = folder / CONFIG, folder / WEIGHTS
    if not config_path.exists() or not weights_path.exists():
        raise MTPHeadError(f"no MTP head at {folder}: expected {CONFIG} and {WEIGHTS}")
    try:
        meta = json.loads(config_path.read_text())
        if meta.get("format") != FORMAT:
            raise MTPHeadError(f"{config_path}: format {meta.get('format')!r} is not {FORMAT!r}")
        config = MTPConfig(**meta["mtp"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise MTPHeadError(f"{config_path} is not a valid MTP head config: {exc}") from exc
    check_target(meta["target"], model, model_name, folder)
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise MTPHeadError(f"{weights_path} is corrupt or unreadable: {exc}") from exc
    head = MTPHead(config)
    expected = head.state_dict()
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in expected):
        raise MTPHeadError(f"{weights_path} does not hold the tensors its config describes")
    head.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    if int(head.vocab_ids.max()) >= model.config.vocab_size or int(head.vocab_ids.min()) < 0:
        raise MTPHeadError(f"{weights_path}: draft vocabulary ids outside the model's vocabulary")
    head.attach_target(model.embedding_table(), model.head_table())
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return head
