"""benchmarks/accuracy.py end to end on a tiny random Llama GGUF (F32 tensors, written as
llama.cpp writes them): every arm runs, the two float32 references (speclane's and
transformers') agree, and the bfloat16 arms differ from them by a small, nonzero KL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from speclane.models.loader import read_weights

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
import benchmark_scripts  # noqa: E402
from test_family_gguf import _write_gguf  # noqa: E402

from family_models import VOCAB, widen  # noqa: E402


def test_the_script_measures_each_arm_against_its_float32_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
    accuracy = benchmark_scripts.load("accuracy")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True)).float().eval()
    widen(hf)  # heads 32 wide: our bfloat16 attention kernel runs them
    path = _write_gguf(tmp_path / "tiny.gguf", "llama", hf, {"rope.freq_base": 10000.0})
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (20, 33, 41, 25)]
    settings = accuracy.Settings(arms=(("auto", "auto", "bfloat16", "auto"), ("auto", "torch", "bfloat16", "auto")),
                                 max_prompt_tokens=64, batch_tokens=64)
    rows = {r.arm: r for r in accuracy.measure(read_weights(str(path)), path, prompts, settings)}
    assert len(rows) == 4 and all(r.positions == 119 and r.weights == "F32 x14" for r in rows.values())
    same = rows["float32: speclane vs transformers"]
    assert same.top1_pct == 100.0 and same.mean_kl < 1e-6
    for arm in ("speclane bfloat16 auto", "speclane bfloat16 auto, kernels torch", "transformers bfloat16"):
        assert rows[arm].top1_pct > 80 and 1e-7 < rows[arm].mean_kl < 0.05, rows[arm]
    assert rows["speclane bfloat16 auto"].runs_as == "none"  # F32 layers run dense
    assert accuracy.markdown(list(rows.values())).splitlines()[2].startswith("| tiny.gguf | F32 x14 | 119 | ")
