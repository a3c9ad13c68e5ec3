"""Model families against transformers: a tiny random model of each (``family_models.py``),
made and saved by the installed transformers, read back by speclane (``read_weights`` +
``build_model``, float32, no quantization).

Per family: our logits on a ragged batch (three sequences of different lengths, a
prefill, then decode steps and a multi-token row) against transformers' logits of each
sequence alone, and the greedy continuations of three prompts generated together by our
engine against transformers' ``generate``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from slot_pool import SlotPool

from family_models import FAMILIES, VOCAB, architecture, save_family, widen
from speclane.config import ModelConfig
from speclane.llm import LLM
from speclane.models.build import build_model
from speclane.models.families import hf_config
from speclane.models.linear import FloatWeight
from speclane.models.llama import LlamaModel
from speclane.models.loader import ModelLoadError, read_weights
from speclane.request import SamplingParams

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# Measured max abs difference over all families: below 2e-5 on logits of magnitude ~5-10
# (float32 accumulation order); 1e-3 is still far below what a wrong detail gives (> 0.1).
LOGITS_ATOL = 1e-3
SEQ_LENS = (7, 23, 30)  # longer than the Gemma / Mistral test windows (8, 6)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model float32, folder it is saved in)."""
    name = request.param
    path = tmp_path_factory.mktemp(name)
    return name, save_family(name, path), path


@pytest.fixture(scope="module")
def ours(family) -> LlamaModel:
    _, _, path = family
    return build_model(read_weights(str(path)), ModelConfig(dtype="float32", quantization="none"))


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in SEQ_LENS]


def _forward(model: LlamaModel, cache: SlotPool, rows) -> list[torch.Tensor]:
    return list(model.logits(model(cache.batch(rows), cache)).split([len(r[2]) for r in rows]))


def test_the_family_config_is_read(family, ours):
    name, hf, _ = family
    c = ours.config
    assert c.architecture == architecture(name)
    assert c.head_dim == (getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads)
    if name.startswith("gemma"):
        assert c.traits.layer_windows and 0 in c.traits.layer_windows  # interleaved, and smaller than SEQ_LENS
        assert min(w for w in c.traits.layer_windows if w) < max(SEQ_LENS)
    if name == "mistral":
        assert c.traits.layer_windows == (6, 6)
    if name == "gemma3":
        assert c.traits.sliding_rope_theta == 1e4 and c.rope_theta == 1e6
    if name == "phi3":
        assert c.max_position_embeddings == 64  # the short factors' positions (longrope)
    if name == "llama3-tied":
        assert c.tie_word_embeddings


def test_ragged_logits_match_transformers(family, ours):
    name, hf, _ = family
    worst = _ragged_difference(hf, ours)
    print(f"{name}: max abs logit difference {worst:.3g}")
    assert worst < LOGITS_ATOL, f"{name}: max abs logit difference {worst:.3g}"


def _ragged_difference(hf, ours: LlamaModel) -> float:
    """Max abs difference of our logits, over a ragged prefill then decode steps and a
    3-token row, from transformers' logits of each sequence alone; argmax equal."""
    prompts = _prompts()
    with torch.inference_mode():
        theirs = [hf(torch.tensor([p])).logits[0].float() for p in prompts]
    assert max(t.abs().max().item() for t in theirs) > 2  # the scale the tolerance is against
    cache = SlotPool(ours.config, 4, 64, torch.float32)
    # Prefill all but the last 5, 4 and 6 tokens, ragged, in slots 2, 0, 3.
    split = [n - k for n, k in zip(SEQ_LENS, (5, 4, 6), strict=True)]
    slots = [2, 0, 3]
    got = [[] for _ in prompts]
    out = _forward(ours, cache, [(s, 0, p[:k]) for s, p, k in zip(slots, prompts, split, strict=True)])
    for g, o in zip(got, out, strict=True):
        g.append(o)
    pos = list(split)
    while any(p < len(q) for p, q in zip(pos, prompts, strict=True)):
        rows = []
        for i, (slot, p) in enumerate(zip(slots, prompts, strict=True)):
            if pos[i] < len(p):
                # sequence 2 takes a 3-token row (a verify) once, the others single decode steps
                n = 3 if i == 2 and pos[i] == split[i] else 1
                rows.append((i, slot, pos[i], p[pos[i]: pos[i] + n]))
        out = _forward(ours, cache, [(slot, start, toks) for _, slot, start, toks in rows])
        for (i, _, start, toks), o in zip(rows, out, strict=True):
            got[i].append(o)
            pos[i] = start + len(toks)
    worst = 0.0
    for g, t in zip(got, theirs, strict=True):
        g = torch.cat(g)
        assert g.shape == t.shape
        worst = max(worst, (g - t).abs().max().item())
        assert torch.equal(g.argmax(-1), t.argmax(-1))
    return worst


