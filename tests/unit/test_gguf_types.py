"""GGUF block types on our kernels (models/gguf_types.py): the blocks' values, each kernel
against gguf-py's dequantize, batch invariance, and a crafted GGUF of every block type loaded
and run (the float types F32, F16 and BF16: tests/unit/test_float_kernel.py).

The bounds, per output y of a row x against ref = x @ dequantize(blocks).T (float64):
    |y - ref| <= 2^-8 |ref| + (K 2^-24 + s) (|x| @ |W|.T) + 2^-14 (X @ |W|.T)
- 2^-8 |ref|: the bfloat16 output's rounding (half an ulp is at most 2^-9 of the value;
  2^-8 leaves room for the float32 sum's rounding before it);
- K 2^-24 (|x| @ |W|.T): float32 accumulation over K inputs;
- s = 2^-11 for Q4_K only: the int4 kernel keeps scales and minimums in float16, and Q4_K's
  d * sc and dmin * m are float32 products that float16 rounds by at most 2^-11 of their
  value (Q4_0's d and -8 d and Q4_1's d and m are the file's float16s: exact, s = 0);
- 2^-b (X @ |W|.T), X each input's maximum |x| over its block of 32: the kernels' grid
  rounding of their inputs (kernels/grid.h: an input moves by at most 2^(E - bits - 1) <=
  2^-bits of its block's largest), b = 14 for the int4 kernel and 11 for the int8 kernel.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import (
    GGML,
    HEADS,
    HIDDEN,
    KV_HEADS,
    TOKENS,
    VOCAB,
    assert_near_the_float32_model,
    forward,
    gguf,
    random_tensor,
    reference,
    write_llama,
)

from speclane.config import ModelConfig
from speclane.kernels import build, int8_cpu
from speclane.kernels.select import Kernels
from speclane.models import gguf_types
from speclane.models.build import _block_kernel, _native_weight, build_model
from speclane.models.gguf_types import TYPES, QuantizedTensor, quantized_tensor
from speclane.models.linear import GroupInt8Weight, Int4Weight, SplitWeight
from speclane.models.loader import ModelLoadError, _gguf_tensor, _unpermute_rows, read_gguf

KERNELS = Kernels.load("auto")
needs_kernels = pytest.mark.skipif(KERNELS.int4 is None or KERNELS.int8 is None, reason="no AVX2 CPU or no C compiler here")
BLOCK_TYPES = [name for name, t in TYPES.items() if t.load == "native" and t.kernel != "float"]


@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_blocks_dequantize_to_gguf_py_values_bit_for_bit(type_name):
    rows, cols = 32, 512
    raw = random_tensor(type_name, rows, cols)
    weight = quantized_tensor(TYPES[type_name], raw, rows, cols)
    assert weight.q.dtype == (torch.uint8 if weight.kernel == "int4" else torch.int8)
    assert weight.scale.shape == (rows, cols // weight.group)
    assert torch.equal(weight.dequantize(), reference(type_name, raw))


def test_q4_k_nibbles_follow_llama_cpps_sub_block_layout():
    """Byte i of a super-block's 32-byte chunk j: low nibble is value i of sub-block 2j,
    high nibble value i of sub-block 2j + 1 (checked on one marked byte, not only against gguf-py)."""
    raw = np.zeros((1, 144), np.uint8)
    raw[0, 0:2] = np.array([1.0], np.float16).view(np.uint8)  # d = 1
    raw[0, 4:16] = 1  # every sub-block's scale index 1 (and min index 1, dmin = 0)
    raw[0, 16 + 32 * 1 + 5] = 0x3A  # chunk 1, byte 5: sub-block 2 gets 0xA, sub-block 3 gets 0x3
    w = quantized_tensor(TYPES["Q4_K"], raw, 1, 256).dequantize()[0]
    assert w[2 * 32 + 5] == 10 and w[3 * 32 + 5] == 3 and int((w != 0).sum()) == 2


def layer(type_name: str, rows: int, cols: int, seed: int = 0) -> tuple[Int4Weight | GroupInt8Weight, torch.Tensor, QuantizedTensor]:
    raw = random_tensor(type_name, rows, cols, seed)
    weight = quantized_tensor(TYPES[type_name], raw, rows, cols)
    kind = _block_kernel(weight, KERNELS)
    assert kind is not None and kind.startswith(TYPES[type_name].kernel)
    return _native_weight(kind, [weight], KERNELS), reference(type_name, raw), weight


@needs_kernels
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
@pytest.mark.parametrize("rows", [1, 3, 13])
def test_kernel_matches_gguf_py_dequantize_within_the_stated_bound(type_name, rows):
    out, k = 48, 768
    weight, dense, _ = layer(type_name, out, k)
    torch.manual_seed(rows)
    x = torch.randn(rows, k).bfloat16()
    got = weight.matmul(x).double()
    xd, wd = x.double(), dense.double()
    ref = xd @ wd.T
    magnitude = xd.abs() @ wd.abs().T
    scale_term = 2.0**-11 if type_name == "Q4_K" else 0.0
    bound = 2.0**-8 * ref.abs() + (k * 2.0**-24 + scale_term) * magnitude
    grid_bits = 14 if TYPES[type_name].kernel == "int4" else 11
    group_max = xd.abs().reshape(rows, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(rows, k)
    bound = bound + 2.0**-grid_bits * (group_max @ wd.abs().T)
    assert ((got - ref).abs() <= bound).all(), float(((got - ref).abs() / bound).max())


@needs_kernels
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_a_rows_result_has_the_same_bits_in_a_call_of_any_number_of_rows(type_name):
    # 80 outputs: 5 tiles, so a call runs a group of 4 tiles together and one alone; 1-17
    # rows cover every block of rows the kernels have (several tiles a call for a few rows,
    # full blocks, a last block of each size after them).
    weight, _, _ = layer(type_name, 80, 512, seed=3)
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(4)).bfloat16()
    alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(17)])
    for rows in range(2, 18):
        assert torch.equal(weight.matmul(x[:rows]), alone[:rows]), rows


@needs_kernels
@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_1"])
def test_an_int8_call_off_the_grid_keeps_the_other_rows_bits(type_name):
    """A row with a group at 2^120 (above the grid's range, kernels/grid.h) sends its call to
    the int8 kernel's float path; on the grid that path's sums are the integer path's, so
    the call's other rows keep the bits they get alone."""
    weight, _, _ = layer(type_name, 80, 512, seed=6)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7)).bfloat16()
    x[2, 40] = 2.0**120
    together = weight.matmul(x)
    for i in (0, 1, 3, 4):
        assert torch.equal(together[i], weight.matmul(x[i : i + 1])[0]), i


