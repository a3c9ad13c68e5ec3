"""The output head's int4 screen (``--argmax-screen``): which rows may use it, and which
models get one. Rows whose token is their largest raw logit (``SamplingParams.argmax_only``)
find their top candidates on an int4 copy of the head, then refine them from the head's
exact rows as every row does; a model gets the copy where it reads fewer bytes than the head."""

from __future__ import annotations

import pytest
import torch
from gguf_files import TOKENS, forward, write_llama

from speclane.config import ModelConfig
from speclane.kernels import build
from speclane.kernels.select import Kernels
from speclane.models.build import build_model
from speclane.models.linear import Int4Weight
from speclane.models.loader import read_weights
from speclane.models.toy import toy_config, toy_weights
from speclane.request import SamplingParams

available = not build.missing_cpu_flags("avx2") and Kernels.load("auto").int4 is not None
needs_kernel = pytest.mark.skipif(not available, reason="no AVX2 CPU or no C compiler here")


def test_only_rows_that_read_nothing_but_their_largest_logit_are_argmax_only():
    assert SamplingParams(temperature=0.0).argmax_only
    assert not SamplingParams(temperature=0.7).argmax_only  # the whole distribution is sampled
    assert not SamplingParams(temperature=0.0, logprobs=0).argmax_only  # the logprob reads the normaliser
    assert not SamplingParams(temperature=0.0, logit_bias=((5, 3.0),)).argmax_only  # may lift a tail token
    assert not SamplingParams(temperature=0.0, repetition_penalty=1.2).argmax_only
    assert not SamplingParams(temperature=0.0, presence_penalty=0.5).argmax_only
    assert not SamplingParams(temperature=0.0, max_tokens=8, min_tokens=2).argmax_only  # stops masked out of a row


def test_an_unknown_screen_is_a_clear_error():
    with pytest.raises(ValueError, match="argmax_screen must be one of int4, off; got 'int8'"):
        ModelConfig(argmax_screen="int8")


@needs_kernel
def test_a_q8_0_head_gets_an_int4_screen_and_rows_choose_by_their_own_flag(tmp_path):
    """A Q4_0 layer and a Q8_0 embedding tied to the head (64 tokens, the top 32 refined)."""
    weights = read_weights(str(write_llama(tmp_path / "toy.gguf", [("Q4_0",) * 7])))
    model = build_model(weights, ModelConfig())
    assert isinstance(model.argmax_screen.quantized, Int4Weight)
    assert build_model(weights, ModelConfig(argmax_screen="off")).argmax_screen is None
    assert build_model(weights, ModelConfig(dtype="float32", quantization="none")).argmax_screen is None  # exact head

    hidden, logits = forward(model, TOKENS)
    rows = len(TOKENS)
    screened = model.logits(hidden, [True] * rows)
    assert torch.equal(screened.argmax(-1), logits.argmax(-1))
    assert torch.equal(screened.amax(-1), logits.amax(-1))  # both refined in float32 from the head's rows
    assert not torch.equal(screened, logits)  # the unrefined tail is the int4 copy's estimate
    flags = [True, False] * (rows // 2) + [True] * (rows % 2)
    mixed = model.logits(hidden, flags)
    for i, flag in enumerate(flags):
        assert torch.equal(mixed[i], (screened if flag else logits)[i])
    assert torch.equal(model.logits(hidden[:1], [True])[0], screened[0])  # a row alone = in the call


@needs_kernel
def test_every_head_but_an_int4_or_a_float32_one_gets_a_screen():
    weights = toy_weights(toy_config(vocab_size=512, hidden_size=64), seed=1)
    assert isinstance(build_model(weights, ModelConfig(quantization="int4")).lm_head.quantized, Int4Weight)
    assert build_model(weights, ModelConfig(quantization="int4")).argmax_screen is None  # no fewer bytes to read
    for quantization in ("int8", "none"):  # a head quantized per channel, a dense bfloat16 one
        assert isinstance(build_model(weights, ModelConfig(quantization=quantization)).argmax_screen.quantized, Int4Weight)
