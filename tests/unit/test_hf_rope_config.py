"""Rope settings of a Hugging Face config.json, old style and transformers 5's ``rope_parameters``.

A tiny random Llama saved by the installed transformers: speclane's rotary frequencies
must be transformers' own, whichever keys the config keeps them under.
"""

from __future__ import annotations

import json

import pytest
import torch

from speclane.models.llama import rope_inv_freq
from speclane.models.loader import ModelLoadError, read_hf_folder, rope_settings

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def _save_tiny_llama(path, **rope) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **rope)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def _transformers_inv_freq(path) -> torch.Tensor:
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(AutoConfig.from_pretrained(path)).inv_freq.double()


def test_rope_parameters_of_a_transformers_5_config_give_transformers_frequencies(tmp_path):
    _save_tiny_llama(tmp_path, rope_parameters={"rope_theta": 500000.0, **LLAMA3_ROPE})
    saved = json.loads((tmp_path / "config.json").read_text())
    weights = read_hf_folder(tmp_path)
    assert weights.config.rope_theta == 500000.0, saved  # not the silent 10000 of a missed key
    assert dict(weights.config.rope_scaling)["rope_type"] == "llama3"
    torch.testing.assert_close(rope_inv_freq(weights.config), _transformers_inv_freq(tmp_path), rtol=1e-6, atol=0)


def test_old_style_keys_still_read():
    theta, scaling = rope_settings({"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE}, "config.json")
    assert theta == 500000.0 and scaling == LLAMA3_ROPE
    assert rope_settings({}, "config.json") == (10000.0, {})


@pytest.mark.parametrize("cfg, message", [
    ({"rope_parameters": {"rope_type": "default"}}, "has no rope_theta"),
    ({"rope_theta": 10000.0, "rope_parameters": {"rope_theta": 500000.0}}, "disagree"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}},
     "per layer type"),
])
def test_rope_settings_it_cannot_read_are_errors(cfg, message):
    with pytest.raises(ModelLoadError, match=message):
        rope_settings(cfg, "config.json")
