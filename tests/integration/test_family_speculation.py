"""Speculation on every model family, on the tiny random model of each
(``family_models.py``): greedy output with the n-gram drafter (adaptive K) or the MTP
drafter (a fixed K), through the fair lane, equals speculation off, token for token; and
``speclane train-mtp`` trains a head for each family in a few seconds, into its ``--out``
(the heads shipped with the package stay as they are; an ``--out`` of another model is
refused).

The engines are the real ones (``LLMEngine`` on the saved Hugging Face folder): bfloat16
with dense weights (``--quantization auto`` on a folder) and our attention kernel on
every layer, windowed and soft-capped ones included; our int4 kernel
(``--quantization int4``, where the MTP head drafts on our kernels too); and float32.
Each test checks that drafts were accepted, so an engine that never speculates fails it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from family_models import FAMILIES, VOCAB, architecture, save_family
from speclane.cli import main
from speclane.config import EngineConfig
from speclane.drafters.mtp import HEADS_DIR
from speclane.engine.engine import LLMEngine
from speclane.models.mtp_kernel_step import KernelHead
from speclane.models.mtp_store import CONFIG
from speclane.request import SamplingParams
from speclane.training.prompts import training_prompts

MAX_MODEL_LEN = 64  # Phi-3's test model serves 64 positions (LongRoPE's short factors)
MAX_TOKENS = 40
# Engine options of each arithmetic the engine runs a Hugging Face folder in.
PRECISIONS = {"bfloat16": {}, "int4": {"quantization": "int4"}, "float32": {"dtype": "float32"}}
TRAIN_PROMPTS, TRAIN_NEW_TOKENS, TRAIN_STEPS = 12, 24, 60


@pytest.fixture(scope="module", params=list(FAMILIES))
def folder(request, tmp_path_factory) -> tuple[str, Path]:
    name = request.param
    path = tmp_path_factory.mktemp(name)
    save_family(name, path)
    return name, path


def _engine(path: Path, precision: str, request: pytest.FixtureRequest, **options: object) -> LLMEngine:
    if precision != "float32":  # bfloat16 is token-exact on our kernels (design.md, Losslessness)
        request.getfixturevalue("our_kernels")
    config = EngineConfig().replace(model=str(path), max_model_len=MAX_MODEL_LEN, num_threads=1,
                                    **PRECISIONS[precision], **options)
    return LLMEngine(config)


def _generate(engine: LLMEngine, requests: list[tuple[list[int], list[int]]],
              sampling: SamplingParams = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
              ) -> tuple[list[list[int]], list[dict]]:
    """Greedy answers of (prompt, prediction) requests run together; their token ids and
    speculative usage, in request order."""
    for i, (prompt, prediction) in enumerate(requests):
        engine.add_request(str(i), prompt, sampling, prediction_token_ids=prediction)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(requests))}
    usage: dict[str, dict] = {}
    for out in engine.run_until_done():
        tokens[out.request_id].extend(out.token_ids)
        if out.finished:
            usage[out.request_id] = out.usage["speculative"]
    assert engine.scheduler.kv.num_holders == 0 and engine.scheduler.kv.num_available_blocks == engine.cache.num_blocks
    return [tokens[str(i)] for i in range(len(requests))], [usage[str(i)] for i in range(len(requests))]


def _repetitive_prompts() -> list[list[int]]:
    """A random unit of 3-5 tokens written three times over."""
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() * 3 for n in (3, 4, 5)]


def _check_kernels(engine: LLMEngine, precision: str) -> None:
    """The bfloat16 engines run our attention kernel on every layer, and int4 our int4 kernel."""
    model = engine.model
    if precision != "float32":
        assert model.attention_library is not None and all(model.kernel_layers)
    if precision == "int4":
        assert model.layers[0].qkv.quantized.kernel != "torch"


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_ngram_greedy_output_equals_speculation_off(folder, precision, request):
    """A random prompt with its own answer as a prediction (OpenAI's Predicted Outputs,
    which the n-gram drafter looks up too; first, so that it holds the lane's first grant),
    and three repetitive prompts, drafted for where the answer repeats them. What a random
    model writes need not repeat, its prediction does: its drafts are the ones that must be
    accepted. K is fixed (adaptive K off): adaptive K times this machine, and on a busy one
    it may decide no draft is worth its verify, which would leave nothing to check."""
    name, path = folder
    prompts = [torch.randint(3, VOCAB, (7,), generator=torch.Generator().manual_seed(7)).tolist()] + _repetitive_prompts()
    off, _ = _generate(_engine(path, precision, request, spec_mode="off"), [(p, []) for p in prompts])
    engine = _engine(path, precision, request, drafter="ngram", spec_adaptive_k=False)
    _check_kernels(engine, precision)
    on, usage = _generate(engine, [(prompts[0], off[0])] + [(p, []) for p in prompts[1:]])
    assert on == off, f"{name} {precision}: speculation changed the greedy output"
    assert usage[0]["accepted_tokens"] > 0, "no draft of the predicted answer was accepted"
    assert engine.counters.slice_rounds > 0 and engine.counters.accepted_tokens == sum(u["accepted_tokens"] for u in usage)


# -- MTP --------------------------------------------------------------------------------------
def _train(path: Path, out: Path, quantization: str) -> Path:
    """``speclane train-mtp`` on the family's model, tiny: 12 prompts, 24 tokens each, 60
    steps at a high rate (the head learns its few samples by heart: a few seconds here)."""
    code = main(["train-mtp", "--model", str(path), "--out", str(out), "--quantization", quantization,
                 "--prompts", str(TRAIN_PROMPTS), "--max-new-tokens", str(TRAIN_NEW_TOKENS),
                 "--concurrency", str(TRAIN_PROMPTS), "--steps", str(TRAIN_STEPS), "--lr", "1e-2",
                 "--checkpoint-every", str(TRAIN_STEPS), "--max-model-len", str(MAX_MODEL_LEN), "--num-threads", "1"])
    assert code == 0
    return out / "mtp-head"


@pytest.fixture(scope="module")
def head_for(folder, tmp_path_factory) -> Callable[[str], Path]:
    """The family's head for a precision, trained on first use: on the int4 target for
    int4 (a head learns the hidden states of the target it drafts for), on the default
    one (bfloat16, dense) otherwise."""
    name, path = folder
    heads: dict[str, Path] = {}

    def head(precision: str) -> Path:
        quantization = "int4" if precision == "int4" else "auto"
        if quantization not in heads:
            heads[quantization] = _train(path, tmp_path_factory.mktemp(f"{name}-mtp-{quantization}"), quantization)
        return heads[quantization]

    return head


def _shipped_heads() -> dict[str, int]:
    """Every file under the package's heads folder, with its size."""
    return {str(p.relative_to(HEADS_DIR)): p.stat().st_size for p in HEADS_DIR.rglob("*") if p.is_file()}


def _training_prompts(engine: LLMEngine) -> list[list[int]]:
    """The prompts ``train-mtp`` answered (its chat rendering of ``training_prompts``)."""
    tok = engine.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
            for text in training_prompts(TRAIN_PROMPTS, seed=0)][:4]


