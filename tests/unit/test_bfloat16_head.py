"""A bfloat16 model whose output head is dense bfloat16 (no kernel of ours holds its
weights: ``--kernels torch``, ``--quantization none`` on a quantized file, a type without a
kernel) ranks its logits as the float32 product of the hidden state and the head's rows:
``LlamaModel.logits`` refines the bfloat16 head's top candidates in float32, as it does
after a quantized head (bfloat16 logits are 1/32 apart at 4 to 8, 1/8 at 16 to 32, and
tie candidates float32 orders)."""

from __future__ import annotations

import torch

from speclane.config import ModelConfig
from speclane.models.build import build_model
from speclane.models.kv_cache import KVCache
from speclane.models.llama import RaggedBatch
from speclane.models.toy import toy_config, toy_weights


def test_a_dense_bfloat16_head_gives_the_float32_top_logit_and_argmax_of_its_rows():
    config = toy_config(vocab_size=512, hidden_size=64)
    model = build_model(toy_weights(config, seed=1), ModelConfig(dtype="bfloat16", quantization="none", kernels="torch"))
    head = model.lm_head
    assert head.quantized is None and head.dense.dtype == torch.bfloat16
    tokens = torch.randint(1, config.vocab_size, (48,), generator=torch.Generator().manual_seed(2))
    cache = KVCache(config.num_layers, 3, 16, config.num_kv_heads, config.head_dim, torch.bfloat16)
    hidden = model(RaggedBatch(tokens, torch.arange(48), cache.row_tables(1, 48), [0], [48]), cache)
    logits = model.logits(hidden)
    exact = hidden.float() @ head.dense.float().T  # the head's bfloat16 values, in float32
    assert exact.max(-1).values.min() > 4  # where bfloat16's step is 1/32 or more
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    torch.testing.assert_close(logits.max(-1).values, exact.max(-1).values, atol=1e-4, rtol=1e-5)
