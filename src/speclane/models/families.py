"""Model families of a Hugging Face config.json: Llama, Mistral, Qwen2, Qwen3, Phi-3,
Gemma 2 and Gemma 3, read into one ``LlamaConfig`` (its ``FamilyTraits`` hold what the
family changes in the forward), and their tensor names mapped onto the Llama layout.

A config field that changes the model's arithmetic is either read here or refused with a
``ModelLoadError`` naming it; the ones read with a decision of our own (a window that
covers every position, LongRoPE's short factors, a Llama config's ``sliding_window``)
are logged. Fields that do not change the forward (dropout, initializer, token ids,
``use_cache``...) are not looked at.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speclane.models.llama import FamilyTraits, LlamaConfig
from speclane.models.weights import ModelLoadError

log = logging.getLogger(__name__)

# config.json's architectures[0] (or model_type) -> family.
ARCHITECTURES = {
    "llama": "llama",
    "LlamaForCausalLM": "llama",
    "mistral": "mistral",
    "MistralForCausalLM": "mistral",
    "qwen2": "qwen2",
    "Qwen2ForCausalLM": "qwen2",
    "qwen3": "qwen3",
    "Qwen3ForCausalLM": "qwen3",
    "phi3": "phi3",
    "Phi3ForCausalLM": "phi3",
    "gemma2": "gemma2",
    "Gemma2ForCausalLM": "gemma2",
    "gemma3_text": "gemma3",
    "Gemma3ForCausalLM": "gemma3",
}

ROPE_TYPES = ("default", "linear", "llama3", "longrope")  # what llama.rope_inv_freq computes
GEMMA = ("gemma2", "gemma3")


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    return value is None or value in neutral


# Fields that change the forward of some family, with the values that leave a Llama
# forward as it is. A family that reads a field lists it in _READS.
_MATH_FIELDS: dict[str, tuple[Any, ...]] = {
    "attn_logit_softcapping": (0, 0.0),
    "final_logit_softcapping": (0, 0.0),
    "query_pre_attn_scalar": (),
    "use_bidirectional_attention": (False,),
    "partial_rotary_factor": (1, 1.0),
    "mlp_bias": (False,),
    "embedding_multiplier": (1, 1.0),
    "logits_scaling": (1, 1.0),
    "residual_multiplier": (1, 1.0),
    "attention_multiplier": (),
    "no_rope_layers": (),
    "use_qk_norm": (False,),
    "qk_layernorm": (False,),
}
_READS: dict[str, set[str]] = {
    "llama": set(),
    "mistral": set(),
    "qwen2": set(),
    "qwen3": set(),
    "phi3": set(),
    "gemma2": {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"},
    "gemma3": {"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"},
}


def family_of(cfg: dict[str, Any], source: Path) -> str:
    arch = (cfg.get("architectures") or [cfg.get("model_type", "?")])[0]
    if arch not in ARCHITECTURES:
        if arch == "Gemma3ForConditionalGeneration":
            raise ModelLoadError(f"{source}: {arch} is Gemma 3's image-and-text model; only its text-only "
                                 "checkpoints (Gemma3ForCausalLM, e.g. gemma-3-270m or gemma-3-1b) are supported")
        raise ModelLoadError(f"{source}: unsupported architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


# -- rope ------------------------------------------------------------------------------------
def rope_settings(cfg: dict[str, Any], source: Path | str, layer_type: str | None = None) -> tuple[float, dict[str, Any]]:
    """The rope base and scaling of a config.json. transformers 5 keeps both under
    ``rope_parameters`` (``rope_theta`` inside it), per layer type where the family has
    several (Gemma 3: ``full_attention``, ``sliding_attention``; pass ``layer_type``);
    older configs keep ``rope_theta`` and ``rope_scaling`` at the top. A shape this loader
    does not understand (per-layer-type parameters without a layer type, a layer type it
    lacks, no base, two bases that disagree) is an error, never a default."""
    params = cfg.get("rope_parameters")
    if params is None:
        return float(cfg.get("rope_theta", 10000.0)), dict(cfg.get("rope_scaling") or {})
    if not isinstance(params, dict):
        raise ModelLoadError(f"{source}: rope_parameters is not a mapping: {params!r}")
    nested = any(isinstance(v, dict) for v in params.values())
    if nested:
        if layer_type is None:
            raise ModelLoadError(f"{source}: rope_parameters per layer type are not supported for this family: {params!r}")
        if not isinstance(params.get(layer_type), dict) or not all(isinstance(v, dict) for v in params.values()):
            raise ModelLoadError(f"{source}: rope_parameters has no {layer_type!r} entry (or mixes flat and per-type keys): {params!r}")
        params = params[layer_type]
    if "rope_theta" not in params:
        raise ModelLoadError(f"{source}: rope_parameters has no rope_theta: {params!r}")
    theta = float(params["rope_theta"])
    if not nested and cfg.get("rope_theta") is not None and float(cfg["rope_theta"]) != theta:
        raise ModelLoadError(f"{source}: rope_theta {cfg['rope_theta']} and rope_parameters.rope_theta {theta} disagree")
    return theta, {k: v for k, v in params.items() if k != "rope_theta"}


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _checked_scaling(scaling: dict[str, Any], cfg: dict[str, Any], family: str, source: Path) -> tuple[dict[str, Any], int | None]:
    """A rope scaling dict this model computes, and the positions it can serve under it
    (None: the config's own). Unknown kinds and a partial rotary are errors."""
    scaling = dict(scaling)
    partial = scaling.pop("partial_rotary_factor", None)
    if not _neutral(partial, (1, 1.0)):
        raise ModelLoadError(f"{source}: partial_rotary_factor {partial} (rope on part of each head) is not supported")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "su" and family == "phi3":  # LongRoPE's first name (transformers reads it as longrope)
        kind = "longrope"
    if kind not in ROPE_TYPES:
        raise ModelLoadError(f"{source}: unsupported rope type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    scaling.pop("type", None)
    scaling["rope_type"] = kind
    if kind == "default":
        return {}, None
    if kind != "longrope":
        return scaling, None
    orig = scaling.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if not orig or "short_factor" not in scaling or "long_factor" not in scaling:
        raise ModelLoadError(f"{source}: longrope needs short_factor, long_factor and original_max_position_embeddings")
    max_pos = int(cfg.get("max_position_embeddings", orig))
    factor = scaling.get("factor") or max_pos / orig
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:  # transformers' default (the LongRoPE paper's)
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    if max_pos > orig:
        # transformers switches a whole forward to the long factors once a sequence passes
        # original_max_position_embeddings (keys cached under the short ones stay as they
        # were); one table cannot follow that, so the model serves the positions the short
        # factors cover.
        log.warning("%s: longrope: serving %d positions (original_max_position_embeddings) with the short factors, "
                    "not the config's %d", source, orig, max_pos)
    return {"rope_type": "longrope", "short_factor": list(scaling["short_factor"]),
            "attention_factor": float(attention_factor)}, int(orig)


# -- layers ----------------------------------------------------------------------------------
def _layer_types(cfg: dict[str, Any], family: str, num_layers: int, source: Path) -> list[str]:
    """``full_attention`` / ``sliding_attention`` per layer, as transformers derives them."""
    types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if types is None:
        if family in ("qwen2", "qwen3"):
            use = cfg.get("use_sliding_window", False) and window is not None
            first = int(cfg.get("max_window_layers", num_layers))
            types = ["sliding_attention" if use and i >= first else "full_attention" for i in range(num_layers)]
        elif family == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
        elif family == "gemma3":
            # transformers 4 configs on the Hub spell it with a leading underscore
            pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
        elif family in ("mistral", "phi3") and window is not None:
            types = ["sliding_attention"] * num_layers
        else:
            if window is not None:  # transformers' Llama has no window either
                log.warning("%s: sliding_window %s ignored: a Llama-architecture model attends to every position",
                            source, window)
            types = ["full_attention"] * num_layers
    if len(types) != num_layers:
        raise ModelLoadError(f"{source}: layer_types has {len(types)} entries for {num_layers} layers")
    unknown = set(types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ModelLoadError(f"{source}: unsupported layer types {sorted(unknown)} (supported: full_attention, sliding_attention)")
    if "sliding_attention" in types and not window:
        raise ModelLoadError(f"{source}: sliding_attention layers and no sliding_window")
    if family in ("qwen2", "qwen3") and "sliding_attention" in types and not cfg.get("use_sliding_window", False):
        raise ModelLoadError(f"{source}: layer_types names sliding layers and use_sliding_window is false")
    return list(types)


def _activation(cfg: dict[str, Any], family: str, source: Path) -> str:
    names = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
    key = "hidden_activation" if family in GEMMA and cfg.get("hidden_activation") else "hidden_act"
    default = "gelu_pytorch_tanh" if family in GEMMA else "silu"
    value = cfg.get(key) or default
    if value not in names:
        raise ModelLoadError(f"{source}: unsupported {key} {value!r} (supported: {', '.join(names)})")
    return names[value]


def hf_config(cfg: dict[str, Any], source: Path) -> LlamaConfig:
    """The ``LlamaConfig`` of a config.json, or a ModelLoadError naming what we do not run."""
    family = family_of(cfg, source)
    for name, neutral in _MATH_FIELDS.items():
        if name in cfg and name not in _READS[family] and not _neutral(cfg[name], neutral):
            raise ModelLoadError(f"{source}: {name} = {cfg[name]!r} is not supported for {family} models")
    num_layers = int(cfg["num_hidden_layers"])
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    max_pos = int(cfg.get("max_position_embeddings", 2048))

    types = _layer_types(cfg, family, num_layers, source)
    if family == "gemma3" and isinstance(cfg.get("rope_parameters"), dict) and any(
            isinstance(v, dict) for v in cfg["rope_parameters"].values()):
        theta, scaling = rope_settings(cfg, source, "full_attention")
        local_theta, local_scaling = rope_settings(cfg, source, "sliding_attention")
    else:
        theta, scaling = rope_settings(cfg, source)
        local_theta, local_scaling = theta, {}
        if family == "gemma3":  # old-style keys: rope_theta (global), rope_local_base_freq
            theta = float(cfg.get("rope_theta", 1_000_000.0))
            local_theta = float(cfg.get("rope_local_base_freq", 10_000.0))
    scaling, served = _checked_scaling(scaling, cfg, family, source)
    local_scaling, _ = _checked_scaling(local_scaling, cfg, family, source)
    if local_scaling.get("rope_type") == "longrope":
        raise ModelLoadError(f"{source}: longrope on sliding layers is not supported")
    if served is not None:
        max_pos = min(max_pos, served)

    window = int(cfg.get("sliding_window") or 0)
    if window and window >= max_pos:
        log.info("%s: sliding_window %d covers all %d positions: every layer attends globally", source, window, max_pos)
    windows = tuple(window if t == "sliding_attention" and window < max_pos else 0 for t in types)
    gemma = family in GEMMA
    if gemma and cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{source}: use_bidirectional_attention (an encoder's mask) is not supported")
    traits = FamilyTraits(
        qk_norm=family in ("qwen3", "gemma3"),
        norm_offset=1.0 if gemma else 0.0,
        # transformers multiplies by sqrt(hidden) rounded to the weights' dtype (float32 here).
        embed_scale=float(torch.tensor(hidden**0.5, dtype=torch.float32)) if gemma else 1.0,
        activation=_activation(cfg, family, source),
        sandwich_norms=gemma,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or head_dim) if gemma else 0.0,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0) if gemma else 0.0,
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0) if gemma else 0.0,
        layer_windows=windows if any(windows) else (),
        sliding_rope_theta=local_theta if family == "gemma3" and any(windows) else 0.0,
        sliding_rope_scaling=tuple(sorted((k, _frozen(v)) for k, v in local_scaling.items())) if family == "gemma3" else (),
    )
    return LlamaConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6 if gemma else 1e-5)),
        rope_theta=theta,
        rope_scaling=tuple(sorted((k, _frozen(v)) for k, v in scaling.items())),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
        architecture=family,
        explicit_head_dim=head_dim if head_dim * heads != hidden else 0,
        traits=traits,
    )