def test_train_mtp_writes_a_head_for_the_family_model(folder, head_for):
    """The head lands in ``--out`` with the family model's fingerprint; the heads shipped
    with the package stay as they are."""
    name, path = folder
    shipped = _shipped_heads()
    head = head_for("bfloat16")
    assert _shipped_heads() == shipped
    meta = json.loads((head / CONFIG).read_text())
    target = meta["target"]
    assert target["model"] == str(path) and target["architecture"] == architecture(name)
    assert target["vocab_size"] == VOCAB and meta["mtp"]["draft_vocab"] == VOCAB
    assert meta["training"]["steps"] == TRAIN_STEPS


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_mtp_greedy_output_equals_speculation_off(folder, head_for, precision, request):
    """The head drafts alone (``--no-mtp-lookup``), three tokens every round (on a model
    this small a head step costs about what a target step does, so adaptive K would seldom
    draft), on the prompts and the answer length it was trained on."""
    name, path = folder
    engine = _engine(path, precision, request, drafter="mtp", mtp_head=str(head_for(precision)), mtp_lookup=False,
                     num_draft_tokens=3, spec_adaptive_k=False)
    _check_kernels(engine, precision)
    prompts = [(p, []) for p in _training_prompts(engine)]
    sampling = SamplingParams(max_tokens=TRAIN_NEW_TOKENS)
    off, _ = _generate(_engine(path, precision, request, spec_mode="off"), prompts, sampling)
    on, usage = _generate(engine, prompts, sampling)
    assert on == off, f"{name} {precision}: speculation changed the greedy output"
    drafter = engine.drafter
    assert drafter.lookup is None and drafter.proposals > 0
    assert isinstance(drafter.head, KernelHead) == (precision == "int4")  # drafting on our kernels
    assert sum(u["accepted_tokens"] for u in usage) > 0, "no draft of the head was accepted"


def test_mtp_without_a_head_is_a_one_line_start_up_error(folder, capsys):
    _, path = folder
    code = main(["generate", "--model", str(path), "--drafter", "mtp", "--max-tokens", "4", "t5 t6"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"speclane train-mtp --model {path} --out DIR" in err and "--mtp-head DIR/mtp-head" in err


def test_train_mtp_refuses_an_out_folder_of_another_model(tmp_path, capsys):
    """An --out folder holds one model's data and head: training another model there is a
    one-line error, not a head trained on the first model's hidden states."""
    first, second = tmp_path / "qwen3", tmp_path / "gemma3"
    for name, path in (("qwen3", first), ("gemma3", second)):
        path.mkdir()
        save_family(name, path)
    common = ["--out", str(tmp_path / "out"), "--prompts", "2", "--max-new-tokens", "4", "--data-only",
              "--max-model-len", str(MAX_MODEL_LEN), "--num-threads", "1"]
    assert main(["train-mtp", "--model", str(first), *common]) == 0
    capsys.readouterr()
    assert main(["train-mtp", "--model", str(second), *common]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"holds MTP training data of model {str(first)!r}" in err, err
    assert main(["train-mtp", "--model", str(first), *common]) == 0  # the same model resumes
