"""Decode speed: single-stream tok/s against transformers' generate(), one
decode step at batch 1/4/8/16, and the memory-bandwidth ceiling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from speclane.bench.common import Table, alternate, median
from speclane.config import EngineConfig
from speclane.engine.calibration import forward_ms
from speclane.llm import LLM
from speclane.request import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def load_transformers(model_name: str, dtype: torch.dtype = torch.bfloat16):
    """transformers' model of the same files the engine serves (``--model``): a GGUF file
    through its GGUF reader, a Hugging Face folder as it is."""
    from transformers import AutoModelForCausalLM

    from speclane.models.loader import resolve_model

    path = resolve_model(model_name)
    if path.is_file():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    return model


def transformers_generate(model, prompt_ids: list[int], new_tokens: int, **kwargs: Any) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=2, **kwargs)
    return time.perf_counter() - start, out[0, len(prompt_ids):].tolist()


def engine_decode_rate(llm: LLM, prompt_ids: list[int], new_tokens: int) -> float:
    """speclane's engine (``llm``) decoding ``new_tokens`` tokens after the first one, in tok/s:
    what ``llama-bench``'s tg test measures (generation steps alone, no prompt processing),
    so the prompt's prefill and the first token are left out. Greedy, ``ignore_eos``."""
    from speclane.bench.driver import Job, drive

    job = Job("decode", list(prompt_ids), SamplingParams(max_tokens=new_tokens + 1, ignore_eos=True))
    timelines, _ = drive(llm.engine, [job])
    return timelines["decode"].decode_rate


def engine_decode_arms(config: EngineConfig, inputs: dict[str, str], prompt: str, new_tokens: int
                       ) -> dict[str, Callable[[], float]]:
    """Per name, an engine of ``config`` (speculation off) with those ``--matmul-inputs``
    (``inputs``: name -> bfloat16 or int8), warmed up, as an arm measuring
    ``engine_decode_rate`` after ``prompt`` (a chat message): the engine-alone arms that
    ``bench vs-llama-cpp`` and ``bench gguf`` alternate with llama-bench."""
    engines = {name: LLM(config=config.replace(spec_mode="off", matmul_inputs=kind)) for name, kind in inputs.items()}
    prompt_ids = next(iter(engines.values())).encode_prompt(prompt, chat=True)
    for llm in engines.values():
        llm.generate([prompt_ids], SamplingParams(max_tokens=8))  # warm-up
    return {name: (lambda llm=llm: engine_decode_rate(llm, prompt_ids, new_tokens)) for name, llm in engines.items()}


def ours_generate(llm: LLM, prompt_ids: list[int], new_tokens: int, **options: Any) -> tuple[float, list[int]]:
    sp = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt_ids], sp, **options)[0]
    return time.perf_counter() - start, out.token_ids


def measure_bandwidth_gbs(size_mb: int = 512, repeats: int = 5) -> float:
    src = torch.empty(size_mb * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best / 1e9  # read + write


def weight_bytes_per_token(llm: LLM) -> int:
    """Bytes of weights one single-token decode step reads (the kernels it actually uses)."""
    model = llm.engine.model
    total = 0
    linears = [layer.qkv for layer in model.layers] + [layer.o for layer in model.layers]
    linears += [layer.gate_up for layer in model.layers] + [layer.down for layer in model.layers] + [model.lm_head]
    for lin in linears:
        q = lin.quantized
        if q is None:
            total += lin.dense.numel() * lin.dense.element_size()
        elif hasattr(q, "nbytes"):
            total += q.nbytes
        else:
            total += q.q.numel() + q.scale.numel() * 2
    return total


def forward_time_ms(llm: LLM, batch: int = 1, positions: int = 1, kv_len: int = 200, repeats: int = 10) -> float:
    """Median ms of one forward + logits: ``batch`` sequences with ``positions`` new tokens each
    (positions 1: a decode step; one sequence with n positions: a verify of n - 1 drafts)."""
    model, cache = llm.engine.model, llm.engine.cache
    times = [forward_ms(model, cache, batch=batch, positions=positions, kv_len=kv_len) for _ in range(repeats + 2)]
    return median(times[2:])


def run(config: EngineConfig, repeats: int = 3, new_tokens: int = 128) -> list[Table]:
    torch.set_num_threads(2)
    llm = LLM(config=config.replace(spec_mode="off"))
    prompt_ids = llm.encode_prompt(PROMPT, chat=True)
    hf = load_transformers(config.model.model, torch.bfloat16)
    runs = alternate(
        {
            "speclane": lambda: new_tokens / ours_generate(llm, prompt_ids, new_tokens)[0],
            "transformers": lambda: new_tokens / transformers_generate(hf, prompt_ids, new_tokens)[0],
        },
        repeats,
    )
    ours, ref = median(runs["speclane"]), median(runs["transformers"])
    t1 = Table(
        f"Single-stream greedy decode, {new_tokens} new tokens, {torch.get_num_threads()} threads",
        ["engine", "config", "tok/s (median)", "runs", "vs transformers"],
    )
    mc = config.model
    quant = f"{mc.dtype}, quantization={llm.engine.model.quantization}"
    t1.add("speclane", quant, ours, ", ".join(f"{x:.1f}" for x in runs["speclane"]), f"{ours / ref:.2f}x")
    t1.add("transformers generate()", "bfloat16", ref, ", ".join(f"{x:.1f}" for x in runs["transformers"]), "1.00x")
    t1.notes.append("A B alternation after a discarded warm-up of each arm, same prompt, same process.")

    t2 = Table("One decode step (forward + logits), KV length 200", ["batch", "ms/step", "tok/s"])
    for batch in (1, 4, 8, 16):
        ms = forward_time_ms(llm, batch=batch)
        t2.add(batch, ms, batch * 1000 / ms)

    t_verify = Table("One sequence, n positions in one forward (a verify of K = n - 1 drafts), KV length 200",
                     ["positions", "ms", "vs 1 position"])
    one = forward_time_ms(llm)
    for n in range(1, 7):
        ms = one if n == 1 else forward_time_ms(llm, positions=n)
        t_verify.add(n, ms, f"{ms / one:.2f}x")
    t_verify.notes.append("What a speculative round costs next to a decode step; the lane's default K follows from it.")

    bw = measure_bandwidth_gbs()
    wb = weight_bytes_per_token(llm)
    ceiling = bw * 1e9 / wb
    t3 = Table("Memory-bandwidth ceiling (batch 1)", ["weight bytes / token", "copy bandwidth", "ceiling tok/s", "reached"])
    t3.add(f"{wb / 1e6:.1f} MB", f"{bw:.1f} GB/s", ceiling, f"{ours / ceiling:.0%}")
    t3.notes.append("Bandwidth: best of 5 copies of 512 MB (read + write bytes). Ceiling = bandwidth / weight bytes read per token.")
    return [t1, t2, t_verify, t3]
