"""``WeightSet``: a model's weights as read from any format, before ``build.py`` turns
them into a runnable ``LlamaModel``; and ``ModelLoadError``, the readers' one error.

Its own module so that the readers (``loader.py``, ``families.py``) and the weight cache
(``weight_cache.py``) all import it and none imports another's back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from speclane.models.gguf_types import FloatTensor, QuantizedTensor
from speclane.models.llama import LlamaConfig


class ModelLoadError(ValueError):
    """A model that cannot be found or read; the message says what to do."""


@dataclass
class WeightSet:
    """Weights in the Hugging Face layout (``model.layers.N.self_attn.q_proj.weight``...).

    A name is in one of ``dense``, ``quantized`` and ``floats``: a GGUF's matmul weights of
    a type our kernels run keep only the file's own values (``gguf_types.QuantizedTensor``
    for its blocks, ``gguf_types.FloatTensor`` for F32, F16 and BF16), as do a Hugging Face
    folder's matmul weights in their safetensors float type (``FloatTensor``), so the
    kernels run on them instead of re-quantizing, and no float32 copy is held.
    """

    config: LlamaConfig
    dense: dict[str, torch.Tensor]  # float32 tensors
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)
    floats: dict[str, FloatTensor] = field(default_factory=dict)
    tokenizer_source: Any = None  # GGUF metadata dict, or the HF folder path
    source: str = ""

    def __contains__(self, name: str) -> bool:
        return name in self.dense or name in self.quantized or name in self.floats

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """``name``'s shape ([out, in] for a matmul weight, whatever its type), or None."""
        for kind in (self.dense, self.quantized, self.floats):
            if name in kind:
                return tuple(kind[name].shape)
        return None

    def float_weight(self, name: str) -> torch.Tensor:
        """``name``'s values as a float32 tensor: the dense one, or the quantized or float
        one's dequantization (a fresh float32 copy). KeyError where there is none."""
        if name in self.dense:
            return self.dense[name]
        native = self.quantized[name] if name in self.quantized else self.floats[name]
        return native.dequantize()

    @property
    def nbytes(self) -> int:
        """The bytes the weights hold in memory."""
        return (sum(t.numel() * t.element_size() for t in self.dense.values())
                + sum(t.nbytes for t in [*self.quantized.values(), *self.floats.values()]))
