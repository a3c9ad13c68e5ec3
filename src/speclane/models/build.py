"""Turn a ``WeightSet`` into a runnable ``LlamaModel`` with the requested dtype and kernels.

Quantization (``--quantization``):
- ``auto`` (effective mode ``file`` for a GGUF with blocks our kernels run, else ``none``):
  a GGUF's weights of a type our kernels run (``models/gguf_types.py``) run on the file's
  own values (bfloat16 only): Q4_0, Q4_1 and Q4_K on the int4 kernel, Q8_0, Q6_K and Q5_*
  on the int8-group kernel, F32, F16 and BF16 on the float-weight kernel, as do a Hugging
  Face folder's layer weights in their safetensors float type; everything else dense,
  nothing quantized on load. The token embedding is looked up from its blocks, and the
  output head's coarse pass runs on its blocks with a float32 refinement of its top
  candidates from their exact rows.
- ``int4`` / ``int8`` (opt-in, logged): every layer linear quantized (int4 runs a GGUF's
  own blocks as auto does, and quantizes the rest, float weights included, to int4
  groups; int8 quantizes every layer per channel), and a dense output head with them.
- ``none``: no quantization: under ``--dtype bfloat16`` the layer weights kept in their
  source's float type run on the float-weight kernel as under auto, the rest (blocks
  dequantized) dense in bfloat16; under ``--dtype float32`` every weight dense in float32
  (the float32 reference path of the tests).
Layers on our kernels run them at every batch width (batch-invariant results).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from speclane.config import ModelConfig
from speclane.kernels import int4_cpu
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

log = logging.getLogger(__name__)

# Rope rows past the served length: draft positions of a verify round (the engine's cache
# holds max_model_len + K + 1); the model grows its tables if a forward reaches further.
ROPE_MARGIN = 64


def effective_quantization(config: ModelConfig, weights: WeightSet) -> str:
    if config.dtype == "float32":
        if config.quantization in ("int4", "int8"):
            raise ModelLoadError(f"--quantization {config.quantization} runs bfloat16 kernels; use --dtype bfloat16 or --quantization none")
        return "none"
    if config.quantization == "auto":
        return "file" if weights.quantized else "none"
    return config.quantization


def check_layer_shapes(weights: WeightSet) -> None:
    """``ModelLoadError`` for a layer tensor whose shape disagrees with the model's config:
    the native forward (``forward_plan.py``) sizes its buffers from the config and each
    matmul from its weight, so a file whose tensors contradict its own metadata must not
    reach it (it would write past them)."""
    cfg = weights.config
    d, hidden, inter = cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    expected = {
        "self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
        "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
        "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.bias": (hidden,),
        "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden), "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
        "pre_feedforward_layernorm.weight": (hidden,), "post_feedforward_layernorm.weight": (hidden,),
        "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
    }
    for i in range(cfg.num_layers):
        for suffix, shape in expected.items():
            name = f"model.layers.{i}.{suffix}"
            actual = weights.shape_of(name)
            if actual is not None and actual != shape:
                raise ModelLoadError(f"{weights.source}: tensor {name} has shape {actual}, but the model's config "
                                     f"implies {shape}: the file is inconsistent")


def build_model(weights: WeightSet, config: ModelConfig, kernels: Kernels | None = None) -> LlamaModel:
    """``kernels``: the kernels to run (A/B benchmarks, tests); default, those of ``config.kernels``."""
    check_layer_shapes(weights)
    dtype = torch.float32 if config.dtype == "float32" else torch.bfloat16
    mode = effective_quantization(config, weights)
    cfg = weights.config
    if kernels is None:
        # Picked once, here: a kernel that cannot run under --kernels native is a start-up
        # error, not a failure at the first forward in the engine thread. A float32 model
        # without quantization runs none of ours (they are bfloat16 kernels).
        kernels = (Kernels.load(config.kernels, matmul_inputs=config.matmul_inputs, head_inputs=config.head_inputs,
                                narrow_weights=config.narrow_weights)
                   if mode != "none" or dtype == torch.bfloat16 else Kernels())

    def take(name: str) -> torch.Tensor:
        try:
            return weights.float_weight(name)
        except KeyError:
            raise ModelLoadError(f"{weights.source}: missing tensor {name}") from None

    # Under bfloat16 a layer's weights kept in their source's float type (F32, F16, BF16)
    # run on our float kernel as they are, unless --quantization int4 or int8 asks for every
    # layer quantized.
    own_floats = dtype == torch.bfloat16 and config.quantization in ("auto", "none")

    def own_values(names: list[str], kernels: Kernels = kernels) -> NativeWeight | None:
        """The layer on the source's own values: runs of consecutive parts of one kind fused
        into one weight (the default model's q/k/v: one int4 weight), or None where a part
        has no own values to run here (dense, or blocks outside int4 mode) or no kernel of
        ours (of ``kernels``) runs it."""
        runs: list[tuple[str, list[QuantizedTensor | FloatTensor]]] = []
        for name in names:
            part: QuantizedTensor | FloatTensor
            if mode in ("file", "int4") and name in weights.quantized:
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
        return fused[0] if len(fused) == 1 else SplitWeight(fused, kernels.norm_library)

    def linear(names: list[str], bias_names: list[str] | None = None) -> Linear:
        bias = torch.cat([take(n) for n in bias_names]).to(dtype) if bias_names else None
        quantized: NativeWeight | Int8Weight | None = own_values(names)
        if quantized is None:
            dense = torch.cat([take(n) for n in names], dim=0)  # [out, in]
            if mode == "int4" and dense.shape[1] % INT4_GROUP == 0:
                quantized = Int4Weight(*quantize_int4_groups(dense), kernels)
                requantized.append(names[0])
            elif mode == "int8":
                quantized = Int8Weight(dense)
                requantized.append(names[0])
        if quantized is not None:
            # One kernel at every width: a row's result must not depend on its neighbours
            # (batch-invariant greedy output); our int4 kernel is also faster than a dense
            # float32 matmul at every width measured here.
            return Linear(None, quantized, bias)
        return Linear(dense.to(dtype).contiguous(), None, bias)

    requantized: list[str] = []  # layer weights quantized on load (opt-in: --quantization int4 / int8)
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
        # Llama's attention_bias puts one on o_proj too (Qwen2's q/k/v only): applied where the file has it.
        o_bias = [p + "self_attn.o_proj.bias"] if p + "self_attn.o_proj.bias" in weights else None
        layers.append(
            Layer(
                cfg,
                qkv=linear(attn, bias),
                o=linear([p + "self_attn.o_proj.weight"], o_bias),
                gate_up=linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                down=linear([p + "mlp.down_proj.weight"]),
                attn_norm=norm(p + "input_layernorm.weight"),
                mlp_norm=norm(mlp_norm),
                index=i,
                **extra,
            )
        )
    if requantized:
        log.info("--quantization %s: %d layer weights quantized on load from their float values (first: %s)",
                 mode, len(requantized), requantized[0])
    embed, lm_head = _embedding_and_head(weights, mode, dtype, kernels, own_values, take)
    model = LlamaModel(cfg, embed, layers, norm("model.norm.weight"), lm_head, dtype, kernels, quantization=mode,
                       rope_positions=min(cfg.max_position_embeddings, config.max_model_len + ROPE_MARGIN))
    if config.argmax_screen == "int4":
        model.argmax_screen = argmax_screen(lm_head, cfg.vocab_size, cfg.hidden_size, kernels.for_head)
    return model


SCREEN_CHUNK = 8192  # head rows read back and quantized at a time: a bounded float32 copy
SCREEN_BYTES_PER_WEIGHT = 20 / 32  # int4 groups of 32: 16 bytes of values, a float16 scale and minimum
# The screen is made where it reads at most this share of the head's bytes (a Q8_0 head:
# 0.59; bfloat16: 0.31); it costs its bytes in memory beside the head, which it must keep.
SCREEN_MAX_SHARE = 0.75


def argmax_screen(head: Linear, vocab: int, hidden: int, kernels: Kernels) -> Linear | None:
    """An int4 copy of ``head`` ([vocab, hidden]; int4 groups of its exact rows) on our int4
    kernel, for rows read for their largest logit alone (``LlamaModel.logits``), or None
    where it would not help: a float32 head (exact as it is), a head already int4 or of 5
    or 6 bits (the copy would read more than ``SCREEN_MAX_SHARE`` of its bytes), or no int4
    kernel of ours.

    Why: the output head is the largest single matmul of a small model's step (the default
    model's Q8_0 head, 30 MB, beside 66 MB of layers), and a greedy row only needs the head
    to find its top candidates, which are then recomputed exactly from the head's own rows.
    From int4 groups the float32 argmax ranked at worst 9th among the coarse logits at the
    default model's 8,619 accuracy positions (docs/design.md, "A greedy row reads an int4
    copy of the head"), inside the 32 refined; the coarse tail is further from float32 than
    the int8 head's, which is why rows that read the distribution (sampling, logprobs,
    penalties, grammars) keep the head.
    """
    if head.quantized is None and head.dense.dtype == torch.float32:
        return None
    if isinstance(head.quantized, Int4Weight) or kernels.int4 is None:
        return None
    if vocab % int4_cpu.LANES or hidden % INT4_GROUP:
        return None
    if vocab * hidden * SCREEN_BYTES_PER_WEIGHT > SCREEN_MAX_SHARE * head.nbytes:
        return None  # a 5- or 6-bit head: the copy's memory would buy little speed
    parts = [quantize_int4_groups(head.rows(torch.arange(start, min(start + SCREEN_CHUNK, vocab))))
             for start in range(0, vocab, SCREEN_CHUNK)]
    q, scale, minimum = (torch.cat([part[i] for part in parts]) for i in range(3))
    log.info("output head: an int4 copy screens greedy rows' candidates (%.1f MB; --argmax-screen off drops it)",
             q.numel() * SCREEN_BYTES_PER_WEIGHT / 1e6)
    return Linear(None, Int4Weight(q, scale, minimum, kernels))


def _embedding_and_head(weights: WeightSet, mode: str, dtype: torch.dtype, kernels: Kernels,
                        own_values: Callable[[list[str], Kernels], NativeWeight | None],
                        take: Callable[[str], torch.Tensor]) -> tuple[Linear, Linear]:
    """The token embedding and the output head, each a ``Linear`` whose rows the model
    reads (``Linear.rows``: embedding lookups, the head's exact refinement).

    On the file's own blocks where a kernel of ours runs them (``mode`` file or int4): the
    embedding is looked up from them and the head's coarse pass runs
    on them, refined from their exact rows; a tied head is the embedding itself, one copy.
    Otherwise dense: the embedding in ``dtype``; under ``--quantization int4`` / ``int8``
    the head quantized from its float32 weights (int4 groups, or int8 per channel),
    keeping that float32 copy for the refinement; else the head dense in ``dtype``.
    A head on our int4 or int8-group kernel runs on ``kernels.for_head`` (``--head-inputs``),
    and so does the embedding it is tied to (its lookups read either layout).
    """
    cfg = weights.config
    embed_name, head_name = "model.embed_tokens.weight", "lm_head.weight"
    tied = cfg.tie_word_embeddings or head_name not in weights
    head_kernels = kernels.for_head
    blocks = own_values([embed_name], head_kernels if tied else kernels)
    embed = Linear(None, blocks) if blocks is not None else Linear(take(embed_name).to(dtype).contiguous())
    if tied and blocks is not None:
        return embed, embed
    head_blocks = None if tied else own_values([head_name], head_kernels)
    if head_blocks is not None:
        return embed, Linear(None, head_blocks)
    head = take(embed_name if tied else head_name)
    if mode in ("none", "file"):  # quantizing on load is opt-in
        return embed, embed if tied and embed.dense is not None and embed.dense.dtype == dtype else Linear(
            head.to(dtype).contiguous())
    # The head's coarse pass on the layers' kernel: int4 reads a quarter of the bytes of
    # float32 and runs ~1.8x faster than int8 here at one row (the default model's head is
    # 28M of its 135M weights); the float32 refinement keeps greedy choices exact.
    log.info("output head: quantized to %s from its float weights (a float32 copy refines its top logits)", mode)
    coarse = Int4Weight(*quantize_int4_groups(head), head_kernels) if mode == "int4" else Int8Weight(head)
    return embed, Linear(head.float().contiguous(), coarse)


def _block_kernel(part: QuantizedTensor, kernels: Kernels) -> str | None:
    """The kernel that runs a weight's own blocks: ``int4`` for int4 blocks whose scales and
    minimums fit float16 (the int4 kernel keeps them so; Q4_K's d * sc may not), else
    ``int8/<group>/<minimum>`` where our int8 kernel runs (it holds 0..15 as well, in float32
    scales), else None (the layer is quantized from its dequantized values)."""
    if part.kernel == "int4" and part.group == INT4_GROUP:
        fits = bool(torch.isfinite(part.scale.half()).all()) and bool(torch.isfinite(part.minimum.half()).all())
        if fits:
            return "int4"
    if GroupInt8Weight.supports(part.shape[0], kernels, part.shape[1]):
        return f"int8/{part.group}/{part.minimum is not None}"
    return None


def _native_weight(kind: str, parts: list[QuantizedTensor | FloatTensor], kernels: Kernels
                   ) -> Int4Weight | GroupInt8Weight | FloatWeight:
    """One weight of ``parts`` (one kind: ``_block_kernel``'s, or ``float/<type>``) stacked by rows."""
    if kind.startswith("float/"):
        values = [p.values for p in parts if isinstance(p, FloatTensor)]
        return FloatWeight(values[0] if len(values) == 1 else torch.cat(values), kernels)
    def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors)  # one part: no copy

    blocks = [p for p in parts if isinstance(p, QuantizedTensor)]
    q = stacked([p.q for p in blocks])
    scale = stacked([p.scale for p in blocks])
    minimum = None if blocks[0].minimum is None else stacked([p.minimum for p in blocks])
    if kind == "int4":
        return Int4Weight(q, scale, minimum, kernels)
    return GroupInt8Weight(q.to(torch.int8), scale, minimum, kernels)


def file_weight(part: QuantizedTensor | FloatTensor, kernels: Kernels) -> Int4Weight | GroupInt8Weight | FloatWeight | None:
    """One weight's own blocks (or float values) on the kernel a model built from its file
    runs them on, or None where no kernel of ours runs them (``bench gguf`` times it)."""
    if isinstance(part, FloatTensor):
        return FloatWeight(part.values, kernels) if FloatWeight.supports(part.shape[0], kernels) else None
    kind = _block_kernel(part, kernels)
    return None if kind is None else _native_weight(kind, [part], kernels)
