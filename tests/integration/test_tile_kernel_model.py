"""The default model with the tile kernel (where the CPU has AMX) against the same model
without it: the same bits in every forward, so a prefill's chunking, the rows of a tick and
speculation's verify calls cannot change an answer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine, load_tokenizer
from speclane.kernels import build, int4_cpu
from speclane.kernels.select import Kernels
from speclane.models.build import build_model
from speclane.models.kv_cache import gather
from speclane.models.llama import RaggedBatch
from speclane.models.loader import read_weights
from speclane.request import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Kernels.load("auto").int4 is None or bool(build.missing_cpu_flags("amx")), reason="no AMX on this CPU"),
]

COPY = ("Repeat this sentence exactly, twice: The quick brown fox jumps over the lazy dog "
        "while the patient farmer counts his seven sheep before sunset.")


class _Engine:
    """What the tests read of an ``LLM``: its engine."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine


@pytest.fixture(scope="module")
def llms():
    """The default model twice, with the tile kernel and without: the same builds else."""
    torch.set_num_threads(1)
    config = EngineConfig().replace(num_threads=1, max_model_len=512)
    weights = read_weights(config.model.model)
    tokenizer = load_tokenizer(weights.tokenizer_source)
    tiled = Kernels.load("native", tiles=True)
    kernels = {"amx": tiled, "off": dataclasses.replace(tiled, tiles=None)}
    return {name: _Engine(LLMEngine.from_parts(config, build_model(weights, config.model, k), tokenizer))
            for name, k in kernels.items()}


def _forward(engine, table, start, tokens):
    batch = RaggedBatch(torch.tensor(tokens), torch.arange(start, start + len(tokens)), [table], [start], [len(tokens)])
    return engine.model(batch, engine.cache)


def test_a_prompt_gives_the_same_bits_with_and_without_tiles(llms):
    tokens = llms["off"].engine.tokenizer.encode(COPY)[:30]
    hidden = {}
    for name, llm in llms.items():
        cache = llm.engine.cache
        one, two = [0, 1], [2, 3]
        whole = _forward(llm.engine, one, 0, tokens)  # 30 rows: the tile kernel, where on
        first = int4_cpu.TILE_MIN_ROWS - 1  # rows the int4 matmul takes in both
        chunked = torch.cat([_forward(llm.engine, two, 0, tokens[:first]), _forward(llm.engine, two, first, tokens[first:])])
        assert torch.equal(whole, chunked), name
        hidden[name] = whole, gather(cache.keys[5], torch.tensor([one]), 30).clone()
    assert torch.equal(hidden["amx"][0], hidden["off"][0])
    assert torch.equal(hidden["amx"][1], hidden["off"][1])


def test_speculation_stays_token_exact_with_verify_rows_on_tiles(llms):
    """K=8: a verify round is up to 9 rows, on the tile kernel; the plain steps are one row."""
    outputs = {}
    for name, llm in llms.items():
        base = llm.engine
        for mode in ("off", "slice", "burst"):
            config = base.config.replace(spec_mode=mode, drafter="ngram" if mode != "off" else "none", num_draft_tokens=8)
            engine = LLMEngine.from_parts(config, base.model, base.tokenizer)
            engine.add_request("r", engine.tokenizer.encode(COPY), SamplingParams(max_tokens=40))
            tokens = []
            for out in engine.run_until_done():
                tokens.extend(out.token_ids)
            outputs[name, mode] = tokens
            if mode == "slice":
                assert engine.counters.accepted_tokens > 10  # the copy was drafted and verified
    assert len({tuple(tokens) for tokens in outputs.values()}) == 1, outputs
