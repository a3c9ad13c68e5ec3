"""``WeightSet``: a model's weights as read from any format, before ``build.py`` turns
them into a runnable ``LlamaModel``; and ``ModelLoadError``, the readers' one error.

Its own module so that the readers (``loader.py``, ``families.py``) and the weight cache
(``weight_cache.py``) all import it and none imports another's back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from speclane.models.llama import LlamaConfig


class ModelLoadError(ValueError):
    """A model that cannot be found or read; the message says what to do."""


@dataclass
class WeightSet:
    """Weights in the Hugging Face layout (``model.layers.N.self_attn.q_proj.weight``...)."""

    config: LlamaConfig
    dense: dict[str, torch.Tensor]  # float32 (or the file's float dtype) tensors
    # GGUF Q4_1 blocks of a weight: (q [out, in] int32 0..15, d [out, in/32], m [out, in/32]),
    # so int4 can run on the file's own values instead of re-quantizing.
    q4_blocks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    tokenizer_source: Any = None  # GGUF metadata dict, or the HF folder path
    source: str = ""