@needs_kernels
@pytest.mark.parametrize("type_name", ["Q8_0", "Q6_K", "Q5_K"])
def test_int8_kernel_builds_give_the_same_bits(type_name):
    builds = [isa for isa in int8_cpu.ISAS if not build.missing_cpu_flags(isa)]
    _, _, weight = layer(type_name, 80, 512)
    x = torch.randn(14, 512, generator=torch.Generator().manual_seed(5)).bfloat16()
    calls = [int8_cpu.bind(int8_cpu.pack(weight.q, weight.scale, weight.minimum), int8_cpu.load(isa).library) for isa in builds]
    for rows in (1, 2, 3, 5, 9, 14):
        outs = [call(x[:rows]) for call in calls]
        assert all(torch.equal(outs[0], o) for o in outs[1:]), (builds, rows)


@needs_kernels
@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q5_1", "Q6_K"])
def test_int8_scales_kept_in_float16_only_where_exact_and_with_the_same_bits(type_name):
    _, _, weight = layer(type_name, 32, 512)
    packed = int8_cpu.pack(weight.q, weight.scale, weight.minimum)
    # The file's float16 scales stay float16 (half the bytes); Q6_K's d * sc products do not fit.
    assert packed.scale.dtype == (torch.float32 if type_name == "Q6_K" else torch.float16)
    wide = packed._replace(scale=packed.scale.float(), minimum=None if packed.minimum is None else packed.minimum.float())
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(6)).bfloat16()
    library = int8_cpu.load().library
    assert torch.equal(int8_cpu.bind(packed, library)(x), int8_cpu.bind(wide, library)(x))
    rows = torch.tensor([0, 31, 7, 16])
    for weights in (packed, wide):
        assert torch.equal(int8_cpu.dequantize_rows(weights, rows, library), weight.dequantize()[rows])
    with pytest.raises(IndexError, match="outside"):
        int8_cpu.dequantize_rows(packed, torch.tensor([0, 32]), library)


