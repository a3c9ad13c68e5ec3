"""xgrammar against llguidance on the served model's tokenizer: how speclane chose its
grammar engine.

For every schema of ``speclane.bench.structured_cases`` it measures, per engine: the
compile time (a cold compiler), and the time to compute the next-token mask at every
position of the schema's example answer, teacher-forced token by token (the work a
constrained request adds to each of its decode positions). Also how many of the
example's tokens the grammar forces (one allowed token), which is what forced-token
drafting gets for free.

    pip install xgrammar llguidance    # both, only for this comparison
    python benchmarks/grammar_engines.py [--model smollm2-135m-instruct] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from speclane.bench.structured_cases import CASES, FIXED_KEY_CASES
from speclane.engine.engine import load_tokenizer
from speclane.models.loader import read_weights, resolve_model
from speclane.models.tokenizer import Tokenizer


def _tokenizer(model: str) -> tuple[Tokenizer, int]:
    weights = read_weights(resolve_model(model))
    tokenizer = load_tokenizer(weights.tokenizer_source)
    return tokenizer, weights.config.vocab_size


def _walk(fill_mask: Callable[[], object], accept: Callable[[int], bool], bitmask: torch.Tensor,
          tokens: list[int]) -> dict[str, float]:
    """Teacher-force ``tokens`` through a matcher: the mask time at each position (median,
    p90), how many positions allowed exactly one token, and whether the engine admitted the
    whole example (a valid instance of the schema; the walk stops at a refused token)."""
    mask_times, forced, admitted = [], 0, 1
    for token in tokens:
        started = time.perf_counter()
        fill_mask()
        mask_times.append(time.perf_counter() - started)
        allowed = int(sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in bitmask[0].tolist()))
        forced += allowed == 1
        if not accept(token):
            admitted = 0
            break
    return {"mask_us": statistics.median(mask_times) * 1e6,
            "mask_p90_us": sorted(mask_times)[int(0.9 * (len(mask_times) - 1))] * 1e6, "forced": forced,
            "admitted": admitted}


def measure_llguidance(tokenizer: Tokenizer, vocab_size: int, schema: dict, tokens: list[int]) -> dict[str, float]:
    import llguidance
    import llguidance.torch as llg_torch

    started = time.perf_counter()
    lltok = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                   eos_token=sorted(tokenizer.eos_token_ids)[0])
    tok_s = time.perf_counter() - started
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    matcher = llguidance.LLMatcher(lltok, grammar)
    assert not matcher.is_error(), matcher.get_error()
    compile_s = time.perf_counter() - started
    bitmask = llg_torch.allocate_token_bitmask(1, vocab_size)
    walk = _walk(lambda: llg_torch.fill_next_token_bitmask(matcher, bitmask, 0), matcher.consume_token, bitmask, tokens)
    return {"tokenizer_s": tok_s, "compile_s": compile_s, **walk}


def measure_xgrammar(tokenizer: Tokenizer, vocab_size: int, schema: dict, tokens: list[int]) -> dict[str, float]:
    import transformers
    import xgrammar

    started = time.perf_counter()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size,
                                                   stop_token_ids=sorted(tokenizer.eos_token_ids))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    tok_s = time.perf_counter() - started
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - started
    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    walk = _walk(lambda: matcher.fill_next_token_bitmask(bitmask, 0), matcher.accept_token, bitmask, tokens)
    return {"tokenizer_s": tok_s, "compile_s": compile_s, **walk}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=3, help="runs per schema and engine; the median is shown")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer, vocab_size = _tokenizer(args.model)
    engines = {"llguidance": measure_llguidance, "xgrammar": measure_xgrammar}
    totals: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    print("| schema | tokens | engine | compile ms | mask µs (median) | mask µs (p90) | forced tokens | example admitted |")
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES + FIXED_KEY_CASES:
        tokens = tokenizer.encode(json.dumps(case.example, ensure_ascii=False))
        for name, measure in engines.items():
            runs = [measure(tokenizer, vocab_size, case.schema, tokens) for _ in range(args.repeats)]
            row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            for key, value in row.items():
                totals[name].setdefault(key, []).append(value)
            print(f"| {case.name} | {len(tokens)} | {name} | {row['compile_s'] * 1e3:.1f} | {row['mask_us']:.0f} "
                  f"| {row['mask_p90_us']:.0f} | {int(row['forced'])} | {'yes' if row['admitted'] else 'NO'} |")
    print()
    print("| engine | tokenizer set-up s | compile ms (median / worst) | mask µs (median) | forced tokens (sum) "
          "| examples admitted |")
    print("|---|---|---|---|---|---|")
    for name, values in totals.items():
        print(f"| {name} | {statistics.median(values['tokenizer_s']):.2f} | "
              f"{statistics.median(values['compile_s']) * 1e3:.1f} / {max(values['compile_s']) * 1e3:.0f} | "
              f"{statistics.median(values['mask_us']):.0f} | {int(sum(values['forced']))} | "
              f"{int(sum(values['admitted']))} of {len(values['admitted'])} |")


if __name__ == "__main__":
    main()
