"""A model's memory: its weights stay within 1.15x of its file (the file's own blocks, no
dense or requantized copies beside them) plus the one copy it makes by choice, the output
head's int4 screen for greedy rows (``--argmax-screen int4``: 0.625 bytes a head weight,
``--argmax-screen off`` drops it); and the KV pool is a flag (``--kv-cache-mib``) that shows
in ``LLMEngine.kv_pool`` (``GET /health``) and caps the sequences it holds.

Resident memory is measured in a fresh process (``RssAnon`` before and after loading and
building the model): the process's own anonymous memory, not the shared libraries it maps
nor the page cache of the files it read. The allowance beyond 1.15x the file is a fixed
16 MiB for what any build allocates whatever the model (the C kernels' scratch, the OpenMP
threads' stacks, the allocator's free lists; ~13 MiB measured with the default model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from speclane.config import EngineConfig, SchedulerConfig
from speclane.engine.engine import LLMEngine, kv_pool_blocks
from speclane.request import SamplingParams

RATIO = 1.15
FIXED_MIB = 16

MEASURE = r"""
import gc, ctypes, json, os, sys
def anon_mib():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) / 1024
import torch  # noqa: F401 (the baseline includes torch)
from speclane.config import ModelConfig
from speclane.models.build import build_model
from speclane.models.loader import read_weights, resolve_model
before = anon_mib()
weights = read_weights(sys.argv[1])
model = build_model(weights, ModelConfig(model=sys.argv[1]))
del weights
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
screen = model.argmax_screen
print(json.dumps({"file_mib": os.path.getsize(resolve_model(sys.argv[1])) / 2**20, "grown_mib": anon_mib() - before,
                  "model_mib": model.nbytes / 2**20, "screen_mib": screen.nbytes / 2**20 if screen else 0.0,
                  "head_weights": model.config.vocab_size * model.config.hidden_size}))
"""


def measure(model: str) -> dict[str, float]:
    env = {**os.environ, "SPECLANE_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEASURE, model], capture_output=True, text=True, timeout=600, env=env,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", pytest.param("gemma-3-270m", marks=pytest.mark.slow)])
def test_a_models_resident_memory_stays_within_its_file_size(model, our_kernels):
    got = measure(model)
    assert 0 < got["screen_mib"] <= 0.63 * got["head_weights"] / 2**20, got  # int4 groups of 32: 20 bytes a group
    assert got["model_mib"] <= RATIO * got["file_mib"] + got["screen_mib"], got
    assert got["grown_mib"] <= RATIO * got["file_mib"] + got["screen_mib"] + FIXED_MIB, got


ENGINE = r"""
import gc, json, os, sys
def anon_mib():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) / 1024
import torch  # noqa: F401 (the baseline includes torch)
from speclane.config import EngineConfig
from speclane.engine.engine import LLMEngine
from speclane.models.loader import resolve_model
before = anon_mib()
engine = LLMEngine(EngineConfig().replace(model=sys.argv[1], kv_cache_mib=16, spec_mode="off", num_threads=1))
gc.collect()
screen = engine.model.argmax_screen
print(json.dumps({"file_mib": os.path.getsize(resolve_model(sys.argv[1])) / 2**20, "grown_mib": anon_mib() - before,
                  "kv_mib": engine.kv_pool["mib"], "screen_mib": screen.nbytes / 2**20 if screen else 0.0}))
"""


def test_an_engine_s_resident_memory_is_its_model_and_kv_pool(our_kernels):
    """A whole engine as ``speclane serve`` builds it (model, tokenizer, KV pool): what the
    loader freed goes back to the system (engine.return_freed_memory; without it an engine
    over the default model grew by ~260 MiB, over SmolLM2 Q4_K_M by ~377)."""
    env = {**os.environ, "SPECLANE_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", ENGINE, "smollm2-135m-instruct"], capture_output=True, text=True,
                         timeout=600, env=env, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["grown_mib"] <= RATIO * got["file_mib"] + got["screen_mib"] + got["kv_mib"] + FIXED_MIB, got


def test_the_kv_pool_holds_max_num_seqs_unless_its_size_is_set():
    block = 2**20 // 4  # bytes of one block
    assert kv_pool_blocks(SchedulerConfig(max_num_seqs=16), 300, block) == 300
    assert kv_pool_blocks(SchedulerConfig(max_num_seqs=16, kv_cache_mib=20), 300, block) == 80
    with pytest.raises(ValueError, match="--kv-cache-mib 1 holds no KV block: one of 16 positions needs 2.00 MiB"):
        kv_pool_blocks(SchedulerConfig(kv_cache_mib=1), 300, 2 * 2**20)


def test_a_small_kv_pool_runs_fewer_sequences_at_once_and_finishes_every_request(our_kernels):
    config = EngineConfig().replace(max_model_len=256, kv_cache_mib=4, num_threads=1, spec_mode="off")
    engine = LLMEngine(config)
    pool = engine.kv_pool
    per_block = engine.cache.bytes // engine.cache.num_blocks
    assert pool["mib"] <= 4 and pool["blocks"] == engine.cache.num_blocks == 4 * 2**20 // per_block
    prompts = [engine.tokenizer.encode(f"Count to {i + 3}: " + "one two three " * 20) for i in range(16)]
    held = 0
    for i, prompt in enumerate(prompts):  # more requests than the pool holds at once: they queue
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=6))
    finished = set()
    while engine.has_unfinished():
        finished |= {out.request_id for out in engine.step() if out.finished}
        held = max(held, engine.scheduler.kv.num_holders)
        engine.scheduler.kv.check()
    assert finished == {f"r{i}" for i in range(16)}
    assert held < 16, "the pool held every request at once: it is not small"
