"""Qwen3, Gemma 2 and Gemma 3 GGUF files (and a Llama 3 one with rope_freqs), written the way llama.cpp's converter writes them
(its tensor names, no q/k row permutation for these architectures, Gemma's norm weights
stored as 1 + w, the ``{arch}.*`` metadata keys), read by speclane and compared with the
transformers model they were written from (float32, F32 tensors).

Gemma 3's file carries only what llama.cpp writes: the sliding layers follow its fixed
pattern (every 6th layer global), their rope base its 10000, the query scale head_dim.
Gemma 2's alternate (every 2nd layer global). The transformers model is made with those
values. For Gemma, transformers' own GGUF reader (``gguf_file=``) is the check that the
file follows llama.cpp's conventions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from family_models import VOCAB, widen
from speclane.config import ModelConfig
from speclane.models.build import build_model
from speclane.models.loader import ModelLoadError, read_weights

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from test_families import LOGITS_ATOL, _ragged_difference  # noqa: E402

_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "input_layernorm": "attn_norm"}
_LLAMA_NORMS = {"post_attention_layernorm": "ffn_norm"}
_GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}


def _llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter's q/k row order for the llama architecture (LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: Path, arch: str, hf, keys: dict, extra: dict | None = None) -> Path:
    cfg = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    writer.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    writer.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    writer.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    writer.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", head_dim)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    writer.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    for name, value in keys.items():
        add = {float: writer.add_float32, str: writer.add_string}.get(type(value), writer.add_uint32)
        add(f"{arch}.{name}", value)
    names = {**_NAMES, **(_GEMMA_NORMS if arch.startswith("gemma") else _LLAMA_NORMS)}
    for name, tensor in hf.state_dict().items():
        tensor = tensor.float()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            tensor = tensor + 1  # llama.cpp's Gemma converter stores the scale 1 + w
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            tensor = _llama_cpp_permute(tensor, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{names[module]}.{kind}"
        writer.add_tensor(out, np.ascontiguousarray(tensor.numpy()))
    for name, tensor in (extra or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(tensor.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _qwen3():
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})), {"rope.freq_base": 1e6}


def _gemma3():
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=128,
        sliding_window=8, sliding_window_pattern=6,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})), {
        "rope.freq_base": 1e6, "attention.sliding_window": 8}


def _gemma2():
    # transformers' GGUF reader takes Gemma2Config's soft-caps (50, 30) and query scale (256)
    # where llama.cpp writes keys for them: the same values here keep it a check of the file.
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=128,
        sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})), {
        "rope.freq_base": 1e4, "attention.sliding_window": 8, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0}


@pytest.mark.parametrize("arch, make", [("gemma2", _gemma2), ("gemma3", _gemma3)])
def test_a_gemma_gguf_without_a_sliding_window_key_takes_llama_cpps_default(tmp_path, monkeypatch, arch, make):
    """Gemma 2: 4096 (past this file's 128 positions: no layer slides); Gemma 3: none (its
    converter leaves the key out where no layer slides)."""
    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
    hf, keys = make()
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, hf.float(), {k: v for k, v in keys.items()
                                                                      if k != "attention.sliding_window"})
    assert read_weights(str(path)).config.traits.layer_windows == ()


@pytest.mark.parametrize("arch, make", [("qwen3", _qwen3), ("gemma2", _gemma2), ("gemma3", _gemma3)])
def test_a_gguf_of_the_family_matches_transformers(tmp_path, monkeypatch, arch, make):
    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
    torch.manual_seed(0)
    hf, keys = make()
    hf = hf.float().eval()
    widen(hf)
    path = _write_gguf(tmp_path / f"{arch}.gguf", arch, hf, keys)
    weights = read_weights(str(path))
    assert weights.config.architecture == arch and weights.config.head_dim == hf.config.head_dim
    if arch.startswith("gemma"):
        windows = (8, 0, 8) if arch == "gemma2" else (8, 8, 8, 8, 8, 0, 8)
        assert weights.config.traits.layer_windows == windows
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
        ids = torch.arange(3, 33)[None]
        with torch.inference_mode():
            torch.testing.assert_close(theirs(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)  # the file is llama.cpp's
    ours = build_model(weights, ModelConfig(dtype="float32", quantization="none"))
    worst = _ragged_difference(hf, ours)
    assert worst < LOGITS_ATOL, f"{arch}: max abs logit difference {worst:.3g}"


def test_gguf_rope_it_does_not_read_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
    hf, keys = _qwen3()
    path = _write_gguf(tmp_path / "yarn.gguf", "qwen3", hf, {**keys, "rope.scaling.type": "yarn"})
    with pytest.raises(ModelLoadError, match="unsupported GGUF rope scaling type 'yarn'"):
        read_weights(str(path))


def test_a_llama_3_gguf_with_rope_freqs_matches_transformers(tmp_path, monkeypatch):
    """llama.cpp writes Llama 3.1's rope scaling as a rope_freqs tensor (one divisor per
    frequency: default / scaled inverse frequency); without it the positions rotate as an
    unscaled Llama's (the control below)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rope_parameters=rope, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).float().eval()
    widen(hf)
    plain = transformers.LlamaConfig(**{**config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})
    factors = LlamaRotaryEmbedding(plain).inv_freq / LlamaRotaryEmbedding(config).inv_freq
    assert factors.max() > 7  # the scaling matters at these frequencies
    keys = {"rope.freq_base": 500000.0}
    weights = read_weights(str(_write_gguf(tmp_path / "llama3.gguf", "llama", hf, keys, {"rope_freqs.weight": factors})))
    assert dict(weights.config.rope_scaling)["rope_type"] == "freq_factors" and "rope_freqs.weight" not in weights.dense
    worst = _ragged_difference(hf, build_model(weights, ModelConfig(dtype="float32", quantization="none")))
    assert worst < LOGITS_ATOL, f"max abs logit difference {worst:.3g}"

    unscaled = read_weights(str(_write_gguf(tmp_path / "plain.gguf", "llama", hf, keys)))
    model = build_model(unscaled, ModelConfig(dtype="float32", quantization="none"))
    with pytest.raises(AssertionError):  # argmax or logits differ
        assert _ragged_difference(hf, model) < 0.1