def test_a_gemma_3_270m_style_config_json(tmp_path):
    """gemma-3-270m's config.json as the Hub has it (transformers 4 keys: rope_theta,
    rope_local_base_freq, rope_scaling, _sliding_window_pattern), at a tiny size with its
    head layout (4 query heads, 1 KV head, head_dim larger than hidden / heads)."""
    layer_types = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
    old_style = {
        "_sliding_window_pattern": 6, "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "layer_types": layer_types,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 8, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 8, "torch_dtype": "float32", "transformers_version": "4.55.0.dev0",
        "use_bidirectional_attention": False, "use_cache": True, "vocab_size": VOCAB,
    }
    (tmp_path / "config.json").write_text(json.dumps(old_style))
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path)).float().eval()
    widen(hf)
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(old_style))  # save_pretrained writes transformers 5 keys
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    weights = read_weights(str(tmp_path))
    c = weights.config
    assert (c.rope_theta, c.traits.sliding_rope_theta, c.max_position_embeddings) == (1e6, 1e4, 32768)
    assert c.traits.layer_windows == tuple(8 if t == "sliding_attention" else 0 for t in layer_types)
    ours = build_model(weights, ModelConfig(dtype="float32", quantization="none"))
    worst = _ragged_difference(hf, ours)
    assert worst < LOGITS_ATOL, f"max abs logit difference {worst:.3g}"


def test_greedy_continuations_match_transformers(family):
    name, hf, path = family
    prompts = _prompts()
    hf.generation_config.eos_token_id = None  # no early stop, as ignore_eos on our side
    llm = LLM(str(path), dtype="float32", quantization="none", max_model_len=48)
    ours = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    for prompt, completion in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=16, do_sample=False)
        theirs = out[0, len(prompt):].tolist()
        assert len(theirs) == 16
        assert completion.token_ids == theirs, f"{name}: prompt of {len(prompt)} tokens"


# -- what is refused -------------------------------------------------------------------------
def _config(**extra) -> dict:
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    return {**base, **extra}


@pytest.mark.parametrize("extra, message", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "unsupported rope type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "unsupported rope type 'dynamic'"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0 is not supported for llama"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}}, "partial_rotary_factor"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
    ({"architectures": ["Gemma3ForConditionalGeneration"]}, "text-only"),
    ({"architectures": ["Gemma3ForCausalLM"], "layer_types": ["sliding_attention", "chunked_attention"],
      "sliding_window": 8}, "unsupported layer types"),
    ({"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"architectures": ["Gemma3ForCausalLM"], "sliding_window": 4,
      "rope_parameters": {"full_attention": {"rope_theta": 1e6}}},
     "no 'sliding_attention' entry"),
    ({"architectures": ["Phi3ForCausalLM"], "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     "longrope needs"),
    ({"architectures": ["Qwen3ForCausalLM"], "layer_types": ["sliding_attention", "full_attention"],
      "sliding_window": 4}, "use_sliding_window is false"),
])
def test_config_fields_it_does_not_run_are_errors(extra, message):
    with pytest.raises(ModelLoadError, match=message):
        hf_config(_config(**extra), "config.json")


def test_a_window_covering_every_position_is_global():
    config = hf_config(_config(architectures=["MistralForCausalLM"], sliding_window=4096, max_position_embeddings=4096),
                       "config.json")
    assert config.traits.layer_windows == ()


def test_llama_sliding_window_is_ignored_as_transformers_does(caplog):
    config = hf_config(_config(sliding_window=16), "config.json")
    assert config.traits.layer_windows == ()
    assert "sliding_window 16 ignored" in caplog.text


def test_gemma_embed_scale_and_attention_scale():
    config = hf_config(_config(architectures=["Gemma3ForCausalLM"], head_dim=16, query_pre_attn_scalar=24,
                               sliding_window=4, max_position_embeddings=64, sliding_window_pattern=2), "config.json")
    assert config.traits.embed_scale == pytest.approx(math.sqrt(32))
    assert config.traits.query_pre_attn_scalar == 24
    assert config.traits.layer_windows == (4, 0)  # sliding_window_pattern of an older config
    assert config.traits.sliding_rope_theta == 10000.0 and config.rope_theta == 1_000_000.0