@needs_kernels
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
def test_a_kernel_weights_rows_read_back_are_the_files_values(type_name):
    """``dequantize_rows`` (embedding lookups, the head's refinement) from the packed layout:
    gguf-py's values, exactly; Q4_K within the int4 kernel's float16 scales (2^-11 relative).
    A few rows, then every row and lane in one call (the lookup's threads and vector path)."""
    weight, dense, _ = layer(type_name, 48, 256, seed=8)
    rows = torch.tensor([47, 0, 16, 15, 16, *range(47, -1, -1)])
    got, want = weight.dequantize_rows(rows), dense[rows]
    if type_name == "Q4_K":
        assert torch.allclose(got, want, rtol=2.0**-11, atol=2.0**-11 * float(want.abs().max()))
    else:
        assert torch.equal(got, want)


def test_an_unsupported_type_is_a_one_line_error_listing_the_supported_ones():
    tensor = types.SimpleNamespace(name="blk.0.attn_q.weight", tensor_type=GGML.MXFP4, shape=np.array([64, 16]), data=None)
    with pytest.raises(ModelLoadError) as err:
        _gguf_tensor(Path("m.gguf"), tensor, "model.layers.0.self_attn.q_proj.weight")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("m.gguf: tensor blk.0.attn_q.weight has unsupported type MXFP4 (supported: Q4_0, Q4_1, Q4_K, Q8_0")
    assert gguf_types.unsupported_message("MXFP4") in message
    native, dense = message.split("(supported: ", 1)[1].removesuffix(" dequantized to float32)").split(" on our kernels; ")
    assert native.split(", ") == ["Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K", "Q5_0", "Q5_1", "Q5_K", "F32", "F16", "BF16"]
    assert dense.split(", ") == ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]  # gguf-py cannot dequantize F64


# -- a crafted GGUF of the native types -------------------------------------------------------
# Each layer's types (q, k, v, o, gate, up, down): every block type at least once, and a
# q/k/v of mixed kernels (Q4_K_M files' Q6_K v beside Q4_K q and k).
LAYER_TYPES = [
    ("Q4_K", "Q4_K", "Q6_K", "Q8_0", "Q5_K", "Q5_0", "Q6_K"),
    ("Q4_0", "Q4_1", "Q4_0", "Q5_1", "Q4_1", "Q8_0", "Q4_K"),
]


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("gguf") / "mixed.gguf", LAYER_TYPES)


def test_a_crafted_gguf_keeps_only_the_blocks_of_its_matmul_weights_and_embedding(crafted):
    weights = read_gguf(crafted, None)
    reader = gguf.GGUFReader(str(crafted))
    for tensor in reader.tensors:
        if not tensor.name.startswith("blk.") or "norm" in tensor.name:
            continue
        layer_index, short = int(tensor.name.split(".")[1]), tensor.name.split(".")[2]
        hf = next(n for n in weights.quantized if n.startswith(f"model.layers.{layer_index}.") and
                  n.endswith({"attn_q": "q_proj.weight", "attn_k": "k_proj.weight", "attn_v": "v_proj.weight",
                              "attn_output": "o_proj.weight", "ffn_gate": "gate_proj.weight", "ffn_up": "up_proj.weight",
                              "ffn_down": "down_proj.weight"}[short]))
        assert hf not in weights.dense and weights.quantized[hf].ggml_type == tensor.tensor_type.name
        expected = reference(tensor.tensor_type.name, np.asarray(tensor.data))
        if short in ("attn_q", "attn_k"):
            expected = expected[_unpermute_rows(expected.shape[0], HEADS if short == "attn_q" else KV_HEADS)]
        assert torch.equal(weights.float_weight(hf), expected), tensor.name
    assert len(weights.quantized) == 7 * len(LAYER_TYPES) + 1
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert weights.quantized["model.embed_tokens.weight"].ggml_type == "Q8_0"
    assert torch.equal(weights.float_weight("model.embed_tokens.weight"), reference("Q8_0", np.asarray(embedding.data)))
    # Only the norms are dense float32.
    assert set(weights.dense) == {"model.norm.weight",
                                  *(f"model.layers.{i}.{n}.weight" for i in range(2)
                                    for n in ("input_layernorm", "post_attention_layernorm"))}


