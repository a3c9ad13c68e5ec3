"""Concurrent streaming chat completions against an OpenAI-compatible server, and the
aggregate rate they reach: the load a server sees from several users at once.

Two clients send the same requests: the ``openai`` SDK, one thread per stream
(``concurrent_streams``: what most applications run), and a light one, every stream on one
asyncio loop with ``httpx`` and ``json.loads`` per chunk (``light_streams``: what serving
benchmarks such as vLLM's run). On a machine whose cores the server shares with its
clients, the SDK's parsing of each chunk is taken from the server, and more from a faster
one: its chunks come faster.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from speclane.bench.driver import run_tenant

# The body fields both clients send beside the model, the messages and max_tokens: greedy,
# streamed, the usage in the last chunk.
GREEDY_STREAM: dict[str, Any] = {"temperature": 0, "seed": 0, "stream": True, "stream_options": {"include_usage": True}}

# A benchmark table's note on its two clients (the rows name the light one).
CLIENTS_NOTE = ("Clients: the openai SDK, a thread per stream; 'light client': every stream on one asyncio loop "
                "(httpx, json.loads per chunk; bench/http_streams.py), against llama-server with the same client. "
                "The clients run on the servers' cores: the SDK's parsing of each chunk is taken from the server, "
                "the more the faster its chunks come.")


@dataclass(frozen=True)
class StreamResult:
    started: float  # time.perf_counter() when the request was sent
    finished: float  # ... when its last chunk arrived
    completion_tokens: int  # the server's usage count
    first_token: float | None = None  # ... when the first content chunk arrived (None: none did)
    drafts: tuple[int, int] = (0, 0)  # speculation's drafted and accepted tokens, where the server says


def aggregate_rate(results: Sequence[StreamResult]) -> float:
    """Completion tokens of every stream per second, from the first stream's start to the
    last one's end (the streams' wall time together, not the sum of their times)."""
    if not results:
        return float("nan")
    wall = max(r.finished for r in results) - min(r.started for r in results)
    return sum(r.completion_tokens for r in results) / wall


def decode_rate(result: StreamResult) -> float:
    """Tokens per second after the first content chunk: the decode phase alone, without the
    prompt's prefill; NaN where fewer than two tokens came or nothing came after the first."""
    if result.first_token is None or result.completion_tokens < 2 or result.finished <= result.first_token:
        return float("nan")
    return (result.completion_tokens - 1) / (result.finished - result.first_token)


def stream_chat(url: str, model: str, prompt: str | Sequence[Mapping[str, str]], max_tokens: int,
                extra: dict[str, Any] | None = None) -> StreamResult:
    """One greedy streamed chat completion of ``prompt`` (one user message, or the messages
    of a conversation), read to its end; its token count is the usage the server sends in
    its last chunk (``stream_options.include_usage``)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    started = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, **GREEDY_STREAM,
                                            extra_body=extra)
    tokens = first = None
    drafts = (0, 0)
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
            drafts = speculation_counts(chunk.model_extra or {}, chunk.usage.model_extra or {}) or drafts
    if tokens is None:
        raise RuntimeError(f"{url} sent no usage at the end of a stream (stream_options.include_usage)")
    return StreamResult(started, time.perf_counter(), tokens, first, drafts)


def speculation_counts(chunk_extra: Mapping[str, Any], usage_extra: Mapping[str, Any]) -> tuple[int, int] | None:
    """(drafted, accepted) tokens from a stream's last chunk: speclane's ``usage.speculative``
    (``draft_tokens``, ``accepted_tokens``) or llama-server's ``timings`` (``draft_n``,
    ``draft_n_accepted``, absent where it drafted nothing); None where neither is there."""
    speculative = usage_extra.get("speculative")
    if isinstance(speculative, Mapping):
        return int(speculative.get("draft_tokens", 0)), int(speculative.get("accepted_tokens", 0))
    timings = chunk_extra.get("timings")
    if isinstance(timings, Mapping):
        return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
    return None


def new_tenant(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``extra`` with a tenant of its own (``user``: ``driver.run_tenant``, whose docstring
    says why) for speclane's server, reading and writing the prefix cache every tenant may
    share (``cache_scope: "global"``): a new tenant drafts nothing from an earlier run's
    answers, but its prompts are still the cached ones, as the prompts llama-server's slots
    keep (``cache_prompt``) are for its arm."""
    return {**(extra or {}), "user": run_tenant(), "cache_scope": "global"}


def histogram_totals(url: str, names: Sequence[str]) -> dict[str, tuple[float, int]]:
    """(sum, count) of each named histogram on a speclane server's ``/metrics`` (the names
    it has; a difference of two readings is what happened between them)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    totals = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name in names:
            samples = {s.name.rsplit("_", 1)[-1]: s.value for s in family.samples if s.name.endswith(("_sum", "_count"))}
            totals[family.name] = (samples["sum"], int(samples["count"]))
    return totals


def concurrent_streams(url: str, model: str, prompts: Sequence[str], max_tokens: int,
                       extra: dict[str, Any] | None = None) -> list[StreamResult]:
    """One stream per prompt, all sent at once, each on its own connection."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(stream_chat, url, model, prompt, max_tokens, extra) for prompt in prompts]
        return [future.result() for future in futures]


def light_streams(url: str, model: str, prompts: Sequence[str], max_tokens: int, extra: dict[str, Any] | None = None,
                  transport: Any = None) -> list[StreamResult]:
    """``concurrent_streams``'s requests from the light client: one asyncio loop, one
    ``httpx`` connection per stream, each ``data:`` line read by ``json.loads`` (no models
    built). ``transport``: httpx's, for tests."""
    import httpx

    async def run() -> list[StreamResult]:
        async with httpx.AsyncClient(timeout=600, transport=transport,
                                     limits=httpx.Limits(max_connections=max(1, len(prompts)))) as client:
            return list(await asyncio.gather(*(_light_stream(client, url, model, p, max_tokens, extra) for p in prompts)))

    return asyncio.run(run())


async def _light_stream(client: Any, url: str, model: str, prompt: str, max_tokens: int,
                        extra: dict[str, Any] | None) -> StreamResult:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            **GREEDY_STREAM, **(extra or {})}
    started = time.perf_counter()
    tokens = first = None
    drafts = (0, 0)
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {(await response.aread())[:500]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            choices = chunk.get("choices") or ()
            if first is None and choices and (choices[0].get("delta") or {}).get("content"):
                first = time.perf_counter()
            usage = chunk.get("usage")
            if usage:
                tokens = usage["completion_tokens"]
                drafts = speculation_counts(chunk, usage) or drafts
    if tokens is None:
        raise RuntimeError(f"{url} sent no usage at the end of a stream (stream_options.include_usage)")
    return StreamResult(started, time.perf_counter(), tokens, first, drafts)
