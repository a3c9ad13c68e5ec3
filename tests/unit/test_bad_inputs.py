"""Bad input gives a clear error naming the problem, never a traceback from deep inside.

Weight files are crafted in ``tmp_path`` with ``gguf.GGUFWriter``; nothing here loads
the real model (the prompt-length and CLI cases are in tests/integration/test_cli.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from speclane.models.loader import ModelLoadError, read_weights, resolve_model
from speclane.request import SamplingParams

gguf = pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _no_weight_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # Test the parser itself, and keep crafted files out of the user's weight cache.
    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")


def write_gguf(path: Path, *, arch: str = "llama", tensor_type=None, metadata: bool = True) -> Path:
    """A tiny GGUF: one embedding tensor of ``tensor_type`` (default F32) and, if asked,
    the llama metadata our loader needs."""
    writer = gguf.GGUFWriter(str(path), arch)
    if metadata:
        writer.add_uint32(f"{arch}.embedding_length", 64)
        writer.add_uint32(f"{arch}.feed_forward_length", 128)
        writer.add_uint32(f"{arch}.block_count", 1)
        writer.add_uint32(f"{arch}.attention.head_count", 4)
        writer.add_uint32(f"{arch}.vocab_size", 32)
    if tensor_type is None:
        writer.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    else:  # raw bytes of a quantized type: rows of 64 weights in that type's blocks
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
        raw = np.zeros((32, 64 // block_weights * block_bytes), np.uint8)
        writer.add_tensor("token_embd.weight", raw, raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_valid_tiny_gguf_loads(tmp_path: Path):
    # The control for the cases below: the crafted file itself is fine.
    weights = read_weights(str(write_gguf(tmp_path / "ok.gguf")))
    assert list(weights.floats) == ["model.embed_tokens.weight"] and not weights.dense  # F32, kept in its type
    assert weights.config.hidden_size == 64 and weights.config.vocab_size == 32


def test_missing_weight_file(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        read_weights(str(tmp_path / "nowhere.gguf"))


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all" * 50, b"GGUF\x03\x00\x00\x00" + b"\xff" * 64])
def test_corrupt_weight_file(tmp_path: Path, content: bytes):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="broken.gguf is not a readable GGUF file"):
        read_weights(str(path))


def test_truncated_weight_file(tmp_path: Path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole[: len(whole) - 1000])  # the tensor data is cut short
    with pytest.raises(ModelLoadError, match="cut.gguf is not a readable GGUF file"):
        read_weights(str(path))


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match=r"unknown model 'no-such-model'.*smollm2-135m-instruct"):
        resolve_model("no-such-model")


def test_a_non_gguf_file_is_refused(tmp_path: Path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        read_weights(str(path))


def test_unsupported_gguf_architecture(tmp_path: Path):
    path = write_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF architecture 'gpt2' \(supported: llama, qwen2, qwen3, gemma2, gemma3\)"):
        read_weights(str(path))


@pytest.mark.parametrize("type_name", ["Q8_1", "Q8_K"])
def test_unsupported_gguf_tensor_type(tmp_path: Path, type_name: str):
    path = write_gguf(tmp_path / "odd.gguf", tensor_type=gguf.GGMLQuantizationType[type_name])
    with pytest.raises(ModelLoadError, match=f"tensor token_embd.weight has unsupported type {type_name}"):
        read_weights(str(path))


def test_gguf_without_model_metadata(tmp_path: Path):
    path = write_gguf(tmp_path / "bare.gguf", metadata=False)
    with pytest.raises(ModelLoadError, match="lacks"):
        read_weights(str(path))


def test_hugging_face_folder_errors(tmp_path: Path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        read_weights(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        read_weights(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
        read_weights(str(tmp_path))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"temperature": math.nan}, "temperature must be >= 0"),
        ({"temperature": math.inf}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": -0.5}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
        ({"top_p": math.nan}, r"top_p must be in \(0, 1\]"),
        ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"seed": -1}, "seed must be in"),
        ({"stop": ("",)}, "each stop string"),
        # Types (the Python API's): each would fail inside the engine's tick or in a comparison.
        ({"seed": 1.5}, "seed must be an integer or None"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"max_tokens": 8.0}, "max_tokens must be an integer"),
        ({"temperature": "0.7"}, "temperature must be a number"),
        ({"stop": None}, "stop must be a string or a sequence of strings"),
        ({"stop": [1]}, "stop must be a string or a sequence of strings"),
        ({"logit_bias": {5: 1.0}}, "logit_bias must be a sequence"),
        ({"ignore_eos": 1}, "ignore_eos must be a bool"),
        ({"logprobs": True}, "logprobs must be an integer or None"),
    ],
)
def test_invalid_sampling_values(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"prefix_cache": "no"}, "prefix_cache must be a bool"),  # a truthy string would leave the cache on
        ({"num_draft_tokens": 2.5}, "num_draft_tokens must be an integer"),
        ({"max_num_seqs": "4"}, "max_num_seqs must be an integer"),
        ({"spec_grant_ms": math.nan}, "spec_grant_ms must be a finite number"),
        ({"drafter": None}, "drafter must be a string"),
        ({"max_model_len": True}, "max_model_len must be an integer"),
    ],
)
def test_engine_options_of_the_wrong_type_are_refused(options: dict, message: str):
    from speclane.config import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig().replace(**options)
    EngineConfig().replace(spec_grant_ms=25, mtp_min_draft_prob=0)  # an int where a float is declared is fine


def test_a_nan_passes_no_lower_bound():
    from speclane.config import ClusterConfig

    for name in ("counter_sync_ms", "health_timeout_s"):
        with pytest.raises(ValueError, match=name):
            ClusterConfig(**{name: math.nan})


@pytest.mark.parametrize("weight", [0, -1.0, math.inf, math.nan, "1", True])
def test_a_request_of_a_tenant_weight_that_is_not_a_positive_number_is_refused(weight):
    from speclane.request import Request

    with pytest.raises(ValueError, match="tenant_weight"):
        Request(request_id="r", prompt_token_ids=[1, 2], tenant_weight=weight)


@pytest.mark.parametrize("grace", ["inf", "nan", "-1", "soon"])
def test_a_shutdown_grace_that_is_not_a_finite_number_of_seconds_is_refused(grace: str):
    from speclane.config import runtime_env

    with pytest.raises(ValueError, match="SPECLANE_SHUTDOWN_GRACE_S"):
        runtime_env({"SPECLANE_SHUTDOWN_GRACE_S": grace}).shutdown_grace_s(30.0)
    assert runtime_env({"SPECLANE_SHUTDOWN_GRACE_S": "0"}).shutdown_grace_s(30.0) == 0.0


def test_valid_sampling_edges():
    SamplingParams(temperature=0.0, top_p=1.0)
    SamplingParams(temperature=2.0, top_p=1e-6, top_k=1, seed=0)


def test_a_layer_tensor_that_contradicts_the_config_is_a_load_error():
    """The native forward sizes its buffers from the config: a file whose tensors disagree
    with its own metadata is refused before it runs, naming the tensor."""
    import torch

    from speclane.models.build import check_layer_shapes
    from speclane.models.llama import LlamaConfig
    from speclane.models.weights import WeightSet

    cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2)
    shapes = {"self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (32, 64), "self_attn.v_proj.weight": (32, 64),
              "self_attn.o_proj.weight": (64, 64), "mlp.gate_proj.weight": (128, 64), "mlp.up_proj.weight": (128, 64),
              "mlp.down_proj.weight": (64, 128), "input_layernorm.weight": (64,)}
    weights = WeightSet(cfg, {f"model.layers.0.{k}": torch.zeros(v) for k, v in shapes.items()}, source="m.gguf")
    check_layer_shapes(weights)  # consistent
    weights.dense["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 256)
    with pytest.raises(ModelLoadError, match=r"model.layers.0.mlp.down_proj.weight has shape \(64, 256\).*\(64, 128\)"):
        check_layer_shapes(weights)