# -- tensors ---------------------------------------------------------------------------------
def _split_phi3(config: LlamaConfig, dense: dict[str, torch.Tensor]) -> None:
    """Phi-3's fused qkv_proj and gate_up_proj into the Llama names (build.py fuses them
    again in the same order: q, k, v and gate, up)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        qkv = dense.pop(p + "self_attn.qkv_proj.weight", None)
        if qkv is not None:
            if qkv.shape[0] != q + 2 * kv:
                raise ModelLoadError(f"{p}self_attn.qkv_proj.weight has {qkv.shape[0]} rows, not {q + 2 * kv}")
            for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv.split([q, kv, kv]), strict=True):
                dense[f"{p}self_attn.{name}.weight"] = part.contiguous()
        gate_up = dense.pop(p + "mlp.gate_up_proj.weight", None)
        if gate_up is not None:
            if gate_up.shape[0] != 2 * config.intermediate_size:
                raise ModelLoadError(f"{p}mlp.gate_up_proj.weight has {gate_up.shape[0]} rows, not {2 * config.intermediate_size}")
            gate, up = gate_up.split(config.intermediate_size)
            dense[p + "mlp.gate_proj.weight"], dense[p + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()


_TENSOR_MAPS: dict[str, Callable[[LlamaConfig, dict[str, torch.Tensor]], None]] = {"phi3": _split_phi3}


def to_llama_names(config: LlamaConfig, dense: dict[str, torch.Tensor]) -> None:
    """Rename (in place) a family's tensors to the names build.py reads."""
    mapper = _TENSOR_MAPS.get(config.architecture)
    if mapper is not None:
        mapper(config, dense)