def test_the_weight_cache_keeps_the_blocks(crafted, tmp_path):
    first = read_gguf(crafted, tmp_path)
    again = read_gguf(crafted, tmp_path)  # from the cache
    assert list(tmp_path.glob("*.safetensors"))
    assert set(again.quantized) == set(first.quantized)
    for name, weight in first.quantized.items():
        other = again.quantized[name]
        assert (other.group, other.kernel, other.ggml_type) == (weight.group, weight.kernel, weight.ggml_type)
        assert torch.equal(other.q, weight.q) and torch.equal(other.scale, weight.scale)
        assert (other.minimum is None) == (weight.minimum is None)


@needs_kernels
def test_a_crafted_gguf_runs_on_our_kernels_and_matches_the_float_reference(crafted):
    weights = read_gguf(crafted, None)
    ours = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    kinds = {type(linear.quantized) for layer_ in ours.layers for linear in (layer_.qkv, layer_.o, layer_.gate_up, layer_.down)}
    assert kinds == {Int4Weight, GroupInt8Weight, SplitWeight}
    assert_near_the_float32_model(weights, ours, KERNELS)


@needs_kernels
def test_narrow_weights_keep_q5_and_q6_values_in_their_bits_with_the_same_forward(crafted):
    """--narrow-weights (the default): the Q5_*/Q6_K weights' values in 5 or 6 bits, the
    Q8_0 ones a byte each; the logits are the byte layout's bit for bit."""
    weights = read_gguf(crafted, None)
    narrow = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    wide_kernels = Kernels.load("auto", narrow_weights=False)
    wide = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto", narrow_weights=False), wide_kernels)
    layer0 = narrow.layers[0]
    formats = {name: linear.quantized.packed.format for name, linear in (("o", layer0.o), ("down", layer0.down))}
    assert formats == {"o": int8_cpu.INT8, "down": 6 | int8_cpu.SIGNED}  # Q8_0, Q6_K
    assert narrow.nbytes < wide.nbytes
    assert "narrow_weights=off" in wide_kernels.describe() and wide_kernels.fingerprint(True) != KERNELS.fingerprint(True)
    (hidden, logits), (hidden_wide, logits_wide) = forward(narrow, TOKENS), forward(wide, TOKENS)
    assert torch.equal(hidden, hidden_wide) and torch.equal(logits, logits_wide)


@needs_kernels
def test_the_embedding_and_the_tied_head_run_from_the_files_blocks(crafted):
    weights = read_gguf(crafted, None)
    ours = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    exact = weights.float_weight("model.embed_tokens.weight")  # gguf-py's values of the Q8_0 blocks
    # One weight on the int8 kernel, no dense copy: the lookup and the head's rows are its blocks.
    assert ours.lm_head is ours.embed and ours.embed.dense is None
    assert isinstance(ours.embed.quantized, GroupInt8Weight)
    ids = torch.tensor([0, 5, 17, 63, 5])
    assert torch.equal(ours.embed.rows(ids), exact[ids])
    assert torch.equal(ours.head_table(), exact)
    # The head's refined logits are the float32 products with the exact rows for the top
    # candidates (up to float32 summation order: 1e-6 relative, where the coarse bfloat16
    # pass is off by ~1e-2).
    hidden, logits = forward(ours, [3, 17, 42])
    top = logits.topk(5, dim=-1).indices
    want = hidden @ exact.T
    assert torch.allclose(logits.gather(-1, top), want.gather(-1, top), rtol=1e-6, atol=1e-5)
    # The model holds about the file's bytes: the int8 values and float16 scales of the
    # Q8_0 embedding (no float32 or bfloat16 table beside them).
    assert ours.embed.nbytes == VOCAB * HIDDEN + VOCAB * HIDDEN // 32 * 2


