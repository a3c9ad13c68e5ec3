"""Our float-weight kernel (kernels/float_x86.c) and the weights it runs: a GGUF's F32, F16
and BF16 matmul weights (models/gguf_types.py) and a Hugging Face folder's safetensors.

The bound, per output y of a row x (bfloat16) against ref = x @ W.T in float64 (W the
weight's exact values):
    |y - ref| <= 2^-8 |ref| + K 2^-24 (|x| @ |W|.T)
- 2^-8 |ref|: the bfloat16 output's rounding (half an ulp is at most 2^-9 of the value;
  2^-8 leaves room for the float32 sum's rounding before it);
- K 2^-24 (|x| @ |W|.T): K float32 FMAs, each rounding its running sum (at most
  |x| @ |W|.T in magnitude) once, by at most 2^-24 of it.
For float16 and bfloat16 weights every product with a bfloat16 input is exact in float32,
so the kernel's promise (one FMA chain per output, in input order) pins its output: the
float32 sum of the products added left to right, rounded to bfloat16. That is checked bit
for bit, as are batch invariance and the builds' agreement.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import (
    FFN,
    GGML,
    HEADS,
    HIDDEN,
    KV_HEADS,
    NAMES,
    VOCAB,
    assert_near_the_float32_model,
    gguf,
    reference,
    shape_of,
    write_llama,
)

from speclane.config import ModelConfig
from speclane.kernels import build, float_cpu
from speclane.kernels.select import Kernels
from speclane.models import gguf_types
from speclane.models.build import build_model
from speclane.models.gguf_types import FLOAT_DTYPES, FloatTensor
from speclane.models.linear import FloatWeight, Int4Weight, SplitWeight
from speclane.models.loader import (
    _unpermute_rows,
    read_gguf,
    read_hf_folder,
)

KERNELS = Kernels.load("auto")
needs_kernel = pytest.mark.skipif(KERNELS.float_matmul is None, reason="no AVX2 CPU or no C compiler here")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BUILDS = [isa for isa in float_cpu.ISAS if not build.missing_cpu_flags(isa)]


def weight_and_inputs(dtype: torch.dtype, out: int, k: int, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(out, k, generator=g) * 0.05).to(dtype), torch.randn(rows, k, generator=g).bfloat16()


def run(weight: torch.Tensor, x: torch.Tensor, isa: str | None = None) -> torch.Tensor:
    library = KERNELS.float_matmul.library if isa is None else float_cpu.load(isa).library
    return float_cpu.bind(float_cpu.pack(weight), library)(x)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 13])
def test_kernel_matches_the_float64_product_within_the_stated_bound(dtype, rows):
    out, k = 80, 600
    weight, x = weight_and_inputs(dtype, out, k, rows, seed=rows)
    got = run(weight, x).double()
    xd, wd = x.double(), weight.double()
    ref = xd @ wd.T
    bound = 2.0**-8 * ref.abs() + k * 2.0**-24 * (xd.abs() @ wd.abs().T)
    assert ((got - ref).abs() <= bound).all(), float(((got - ref).abs() / bound).max())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_weights_give_the_left_to_right_float32_sum_bit_for_bit(dtype):
    out, k, rows = 48, 300, 5
    weight, x = weight_and_inputs(dtype, out, k, rows, seed=2)
    products = x.float()[:, None, :] * weight.float()[None, :, :]  # [rows, out, k], exact in float32
    acc = torch.zeros(rows, out)
    for i in range(k):
        acc = acc + products[..., i]
    assert torch.equal(run(weight, x), acc.bfloat16())


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_result_has_the_same_bits_at_one_row_and_at_seven(dtype):
    # 5 tiles of 16 columns: the calls group tiles side by side, and one row or seven rows
    # make different groups and a partial last one.
    weight, x = weight_and_inputs(dtype, 80, 200, 7, seed=3)
    bound = float_cpu.bind(float_cpu.pack(weight), KERNELS.float_matmul.library)
    together = bound(x)
    alone = torch.cat([bound(x[i : i + 1]) for i in range(7)])
    assert torch.equal(together, alone)
    assert torch.equal(bound(torch.cat([x, x, x])), torch.cat([together] * 3))  # 21 rows: full row blocks too


@needs_kernel
@pytest.mark.skipif(len(BUILDS) < 2, reason="the CPU runs one build of the float kernel only")
@pytest.mark.parametrize("dtype", DTYPES)
def test_avx512_and_avx2_builds_give_the_same_bits(dtype):
    weight, x = weight_and_inputs(dtype, 64, 384, 9, seed=5)
    outs = [run(weight, x, isa) for isa in BUILDS]
    assert all(torch.equal(outs[0], o) for o in outs[1:]), BUILDS


def test_the_packed_weight_keeps_its_element_type_and_bytes():
    weight = torch.randn(32, 40).half()
    packed = float_cpu.pack(weight)
    assert packed.dtype == torch.float16 and packed.shape == (2, 40, 16)
    assert torch.equal(packed[1, 7], weight[16:32, 7])  # lane j of input column k: output column 16 t + j
    with pytest.raises(ValueError, match="N % 16"):
        float_cpu.pack(torch.randn(24, 40))


@pytest.mark.parametrize("type_name", list(FLOAT_DTYPES))
def test_float_tensors_dequantize_to_gguf_py_values_bit_for_bit(type_name):
    rows, cols = 16, 96
    raw = gguf.quants.quantize((np.random.default_rng(1).standard_normal((rows, cols)) * 0.05).astype(np.float32),
                               GGML[type_name])
    weight = gguf_types.float_tensor(gguf_types.TYPES[type_name], raw, rows, cols)
    assert weight.values.dtype == FLOAT_DTYPES[type_name] and weight.values.shape == (rows, cols)
    assert weight.nbytes == rows * cols * FLOAT_DTYPES[type_name].itemsize
    assert torch.equal(weight.dequantize(), reference(type_name, raw))


# -- GGUFs with float matmul weights -----------------------------------------------------------
FLOAT_LAYERS = [("F16", "F16", "F16", "BF16", "F32", "F32", "BF16"), ("BF16", "BF16", "F16", "F16", "F16", "F16", "F32")]
# Float weights beside blocks: q/k Q4_0 with an F16 v (one layer on two kernels), an F32
# output projection, Q8_0 and BF16 MLP parts.
MIXED_LAYERS = [("Q4_0", "Q4_0", "F16", "F32", "Q8_0", "BF16", "F16"), ("F16", "F16", "F16", "Q4_1", "F16", "F16", "Q4_0")]


@pytest.fixture(scope="module")
def float_gguf(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("gguf") / "floats.gguf", FLOAT_LAYERS)


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("gguf") / "mixed.gguf", MIXED_LAYERS)


HF_NAMES = dict(zip(NAMES, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                            "mlp.up_proj", "mlp.down_proj"), strict=True))


def test_float_matmul_weights_load_in_their_own_type(float_gguf):
    weights = read_gguf(float_gguf, None)
    reader = gguf.GGUFReader(str(float_gguf))
    checked = 0
    for tensor in reader.tensors:
        if not tensor.name.startswith("blk.") or "norm" in tensor.name:
            continue
        layer_index, short = tensor.name.split(".")[1:3]
        name = f"model.layers.{layer_index}.{HF_NAMES[short]}.weight"
        weight = weights.floats[name]
        assert name not in weights.dense and name not in weights.quantized
        type_name = tensor.tensor_type.name
        # No float32 copy: the file's element type, its bytes a value.
        assert weight.ggml_type == type_name and weight.values.dtype == FLOAT_DTYPES[type_name]
        assert weight.nbytes == tensor.n_elements * FLOAT_DTYPES[type_name].itemsize
        expected = reference(type_name, np.asarray(tensor.data))
        if short in ("attn_q", "attn_k"):
            expected = expected[_unpermute_rows(expected.shape[0], HEADS if short == "attn_q" else KV_HEADS)]
        assert torch.equal(weights.float_weight(name), expected), tensor.name
        checked += 1
    assert checked == len(weights.floats) == 7 * len(FLOAT_LAYERS)
    assert set(weights.quantized) == {"model.embed_tokens.weight"}  # the file's Q8_0 embedding


def test_the_weight_cache_keeps_the_float_weights_in_their_type(mixed_gguf, tmp_path):
    first = read_gguf(mixed_gguf, tmp_path)
    again = read_gguf(mixed_gguf, tmp_path)  # from the cache
    assert list(tmp_path.glob("*.safetensors")) and first.floats and first.quantized

    def kinds(weights) -> dict:
        return {name: (w.ggml_type, w.values.dtype) for name, w in weights.floats.items()}

    assert kinds(again) == kinds(first) and set(again.quantized) == set(first.quantized)
    assert all(torch.equal(again.floats[name].values, w.values) for name, w in first.floats.items())


def linears(model) -> list:
    return [linear for layer in model.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]


@needs_kernel
def test_a_float_gguf_runs_on_the_float_kernel_in_the_files_types(float_gguf):
    weights = read_gguf(float_gguf, None)
    model = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    # The file's only blocks are its Q8_0 embedding: the tied head runs on them.
    assert model.quantization == "file" and model.lm_head is model.embed
    for layer_index, kinds in enumerate(FLOAT_LAYERS):
        layer = model.layers[layer_index]
        qkv_types = {FLOAT_DTYPES[t] for t in kinds[:3]}
        parts = layer.qkv.quantized.parts if isinstance(layer.qkv.quantized, SplitWeight) else [layer.qkv.quantized]
        assert {p.packed.dtype for p in parts} == qkv_types and all(isinstance(p, FloatWeight) for p in parts)
        assert isinstance(layer.o.quantized, FloatWeight) and layer.o.quantized.packed.dtype == FLOAT_DTYPES[kinds[3]]
        out, k = shape_of("attn_output")
        assert layer.o.quantized.nbytes == out * k * FLOAT_DTYPES[kinds[3]].itemsize
    assert_near_the_float32_model(weights, model, KERNELS)
    # --quantization none runs the same kernel on the same layer values: the same bits.
    none = build_model(weights, ModelConfig(dtype="bfloat16", quantization="none"), KERNELS)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert torch.equal(none.layers[0].qkv(x), model.layers[0].qkv(x))
    assert torch.equal(none.layers[1].o(x), model.layers[1].o(x))


@needs_kernel
def test_float_weights_beside_blocks_run_each_on_its_own_kernel(mixed_gguf):
    weights = read_gguf(mixed_gguf, None)
    model = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    qkv = model.layers[0].qkv.quantized
    assert isinstance(qkv, SplitWeight) and [type(p) for p in qkv.parts] == [Int4Weight, FloatWeight]
    assert isinstance(model.layers[0].o.quantized, FloatWeight) and model.layers[0].o.quantized.packed.dtype == torch.float32
    assert_near_the_float32_model(weights, model, KERNELS)
    # --quantization int4 quantizes every layer, the float weights too.
    int4 = build_model(weights, ModelConfig(dtype="bfloat16", quantization="int4"), KERNELS)
    assert not any(isinstance(linear.quantized, FloatWeight) for linear in linears(int4))


def test_float32_runs_the_float_weights_dense_in_float32(mixed_gguf):
    weights = read_gguf(mixed_gguf, None)
    model = build_model(weights, ModelConfig(dtype="float32", quantization="none"))
    o = model.layers[0].o
    assert o.quantized is None and o.dense.dtype == torch.float32
    assert torch.equal(o.dense, weights.floats["model.layers.0.self_attn.o_proj.weight"].dequantize())


# -- a Hugging Face folder ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory) -> Path:
    """A two-layer Llama folder whose safetensors hold bfloat16 weights (float32 norms)."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("hf")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": FFN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "num_hidden_layers": 2, "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(11)
    tensors = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g).bfloat16(),
               "model.norm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=g)}
    for i in range(2):
        for short, hf in HF_NAMES.items():
            tensors[f"model.layers.{i}.{hf}.weight"] = (torch.randn(*shape_of(short), generator=g) * 0.05).bfloat16()
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_a_folders_bfloat16_matmul_weights_stay_bfloat16(bf16_folder):
    weights = read_hf_folder(bf16_folder)
    assert len(weights.floats) == 14 and not any(name.endswith("_proj.weight") for name in weights.dense)
    assert all(isinstance(w, FloatTensor) and w.values.dtype == torch.bfloat16 and w.ggml_type == "BF16"
               for w in weights.floats.values())
    assert all(t.dtype == torch.float32 for t in weights.dense.values())  # the embedding and norms as they were


@needs_kernel
def test_a_folders_bfloat16_weights_run_on_the_float_kernel(bf16_folder):
    weights = read_hf_folder(bf16_folder)
    model = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    assert all(isinstance(linear.quantized, FloatWeight) and linear.quantized.packed.dtype == torch.bfloat16
               for linear in linears(model))
    assert_near_the_float32_model(weights, model, KERNELS)
