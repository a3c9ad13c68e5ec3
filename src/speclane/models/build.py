"""Turn a ``WeightSet`` into a runnable ``LlamaModel`` with the requested dtype and kernels.

Quantization (``--quantization``):
- ``auto``: a GGUF's layer weights of a type our kernels run (``models/gguf_types.py``)
  run on the file's own values (bfloat16 only): Q4_0, Q4_1 and Q4_K on the int4 kernel,
  Q8_0, Q6_K and Q5_* on the int8-group kernel, F32, F16 and BF16 on the float-weight
  kernel, as do a Hugging Face folder's layer weights in their safetensors float type;
  everything else dense. Where the file holds int4 or int8 blocks, the output head runs as
  int4 (coarse pass) with a float32 refinement of its top candidates.
- ``int4`` / ``int8``: every layer linear quantized (int4 runs a GGUF's own blocks as auto
  does, and quantizes the rest, float weights included, to int4 groups; int8 quantizes
  every layer per channel).
- ``none``: no quantization: under ``--dtype bfloat16`` the layer weights kept in their
  source's float type run on the float-weight kernel as under auto, the rest (blocks
  dequantized) dense in bfloat16; under ``--dtype float32`` every weight dense in float32
  (the float32 reference path of the tests).
Layers on our kernels run them at every batch width (batch-invariant results).
"""

from __future__ import annotations

import torch

from speclane.config import ModelConfig
from speclane.kernels.select import Kernels
from speclane.models.gguf_types import FloatTensor, QuantizedTensor
from speclane.models.linear import (
    INT4_GROUP,
    FloatWeight,
    GroupInt8Weight,
    Int4Weight,
    Int8Weight,
    Linear,
    SplitWeight,
    quantize_int4_groups,
)
from speclane.models.llama import Layer, LlamaModel
from speclane.models.loader import ModelLoadError
from speclane.models.weights import WeightSet

NativeWeight = Int4Weight | GroupInt8Weight | FloatWeight | SplitWeight  # a layer on its source's own values


def effective_quantization(config: ModelConfig, weights: WeightSet) -> str:
    if config.dtype == "float32":
        if config.quantization in ("int4", "int8"):
            raise ModelLoadError(f"--quantization {config.quantization} runs bfloat16 kernels; use --dtype bfloat16 or --quantization none")
        return "none"
    if config.quantization == "auto":
        return "int4" if weights.quantized else "none"
    return config.quantization