@needs_kernels
def test_a_layer_split_between_kernel_kinds_runs_in_a_forward_plan_with_the_loops_bits(crafted):
    """Q4_K_M files' q/k/v (Q4_K q and k, Q6_K v) is a SplitWeight: a forward plan runs each
    part into its own buffer and copies it into its columns, the bits of the loop's torch.cat."""
    weights = read_gguf(crafted, None)
    ours = build_model(weights, ModelConfig(dtype="bfloat16", quantization="auto"), KERNELS)
    assert isinstance(ours.layers[0].qkv.quantized, SplitWeight)
    assert ours.plan_blocker is None and ours.plans is not None
    plans = ours.plans
    for tokens in (TOKENS, TOKENS[:1]):
        ours.plans = None
        loop = forward(ours, tokens)
        ours.plans = plans
        runs = plans.get(len(tokens)).runs
        planned = forward(ours, tokens)
        assert plans.get(len(tokens)).runs == runs + 1
        assert torch.equal(planned[0], loop[0]) and torch.equal(planned[1], loop[1])


needs_int8_tiles = pytest.mark.skipif(KERNELS.int8_tiles is None, reason="no AMX (amx_tile, amx_bf16) on this CPU")


@needs_kernels
def test_int8_tile_kernel_where_the_cpu_has_amx_and_off_on_request():
    assert (KERNELS.int8_tiles is not None) == (not build.missing_cpu_flags("amx"))
    assert Kernels.load("auto", tiles=False).int8_tiles is None
    assert Kernels.load("auto", matmul_inputs="int8").int8_tiles is None  # it reads bfloat16 inputs


@needs_int8_tiles
@pytest.mark.parametrize("type_name", ["Q8_0", "Q6_K", "Q5_1", "Q5_K"])
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("narrow", [True, False], ids=["narrow", "bytes"])
def test_int8_tile_kernel_gives_every_builds_bits(type_name, half, narrow):
    """The grid (kernels/grid.h) makes the tile unit's order of adding moot: calls of
    TILE_MIN_ROWS to 40 rows (whole and partial blocks of 16), every group width
    (Q6_K: 16), minimum (Q5_1, Q5_K) and scale type, in 5-6 bits (bfloat16 tiles) and in
    bytes (int8 tiles), against every vector build; inputs over many binades with an
    outlier column, so that the rounding acts."""
    _, _, weight = layer(type_name, 80, 512, seed=8)
    packed = int8_cpu.pack(weight.q, weight.scale, weight.minimum, format=None if narrow else int8_cpu.INT8)
    if not half:  # float32 scales and minimums (int8_matmul_amx), where packing kept float16
        packed = packed._replace(scale=packed.scale.float(), minimum=None if packed.minimum is None else packed.minimum.float())
    tiles = int8_cpu.bind(packed, KERNELS.int8.library, tiles=KERNELS.int8_tiles.library)
    builds = {isa: int8_cpu.bind(packed, int8_cpu.load(isa).library) for isa in int8_cpu.ISAS if not build.missing_cpu_flags(isa)}
    g = torch.Generator().manual_seed(9)
    x = torch.randn(40, 512, generator=g) * torch.exp2(torch.randint(-12, 4, (40, 512), generator=g).float())
    x[:, 7] *= 300.0
    x = x.bfloat16()
    first = int8_cpu.TILE_MIN_ROWS
    for rows in (first, first + 1, 16, 33, 40):
        got = tiles(x[:rows])
        for isa, call in builds.items():
            assert torch.equal(got, call(x[:rows])), (isa, rows)
    off_grid = x.clone()
    off_grid[3, 100] = 2.0**120  # the tile kernel hands the call to the float path: the other rows' bits stay
    together = tiles(off_grid)
    assert torch.equal(together[4:], tiles(x[4:]))
