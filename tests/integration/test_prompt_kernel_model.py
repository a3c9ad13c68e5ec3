"""The default model with the prompt kernel (SPECLANE_PROMPT_KERNEL=amx, where the CPU has AMX):
prompt positions run on it whatever the chunking, generated positions never do, so
speculation stays token-exact."""

from __future__ import annotations

import pytest
import torch

from speclane.engine.engine import LLMEngine
from speclane.kernels import build, int4_cpu
from speclane.models.llama import RaggedBatch
from speclane.request import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not int4_cpu.available() or bool(build.missing_cpu_flags("amx")), reason="no AMX on this CPU"),
]

COPY = ("Repeat this sentence exactly, twice: The quick brown fox jumps over the lazy dog "
        "while the patient farmer counts his seven sheep before sunset.")


@pytest.fixture(scope="module")
def llm_amx():
    from speclane.llm import LLM

    with int4_cpu.using_prompt("amx"):  # the weights keep the prompt kernel they were made with
        llm = LLM(num_threads=1, max_model_len=512)
    assert llm.engine.model.prompt_kernel
    return llm


def _forward(model, cache, slot, start, tokens, prompt):
    batch = RaggedBatch(torch.tensor(tokens), torch.arange(start, start + len(tokens)), [slot], [start], [len(tokens)],
                        [len(tokens)] if prompt else None)
    return model(batch, cache)


def test_a_prompt_gives_the_same_bits_however_it_is_chunked(llm_amx):
    engine = llm_amx.engine
    model, cache = engine.model, engine.cache
    tokens = engine.tokenizer.encode(COPY)[:30]
    cache.reset(0)
    cache.reset(1)
    whole = _forward(model, cache, 0, 0, tokens, prompt=True)
    chunked = torch.cat([_forward(model, cache, 1, 0, tokens[:13], prompt=True),
                         _forward(model, cache, 1, 13, tokens[13:], prompt=True)])
    assert torch.equal(whole, chunked)
    assert torch.equal(cache.keys[5][0, :, :30], cache.keys[5][1, :, :30])
    # The same positions on the int4 matmul round differently (else this file tests nothing).
    cache.reset(2)
    assert not torch.equal(_forward(model, cache, 2, 0, tokens, prompt=False), whole)
    for slot in (0, 1, 2):
        cache.reset(slot)


def test_speculation_stays_token_exact_with_prompts_on_the_prompt_kernel(llm_amx):
    base = llm_amx.engine
    outputs = {}
    for mode in ("off", "slice", "burst"):
        config = base.config.replace(spec_mode=mode, drafter="ngram" if mode != "off" else "none")
        engine = LLMEngine.from_parts(config, base.model, base.tokenizer)
        engine.add_request("r", engine.tokenizer.encode(COPY), SamplingParams(max_tokens=40))
        tokens = []
        for out in engine.run_until_done():
            tokens.extend(out.token_ids)
        outputs[mode] = tokens
        if mode == "slice":
            assert engine.counters.accepted_tokens > 10  # the copy was drafted and verified
    assert outputs["slice"] == outputs["off"]
    assert outputs["burst"] == outputs["off"]