def build_model(weights: WeightSet, config: ModelConfig, kernels: Kernels | None = None) -> LlamaModel:
    """``kernels``: the kernels to run (A/B benchmarks, tests); default, those of ``config.kernels``."""
    dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16
    mode = effective_quantization(config, weights)
    cfg = weights.config
    if kernels is None:
        # Picked once, here: a kernel that cannot run under --kernels native is a start-up
        # error, not a failure at the first forward in the engine thread. A float32 model
        # without quantization runs none of ours (they are bfloat16 kernels).
        kernels = Kernels.load(config.kernels) if mode != "none" or dtype == torch.bfloat16 else Kernels()
    w = weights.dense

    def take(name: str) -> torch.Tensor:
        try:
            return weights.float_weight(name)
        except KeyError:
            raise ModelLoadError(f"{weights.source}: missing tensor {name}") from None

    # Under bfloat16 a layer's weights kept in their source's float type (F32, F16, BF16)
    # run on our float kernel as they are, unless --quantization int4 or int8 asks for every
    # layer quantized.
    own_floats = dtype == torch.bfloat16 and config.quantization in ("auto", "none")

    def own_values(names: list[str]) -> NativeWeight | None:
        """The layer on the source's own values: runs of consecutive parts of one kind fused
        into one weight (the default model's q/k/v: one int4 weight), or None where a part
        has no own values to run here (dense, or blocks outside int4 mode) or no kernel of
        ours runs it."""
        runs: list[tuple[str, list[QuantizedTensor | FloatTensor]]] = []
        for name in names:
            part: QuantizedTensor | FloatTensor
            if mode == "int4" and name in weights.quantized:
                part = weights.quantized[name]
                kind = _block_kernel(part, kernels)
            elif own_floats and name in weights.floats:
                part = weights.floats[name]
                kind = f"float/{part.ggml_type}" if FloatWeight.supports(part.shape[0], kernels) else None
            else:
                return None
            if kind is None:
                return None
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(part)
            else:
                runs.append((kind, [part]))
        fused = [_native_weight(kind, parts, kernels) for kind, parts in runs]
        return fused[0] if len(fused) == 1 else SplitWeight(fused)

    def linear(names: list[str], bias_names: list[str] | None = None) -> Linear:
        bias = torch.cat([take(n) for n in bias_names]).to(dtype) if bias_names else None
        quantized: NativeWeight | Int8Weight | None = own_values(names)
        if quantized is None:
            dense = torch.cat([take(n) for n in names], dim=0)  # [out, in]
            if mode == "int4" and dense.shape[1] % INT4_GROUP == 0:
                quantized = Int4Weight(*quantize_int4_groups(dense), kernels)
            elif mode == "int8":
                quantized = Int8Weight(dense)
        if quantized is not None:
            # One kernel at every width: a row's result must not depend on its neighbours
            # (batch-invariant greedy output); our int4 kernel is also faster than a dense
            # float32 matmul at every width measured here.
            return Linear(None, quantized, bias)
        return Linear(dense.to(dtype).contiguous(), None, bias)

    traits = cfg.traits

    def norm(name: str) -> torch.Tensor:
        """A norm weight as the model multiplies by it: Gemma stores w for a scale of 1 + w."""
        weight = take(name)
        return weight + traits.norm_offset if traits.norm_offset else weight  # float32: norms act on the float32 residual

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        if traits.sandwich_norms:  # Gemma: post_attention_layernorm is the attention output's norm
            mlp_norm, extra = p + "pre_feedforward_layernorm.weight", {
                "attn_out_norm": norm(p + "post_attention_layernorm.weight"),
                "mlp_out_norm": norm(p + "post_feedforward_layernorm.weight"),
            }
        else:
            mlp_norm, extra = p + "post_attention_layernorm.weight", {}
        if traits.qk_norm:
            extra["q_norm"] = norm(p + "self_attn.q_norm.weight")
            extra["k_norm"] = norm(p + "self_attn.k_norm.weight")
        attn = [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"]
        bias = [n.replace(".weight", ".bias") for n in attn] if cfg.attention_bias else None
        layers.append(
            Layer(
                cfg,
                qkv=linear(attn, bias),
                o=linear([p + "self_attn.o_proj.weight"]),
                gate_up=linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                down=linear([p + "mlp.down_proj.weight"]),
                attn_norm=norm(p + "input_layernorm.weight"),
                mlp_norm=norm(mlp_norm),
                index=i,
                **extra,
            )
        )
    embed = take("model.embed_tokens.weight")
    head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in w else w["lm_head.weight"]
    # The head's coarse pass uses the layers' kernel: int4 reads a quarter of the bytes of
    # float32 and runs ~1.8x faster than int8 here at one row (the head is 28M of the
    # model's 135M weights); the float32 refinement below keeps greedy choices exact.
    head_quant: Int4Weight | Int8Weight | None = None
    if mode == "int4":
        head_quant = Int4Weight(*quantize_int4_groups(head), kernels)
    elif mode == "int8":
        head_quant = Int8Weight(head)
    head_dtype = torch.float32 if head_quant is not None else dtype
    # The quantized head always runs coarse + float32 refinement of its top candidates
    # (LlamaModel.logits), at every width, for the same reason as above.
    lm_head = Linear(head.to(head_dtype).contiguous(), head_quant)
    model = LlamaModel(cfg, embed.to(dtype).contiguous(), layers, norm("model.norm.weight"), lm_head, dtype, kernels,
                       quantization=mode)
    return model


def _block_kernel(part: QuantizedTensor, kernels: Kernels) -> str | None:
    """The kernel that runs a weight's own blocks: ``int4`` for int4 blocks whose scales and
    minimums fit float16 (the int4 kernel keeps them so; Q4_K's d * sc may not), else
    ``int8/<group>/<minimum>`` where our int8 kernel runs (it holds 0..15 as well, in float32
    scales), else None (the layer is quantized from its dequantized values)."""
    if part.kernel == "int4" and part.group == INT4_GROUP:
        fits = bool(torch.isfinite(part.scale.half()).all()) and bool(torch.isfinite(part.minimum.half()).all())
        if fits:
            return "int4"
    if GroupInt8Weight.supports(part.shape[0], kernels):
        return f"int8/{part.group}/{part.minimum is not None}"
    return None


def _native_weight(kind: str, parts: list[QuantizedTensor | FloatTensor], kernels: Kernels
                   ) -> Int4Weight | GroupInt8Weight | FloatWeight:
    """One weight of ``parts`` (one kind: ``_block_kernel``'s, or ``float/<type>``) stacked by rows."""
    if kind.startswith("float/"):
        return FloatWeight(torch.cat([p.values for p in parts if isinstance(p, FloatTensor)]), kernels)
    blocks = [p for p in parts if isinstance(p, QuantizedTensor)]
    q = torch.cat([p.q for p in blocks])
    scale = torch.cat([p.scale for p in blocks])
    minimum = None if blocks[0].minimum is None else torch.cat([p.minimum for p in blocks])
    if kind == "int4":
        return Int4Weight(q, scale, minimum, kernels)
    return GroupInt8Weight(q.to(torch.int8), scale, minimum, kernels)
