"""A tiny random Llama and a word-level tokenizer, for tests of pure machinery.

Used where the real model would only make a test slow: statistics of sampling and
verification over thousands of generations, engine plumbing with fake weights.
"""

from __future__ import annotations

import tokenizers
import torch
from tokenizers import models, pre_tokenizers

from speclane.config import ModelConfig
from speclane.models.build import build_model
from speclane.models.llama import LlamaConfig, LlamaModel
from speclane.models.tokenizer import Tokenizer
from speclane.models.weights import WeightSet


def toy_config(vocab_size: int = 16, hidden_size: int = 32, num_layers: int = 2, max_positions: int = 256) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
    )


def toy_weights(config: LlamaConfig, seed: int = 0, scale: float = 1.0) -> WeightSet:
    gen = torch.Generator().manual_seed(seed)
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / shape[-1] ** 0.5

    dense = {"model.embed_tokens.weight": torch.randn(config.vocab_size, h, generator=gen), "model.norm.weight": torch.ones(h)}
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        dense[p + "self_attn.q_proj.weight"] = rand(config.num_heads * d, h)
        dense[p + "self_attn.k_proj.weight"] = rand(config.num_kv_heads * d, h)
        dense[p + "self_attn.v_proj.weight"] = rand(config.num_kv_heads * d, h)
        dense[p + "self_attn.o_proj.weight"] = rand(h, config.num_heads * d)
        dense[p + "mlp.gate_proj.weight"] = rand(i, h)
        dense[p + "mlp.up_proj.weight"] = rand(i, h)
        dense[p + "mlp.down_proj.weight"] = rand(h, i)
        dense[p + "input_layernorm.weight"] = torch.ones(h)
        dense[p + "post_attention_layernorm.weight"] = torch.ones(h)
    return WeightSet(config, dense, source="toy")


def toy_model(config: LlamaConfig | None = None, seed: int = 0) -> LlamaModel:
    config = config or toy_config()
    return build_model(toy_weights(config, seed), ModelConfig(dtype="float32", quantization="none"))


def toy_tokenizer(vocab_size: int = 16) -> Tokenizer:
    """Token i is the word ``t{i}``; token 0 is the end of sequence."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = None
    return Tokenizer(backend, bos_token_id=None, eos_token_id=0)
