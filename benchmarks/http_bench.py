"""HTTP vs direct engine: RPS and TTFT p50/p99 for 1, 8, 32 concurrent streaming clients."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = int(os.environ.get("BENCH_MAX_TOKENS", 32))
OPTS = ["--max-model-len", "1024", "--num-threads", "1"]
PROMPTS = [f"Write two sentences about topic number {i}." for i in range(64)]


def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


async def http_run(url, conc, n):
    ttfts, toks = [], 0
    sem = asyncio.Semaphore(conc)
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)
    ) as c:

        async def one(i):
            nonlocal toks
            async with sem:
                t0 = time.perf_counter()
                first = None
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": PROMPTS[i % 64]}],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        d = json.loads(line[6:])
                        if (
                            first is None
                            and d["choices"]
                            and d["choices"][0]["delta"].get("content")
                        ):
                            first = time.perf_counter() - t0
                        if d.get("usage"):
                            toks += d["usage"]["completion_tokens"]
                ttfts.append(first)

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t), ttfts, toks


async def direct_run(ae, tok, conc, n):
    from speclane.request import SamplingParams

    ttfts, toks = [], 0
    sem = asyncio.Semaphore(conc)

    async def one(i):
        nonlocal toks
        async with sem:
            t0 = time.perf_counter()
            first = None
            ids = tok.encode(
                tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % 64]}])
            )
            stream = await ae.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
            async for out in stream:
                if first is None and out.text:
                    first = time.perf_counter() - t0
                if out.finished:
                    toks += out.completion_tokens
            ttfts.append(first)

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return n / (time.perf_counter() - t), ttfts, toks


def report(name, conc, rps, ttfts, toks, wall=None):
    print(
        f"{name:7s} c={conc:2d} n={len(ttfts):3d}  req/s={rps:6.2f}  TTFT p50={pct(ttfts, 50) * 1000:7.0f} ms  p99={pct(ttfts, 99) * 1000:7.0f} ms  tokens={toks}",
        flush=True,
    )


def main():
    which = sys.argv[1]
    concs = [1, 8, 32]
    n_of = {1: 8, 8: 32, 32: 64}
    if which == "http":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        proc = subprocess.Popen(
            [sys.executable, "-m", "speclane.cli", "serve", "--port", str(port), *OPTS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        asyncio.run(http_run(url, 4, 4))  # warm-up
        for c in concs:
            report("http", c, *asyncio.run(http_run(url, c, n_of[c])))
        proc.send_signal(signal.SIGTERM)
        print("exit", proc.wait())
    else:
        from speclane.config import EngineConfig
        from speclane.engine.async_engine import AsyncEngine
        from speclane.engine.engine import LLMEngine

        ae = AsyncEngine(LLMEngine(EngineConfig().replace(max_model_len=1024, num_threads=1)))
        tok = ae.engine.tokenizer

        async def all_():
            await direct_run(ae, tok, 4, 4)
            for c in concs:
                report("direct", c, *(await direct_run(ae, tok, c, n_of[c])))

        asyncio.run(all_())
        ae.shutdown()


main()