def test_bfloat16_with_our_kernels_stays_near_float32(family, ours):
    """bfloat16 runs the layer matmuls on our float-weight kernel over the folder's float32
    weights as saved, and our attention kernel on every layer (q/k norm applied to the fused
    projection before it; a sliding layer's window and Gemma 2's soft cap inside it).
    Measured: max abs difference 0.05-0.16 from float32 (bfloat16's rounding, the same as a
    Llama's; torch's bfloat16 linears over bfloat16 weights: 0.05-0.16), argmax agreement
    >= 0.97."""
    name, _, path = family
    model = build_model(read_weights(str(path)), ModelConfig(dtype="bfloat16", quantization="none"))
    if model.kernels.float_matmul is not None:
        assert all(isinstance(linear.quantized, FloatWeight) and linear.quantized.packed.dtype == torch.float32
                   for layer in model.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down))
    if model.kernels.attention_library is not None:
        assert model.attention_library is not None and all(model.kernel_layers)
    prompts = _prompts()
    c = model.config
    half = _forward(model, SlotPool(c, 3, 64, torch.bfloat16),
                    [(i, 0, p) for i, p in enumerate(prompts)])
    full = _forward(ours, SlotPool(c, 3, 64, torch.float32),
                    [(i, 0, p) for i, p in enumerate(prompts)])
    worst = max((h - f).abs().max().item() for h, f in zip(half, full, strict=True))
    agree = sum((h.argmax(-1) == f.argmax(-1)).sum().item() for h, f in zip(half, full, strict=True)) / sum(SEQ_LENS)
    assert worst < 0.4 and agree >= 0.9, f"{name}: max abs difference {worst:.3g}, argmax agreement {agree:.2f}"


def test_bfloat16_forward_plans_give_the_loops_bits(family):
    """Every family's bfloat16 model on our kernels runs forwards of up to
    forward_plan.MAX_ROWS rows as one C call (Qwen3's and Gemma's q/k norms, Gemma's norms
    of the attention and MLP outputs and its GELU included): a ragged prefill and a decode
    tick give the Python loop's hidden states, bit for bit."""
    name, _, path = family
    model = build_model(read_weights(str(path)), ModelConfig(dtype="bfloat16", quantization="none"))
    if model.kernels.plan_library is None or model.kernels.float_matmul is None:
        pytest.skip("no plan runner or float kernel here")
    if name == "llama-attention-bias":  # the plan runner has no bias step: the Python loop runs it
        assert model.plan_blocker is not None and "bias" in model.plan_blocker
        return
    assert model.plan_blocker is None and model.plans is not None, model.plan_blocker
    prompts = _prompts()[:2]  # 7 + 23 rows
    pool = SlotPool(model.config, 2, 64, torch.bfloat16)
    ticks = [[(i, 0, p) for i, p in enumerate(prompts)], [(0, 7, [5]), (1, 23, [9])]]
    plans = model.plans
    try:
        for rows in ticks:
            model.plans = None
            loop = model(pool.batch(rows), pool)
            model.plans = plans
            runs = plans.get(len(loop)).runs
            planned = model(pool.batch(rows), pool)
            assert plans.get(len(loop)).runs == runs + 1
            assert torch.equal(planned, loop), name
    finally:
        model.plans = plans


def test_a_family_config_survives_the_weight_caches_json(family, ours):
    """The weight cache keeps a config as JSON (``dataclasses.asdict``); traits included."""
    import dataclasses

    from speclane.models.llama import LlamaConfig

    config = ours.config
    assert LlamaConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(config)))) == config


def test_qwen_sliding_layers_follow_max_window_layers():
    """A Qwen2 / Qwen3 config without layer_types: layers from max_window_layers on slide,
    as transformers derives them, and only with use_sliding_window."""
    cfg = _config(architectures=["Qwen2ForCausalLM"], num_hidden_layers=4, sliding_window=16, max_window_layers=2,
                  max_position_embeddings=64)
    assert hf_config(cfg, "config.json").traits.layer_windows == ()
    cfg["use_sliding_window"] = True
    assert hf_config(cfg, "config.json").traits.layer_windows == (0, 0, 16, 16)
