"""Small GGUF files for the tests, written with gguf-py: random tensors of any type of
``gguf_types.TYPES`` (``random_tensor``), gguf-py's float32 values of them (``reference``),
and a llama of chosen matmul types (``write_llama``, shapes ``shape_of``); ``forward`` runs a
model built from one, and ``assert_near_the_float32_model`` checks a bfloat16 model of it
against its float32 one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from speclane.config import ModelConfig
from speclane.kernels.select import Kernels
from speclane.models.build import build_model
from speclane.models.gguf_types import TYPES
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch
from speclane.models.weights import WeightSet

gguf = pytest.importorskip("gguf")
GGML = gguf.GGMLQuantizationType
# gguf-py writes these from float32 values; the K types it only reads.
QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F32", "F16", "BF16"}

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 256, 512, 4, 2, 64
NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")  # a layer's matmuls, in order


def random_tensor(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes] of ``type_name`` data (F32 and F16: [rows, cols] of their values): gguf-py's
    quantization of random weights where it has one, else random bytes with sane float16
    scales (every index pattern occurs)."""
    rng = np.random.default_rng(seed)
    kind = TYPES[type_name]
    if type_name in QUANTIZABLE:
        return gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), GGML[type_name])
    raw = rng.integers(0, 256, (rows, cols // kind.block_values, kind.block_bytes), dtype=np.uint8)
    # d (and dmin), sized for weights of order 0.05 (as a model's are)
    at, high = ([208], 8e-5) if type_name == "Q6_K" else ([0, 2], 3e-4)
    for offset in at:
        raw[..., offset : offset + 2] = (rng.uniform(high / 4, high, raw.shape[:2]).astype(np.float16)
                                         .view(np.uint8).reshape(*raw.shape[:2], 2))
    return raw.reshape(rows, -1)


def reference(type_name: str, raw: np.ndarray) -> torch.Tensor:
    """gguf-py's float32 values of ``raw`` (``random_tensor``'s data or a file's)."""
    return torch.from_numpy(np.array(gguf.quants.dequantize(raw, GGML[type_name]), dtype=np.float32))


def shape_of(name: str) -> tuple[int, int]:
    """[out, in] of a layer matmul of ``NAMES``."""
    head_dim = HIDDEN // HEADS
    return {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * head_dim, HIDDEN), "attn_v": (KV_HEADS * head_dim, HIDDEN),
            "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
            "ffn_down": (HIDDEN, FFN)}[name]


def write_llama(path: Path, layer_types: list[tuple[str, ...]]) -> Path:
    """A llama GGUF at ``path`` with one layer per ``layer_types`` entry (the types of its
    matmuls, in ``NAMES`` order), a Q8_0 token embedding and float32 norms."""
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in [("embedding_length", HIDDEN), ("feed_forward_length", FFN), ("block_count", len(layer_types)),
                       ("attention.head_count", HEADS), ("attention.head_count_kv", KV_HEADS), ("vocab_size", VOCAB)]:
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    embed = gguf.quants.quantize(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), GGML.Q8_0)
    writer.add_tensor("token_embd.weight", embed, raw_dtype=GGML.Q8_0)
    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    for i, kinds in enumerate(layer_types):
        for name, type_name in zip(NAMES, kinds, strict=True):
            raw = random_tensor(type_name, *shape_of(name), seed=100 * i + NAMES.index(name))
            writer.add_tensor(f"blk.{i}.{name}.weight", raw, raw_dtype=GGML[type_name])
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def forward(model, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the final hidden states, the logits) of ``tokens`` run alone in a fresh cache."""
    c = model.config
    cache = KVCache(c.num_layers, 4, 16, c.num_kv_heads, c.head_dim, model.dtype)
    table = [3, 1, 0, 2]  # 64 positions, blocks out of order
    hidden = model(RaggedBatch(torch.tensor(tokens), torch.arange(len(tokens)), [table], [0], [len(tokens)]), cache)
    return hidden.float(), model.logits(hidden).float()


TOKENS = [3, 17, 42, 5, 63, 0, 8, 8, 21]


def assert_near_the_float32_model(weights: WeightSet, ours: LlamaModel, kernels: Kernels) -> None:
    """``ours`` (bfloat16, on our kernels) against the float32 model of ``weights``.

    The tolerance: the final hidden states (what the head reads) within 1.5x the error of
    the dense bfloat16 model (torch's linears over bfloat16-rounded weights, our other
    kernels) on the same weights, relative in norm, plus 1e-3 (measured on the GGUF of
    every block type: ours 0.52%, dense bfloat16 0.60%: both are the bfloat16 activations'
    rounding at every layer). A wrong layout, scale or permutation gives errors of order
    100%. The logits are compared by their argmax and top value only: a quantized head's
    coarse pass gives the rest (its top candidates are refined in float32,
    LlamaModel.logits). Batch invariance through the whole model: a prefix's last position
    has the same bits run alone as inside the longer call.
    """
    reference_model = build_model(weights, ModelConfig(dtype="float32", quantization="none"))
    dense_bf16 = build_model(weights, ModelConfig(dtype="bfloat16", quantization="none"),
                             dataclasses.replace(kernels, float_matmul=None))
    assert all(linear.quantized is None for layer in dense_bf16.layers
               for linear in (layer.qkv, layer.o, layer.gate_up, layer.down))
    want_hidden, want_logits = forward(reference_model, TOKENS)
    hidden, got_logits = forward(ours, TOKENS)

    def relative(h: torch.Tensor) -> float:
        return float((h - want_hidden).norm() / want_hidden.norm())

    dense_error = relative(forward(dense_bf16, TOKENS)[0])
    assert relative(hidden) <= 1.5 * dense_error + 1e-3, (relative(hidden), dense_error)
    assert torch.equal(got_logits.argmax(-1), want_logits.argmax(-1))
    assert torch.allclose(got_logits.amax(-1), want_logits.amax(-1), rtol=0.02, atol=0.05)
    assert torch.equal(forward(ours, TOKENS[:5])[0][-1], hidden[4])
