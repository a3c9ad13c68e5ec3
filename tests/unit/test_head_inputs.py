"""The output head's coarse pass on int8 inputs (``--head-inputs``): the layers keep their
bfloat16 inputs, the head (and the embedding tied to it) runs on the int8-input kernels,
its top candidates are refined in float32 as before, so the greedy choice and the top
logit are the bfloat16 head's, the rest of the row a coarser estimate; and how it is chosen."""

from __future__ import annotations

import pytest
import torch
from gguf_files import TOKENS, forward, write_llama

from speclane.config import ModelConfig
from speclane.kernels import build
from speclane.kernels.select import Kernels, KernelUnavailable
from speclane.models.build import build_model
from speclane.models.llama import REFINE_TOP
from speclane.models.loader import read_weights

available = not build.missing_cpu_flags("avx2") and Kernels.load("auto", head_inputs="bfloat16").int4 is not None
needs_kernel = pytest.mark.skipif(not available, reason="no AVX2 CPU or no C compiler here")


@needs_kernel
def test_the_head_gets_the_int8_input_kernels_and_the_layers_keep_theirs():
    kernels = Kernels.load("native", head_inputs="int8")
    plain = Kernels.load("native", head_inputs="bfloat16")
    assert kernels.matmul_inputs == "bfloat16" and kernels.head_inputs == "int8" and "head_inputs=int8" in kernels.describe()
    assert kernels.head is not None and kernels.for_head is kernels.head and kernels.head.tiles is None
    assert kernels.int8.library._name == plain.int8.library._name  # the layers': the bfloat16-input build
    assert "int8_q8_x86" in kernels.head.int8.library._name and "int4_q8_x86" in kernels.head.int4.library._name
    assert plain.head is None and plain.for_head is plain and plain.head_inputs == "bfloat16"
    assert any(p.startswith("head=") for p in kernels.fingerprint(True))  # calibrations are not shared
    assert not any(p.startswith("head=") for p in plain.fingerprint(True))
    # --matmul-inputs int8 already runs the head on int8 inputs: no second set
    everything = Kernels.load("native", matmul_inputs="int8", head_inputs="int8")
    assert everything.head is None and everything.head_inputs == "int8"
    # auto: int8 unless the AMX tile kernels take the head's calls of many rows
    default = Kernels.load("native")
    assert default.head_inputs == ("bfloat16" if default.tiles is not None or default.int8_tiles is not None else "int8")


def test_what_cannot_run_or_does_not_exist_is_a_clear_error():
    with pytest.raises(KernelUnavailable, match="--head-inputs int8 runs on our int4 and int8-group kernels"):
        Kernels.load("torch", head_inputs="int8")
    assert Kernels.load("torch").head is None  # auto: nothing to run it on, and no error
    with pytest.raises(ValueError, match="head_inputs must be one of auto, bfloat16, int8; got 'int4'"):
        ModelConfig(head_inputs="int4")


@needs_kernel
def test_an_int8_input_head_keeps_the_greedy_choice_and_top_logit_and_batch_invariance(tmp_path):
    """A Q4_0 layer, a Q8_0 embedding tied to the head (64 tokens, the top 32 refined)."""
    weights = read_weights(str(write_llama(tmp_path / "toy.gguf", [("Q4_0",) * 7])))
    int8_head = build_model(weights, ModelConfig(head_inputs="int8"))
    bf16_head = build_model(weights, ModelConfig(head_inputs="bfloat16"))
    assert int8_head.lm_head is int8_head.embed  # tied: one copy, looked up from the quad layout
    assert int8_head.lm_head.quantized.packed[0].shape[-1] == 64  # 16 columns x 4 inputs: quads
    assert bf16_head.lm_head.quantized.packed[0].shape[-1] == 16

    hidden, logits = forward(int8_head, TOKENS)
    want_hidden, want_logits = forward(bf16_head, TOKENS)
    assert torch.equal(hidden, want_hidden)  # the lookups read the same values; the layers are the same
    assert torch.equal(logits.argmax(-1), want_logits.argmax(-1))
    assert torch.equal(logits.amax(-1), want_logits.amax(-1))  # both refined in float32 from the same rows
    assert not torch.equal(logits, want_logits)  # the unrefined tail is the int8 pass's estimate
    # the tail: an estimate within a few percent of the logits' range, not noise
    assert float((logits - want_logits).abs().max()) < 0.05 * float(want_logits.abs().max())
    assert int8_head.config.vocab_size > REFINE_TOP  # so that there is a tail
    assert torch.equal(forward(int8_head, TOKENS[:5])[1][-1], logits[4])  # a row's logits alone = in the call