# -- GGUF ------------------------------------------------------------------------------------
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")
# llama.cpp's Gemma values for what its converter does not write (llama-model.cpp): the
# sliding layer pattern, Gemma 3's sliding rope base, and the layer count of the 27B
# models, whose queries it scales by hidden / heads instead of head_dim.
_GEMMA_GGUF_PATTERN = {"gemma2": 2, "gemma3": 6}
_GEMMA3_GGUF_LOCAL_THETA = 10_000.0
_GEMMA_GGUF_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gguf_config(meta: dict[str, Any], tensor_names: set[str], path: Path) -> LlamaConfig:
    """The ``LlamaConfig`` of a GGUF's metadata (``general.architecture`` and the
    ``{arch}.*`` keys llama.cpp's converter writes), or a ModelLoadError."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"{path}: unsupported GGUF architecture {arch!r} (supported: {', '.join(GGUF_ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{name}")
        return value

    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ModelLoadError(f"{path}: unsupported GGUF rope scaling type {scaling_type!r} (supported: none, linear)")
    scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))} if scaling_type == "linear" else {}
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if meta.get(f"{arch}.{name}") and arch not in GEMMA:
            raise ModelLoadError(f"{path}: {arch}.{name} is not supported for {arch} models")

    vocab_size = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab_size:
        raise ModelLoadError(f"{path}: GGUF metadata lacks both {arch}.vocab_size and tokenizer.ggml.tokens")
    hidden, heads, layers = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    if int(meta.get(f"{arch}.attention.value_length") or head_dim) != head_dim:
        raise ModelLoadError(f"{path}: key and value heads of different sizes are not supported")
    max_pos = int(key("context_length", 2048))
    traits = FamilyTraits(qk_norm=arch == "qwen3")
    if arch in GEMMA:
        # llama.cpp's default where the key is absent: Gemma 2's 4096; a Gemma 3 file
        # without it (its converter leaves it out with no sliding layers) has no window.
        window = int(meta.get(f"{arch}.attention.sliding_window") or (4096 if arch == "gemma2" else 0))
        pattern = int(meta.get(f"{arch}.attention.sliding_window_pattern") or _GEMMA_GGUF_PATTERN[arch])
        windows = tuple(window if (i + 1) % pattern and 0 < window < max_pos else 0 for i in range(layers))
        local_theta = float(meta.get(f"{arch}.rope.freq_base_swa") or _GEMMA3_GGUF_LOCAL_THETA) if arch == "gemma3" else 0.0
        scalar = hidden / heads if layers == _GEMMA_GGUF_27B_LAYERS[arch] else head_dim
        log.info("%s: %s GGUF: sliding pattern %d, sliding rope base %g, query_pre_attn_scalar %g "
                 "(llama.cpp's values where the file has no key)", path, arch, pattern, local_theta, scalar)
        traits = FamilyTraits(
            qk_norm=arch == "gemma3",
            norm_offset=0.0,  # llama.cpp's converter stores Gemma's norm weights as 1 + w
            embed_scale=float(torch.tensor(hidden**0.5, dtype=torch.float32)),
            activation="gelu_tanh",
            sandwich_norms=True,
            query_pre_attn_scalar=float(scalar),
            attn_softcap=float(meta.get(f"{arch}.attn_logit_softcapping") or 0.0),
            final_softcap=float(meta.get(f"{arch}.final_logit_softcapping") or 0.0),
            layer_windows=windows if any(windows) else (),
            sliding_rope_theta=local_theta if any(windows) else 0.0,
        )
    gemma = arch in GEMMA
    return LlamaConfig(
        vocab_size=int(vocab_size),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", key("attention.head_count"))),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6 if gemma else 1e-5)),
        rope_theta=float(key("rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10000.0)),
        rope_scaling=tuple(sorted(scaling.items())),
        max_position_embeddings=max_pos,
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        architecture=arch,
        explicit_head_dim=head_dim if head_dim * heads != hidden else 0,
        traits=traits,
    )


def gguf_finish(config: LlamaConfig, dense: dict[str, torch.Tensor], path: Path) -> LlamaConfig:
    """What a GGUF keeps in tensors rather than metadata, taken out of ``dense``: llama.cpp's
    ``rope_freqs`` (Llama 3.1-style rope scaling written as one divisor per frequency)
    into the config; and Gemma's norms under the names build.py reads."""
    factors = dense.pop("rope_freqs.weight", None)
    if factors is not None:
        if config.rope_scaling:
            raise ModelLoadError(f"{path}: both a rope scaling type and a rope_freqs tensor")
        if factors.numel() != config.head_dim // 2:
            raise ModelLoadError(f"{path}: rope_freqs has {factors.numel()} values for {config.head_dim // 2} frequencies")
        config = dataclasses.replace(config, rope_scaling=(("factors", tuple(factors.double().tolist())),
                                                           ("rope_type", "freq_factors")))
    if config.architecture in GEMMA:
        _gemma_gguf_norms(config, dense)
    return config


def _gemma_gguf_norms(config: LlamaConfig, dense: dict[str, torch.Tensor]) -> None:
    """llama.cpp's ``ffn_norm`` (read as Llama's ``post_attention_layernorm``) is Gemma's
    pre-MLP norm, its ``post_attention_norm`` the attention output's."""
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        if p + "post_attention_layernorm.weight" in dense:
            dense[p + "pre_feedforward_layernorm.weight"] = dense.pop(p + "post_attention_layernorm.weight")
        if p + "post_attention_norm.weight" in dense:
            dense[p + "post_attention_layernorm.weight"] = dense.pop(p + "post_attention_norm.weight")
