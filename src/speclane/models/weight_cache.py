"""A local cache of dequantized GGUF weights, so later starts skip GGUF parsing.

Parsing and dequantizing the default GGUF takes several seconds on a 2-core machine
(most of it ``gguf.GGUFReader`` building its field table); reading the same tensors
back from one safetensors file takes well under a second. The cache is keyed by the
file's absolute path, size and modification time, and written atomically, so a
changed or half-written file is never used. The caller passes the folder
(``RuntimeEnv.weight_cache_dir``: ``SPECLANE_CACHE_DIR`` moves it,
``SPECLANE_NO_WEIGHT_CACHE=1`` makes it None, which turns the cache off).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from speclane.models.gguf_types import FloatTensor, QuantizedTensor
from speclane.models.llama import LlamaConfig
from speclane.models.weights import WeightSet

# 2: quantized tensors of any native GGML type (q, scale, minimum); 3: F32, F16 and BF16
# matmul weights in their own type (FloatTensor); 4: the token embedding and output head in
# their blocks too
CACHE_VERSION = 4
_QUANTIZED = "quantized."
_FLOAT = "float."


def cache_path(source: Path, directory: Path) -> Path:
    stat = source.stat()
    key = f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{CACHE_VERSION}"
    return directory / (hashlib.sha1(key.encode()).hexdigest()[:20] + ".safetensors")


def load_cached(source: Path, directory: Path | None
                ) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict[str, QuantizedTensor], dict[str, FloatTensor]] | None:
    """``source``'s cached weights in ``directory`` (None: the cache is off), or None."""
    if directory is None:
        return None
    path = cache_path(source, directory)
    if not path.exists():
        return None
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        config_fields = json.loads(meta["config"])
        config = LlamaConfig.from_dict(config_fields)
        kinds = json.loads(meta.get("quantized", "{}"))
        float_types = json.loads(meta.get("floats", "{}"))
        # Copied out of the file's mapping: a tensor the model keeps as it is (a norm) would
        # otherwise keep the whole mapping resident beside the model's own copies.
        tensors = {name: t.clone() for name, t in load_file(str(path)).items()}
        dense = {k: v for k, v in tensors.items() if not k.startswith((_QUANTIZED, _FLOAT))}
        quantized = {
            name: QuantizedTensor(tensors[f"{_QUANTIZED}{name}.q"], tensors[f"{_QUANTIZED}{name}.scale"],
                                  tensors.get(f"{_QUANTIZED}{name}.minimum"), group, kernel, ggml_type)
            for name, (group, kernel, ggml_type) in kinds.items()
        }
        floats = {name: FloatTensor(tensors[f"{_FLOAT}{name}"], ggml_type) for name, ggml_type in float_types.items()}
    except Exception:  # a stale or damaged cache is simply rebuilt
        return None
    return config, dense, quantized, floats


def store(source: Path, weights: WeightSet, directory: Path | None) -> None:
    """Keep ``source``'s weights in ``directory`` (None: the cache is off)."""
    if directory is None:
        return
    from safetensors.torch import save_file

    path = cache_path(source, directory)
    tensors = {k: v.contiguous() for k, v in weights.dense.items()}
    kinds = {}
    for name, weight in weights.quantized.items():
        tensors[f"{_QUANTIZED}{name}.q"] = weight.q.contiguous()
        tensors[f"{_QUANTIZED}{name}.scale"] = weight.scale.contiguous()
        if weight.minimum is not None:
            tensors[f"{_QUANTIZED}{name}.minimum"] = weight.minimum.contiguous()
        kinds[name] = (weight.group, weight.kernel, weight.ggml_type)
    float_types = {}
    for name, weight in weights.floats.items():
        tensors[f"{_FLOAT}{name}"] = weight.values.contiguous()
        float_types[name] = weight.ggml_type
    meta = {"config": json.dumps(dataclasses.asdict(weights.config)), "source": str(source), "quantized": json.dumps(kinds),
            "floats": json.dumps(float_types)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    except OSError:  # a read-only or full disk only costs the next start some seconds
        return
