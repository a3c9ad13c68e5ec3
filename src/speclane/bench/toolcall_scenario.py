"""``speclane bench toolcall``: one agent turn over HTTP, speclane against llama.cpp's server.

A turn is what an agent framework sends: a chat request with a tool and
``tool_choice: "required"`` -> the model's ``tool_calls`` -> the tool runs -> a second
request with the call and its result -> the model's answer. The turn's wall time,
measured with the ``openai`` client, is compared across: speclane with its lane, speclane
with speculation off, and llama.cpp's ``llama-server`` on the same GGUF file (``--jinja``,
its own grammar-constrained tool calls), when a build is found: ``llama-server`` on
``PATH`` or the build of ``build-llama-cpp.sh`` in ``~/.cache/speclane-anchors``.
Both servers get the same threads, the same prompts, greedy decoding and the same
``max_tokens``; the arms alternate and the table reports medians.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speclane.bench.common import Table, alternate, median
from speclane.bench.driver import progress
from speclane.config import EngineConfig

ANCHORS = Path.home() / ".cache" / "speclane-anchors"
ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers and return their sum.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
QUESTIONS = ["What is 17 plus 25?", "Add 301 and 99 for me.", "How much is 12 + 30?", "What do 7 and 8 add up to?"]
MAX_TOKENS = 48


def find_llama_server() -> Path | None:
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    builds = sorted(ANCHORS.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-server"))
    return builds[-1] if builds else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy in {timeout_s:.0f} s")


@contextlib.contextmanager
def speclane_server(config: EngineConfig) -> Iterator[str]:
    """``speclane serve`` in its own process, as a user runs it."""
    port = _free_port()
    command = [str(Path(sys.executable).with_name("speclane")), "serve", "--model", config.model.model,
               "--num-threads", str(config.model.num_threads or 2), "--port", str(port)]
    with _process(command) as url:
        yield url.format(port=port)


@contextlib.contextmanager
def _process(command: list[str]) -> Iterator[str]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield "http://127.0.0.1:{port}"
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        if process.poll() is None:
            process.kill()


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int) -> Iterator[str]:
    port = _free_port()
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-c", "2048", "--jinja", "--port", str(port),
               "--host", "127.0.0.1", "-np", "1"]
    with _process(command) as url:
        yield url.format(port=port)


def agent_turn(url: str, model: str, question: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One turn; returns its wall time, the call and the answer."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=300)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    started = time.perf_counter()
    first = client.chat.completions.create(model=model, messages=messages, tools=[ADD_TOOL], tool_choice="required",
                                           temperature=0, max_tokens=MAX_TOKENS, extra_body=extra)
    calls = first.choices[0].message.tool_calls or []
    if not calls:  # the server answered in text although a call was required: no second request
        return {"wall_s": time.perf_counter() - started, "tokens": first.usage.completion_tokens, "call": None,
                "answer": first.choices[0].message.content or ""}
    call = calls[0]
    result = _sum(call.function.arguments)
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    second = client.chat.completions.create(model=model, messages=messages, tools=[ADD_TOOL], temperature=0,
                                            max_tokens=MAX_TOKENS, extra_body=extra)
    wall = time.perf_counter() - started
    tokens = first.usage.completion_tokens + second.usage.completion_tokens
    return {"wall_s": wall, "tokens": tokens, "call": call.function.arguments,
            "answer": second.choices[0].message.content or ""}


def toolcall(config: EngineConfig, quick: bool = False) -> list[Table]:
    from speclane.models.loader import resolve_model

    threads = config.model.num_threads or 2
    model = config.model.model
    binary = find_llama_server()
    repeats = 2 if quick else 3
    turns: dict[str, list[dict[str, Any]]] = {}

    def arm(name: str, url: str, served: str, extra: dict[str, Any] | None = None):
        def run() -> float:
            results = [agent_turn(url, served, q, extra) for q in QUESTIONS]
            turns.setdefault(name, []).append(results)
            return median([r["wall_s"] for r in results])
        return run

    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(speclane_server(config))
        _wait_healthy(ours)
        arms = {"speclane (lane on)": arm("speclane (lane on)", ours, model),
                "speclane (speculation off)": arm("speclane (speculation off)", ours, model, {"speculative": False})}
        if binary is not None:
            theirs = stack.enter_context(llama_server(binary, resolve_model(model), threads))
            _wait_healthy(theirs)
            arms["llama.cpp llama-server"] = arm("llama.cpp llama-server", theirs, model)
        progress("toolcall: " + ", ".join(arms))
        runs = alternate(arms, repeats=repeats)
    table = Table("One agent turn over HTTP (tool_choice required -> tool result -> answer)",
                  ["server", "turns with a valid call", "turn s (median)", "completion tokens per turn",
                   "tok/s over the turn", "tok/s vs llama.cpp"])
    rates = {}
    for name in runs:
        results = [r for rep in turns[name] for r in rep]
        rates[name] = sum(r["tokens"] for r in results) / sum(r["wall_s"] for r in results)
    reference = rates.get("llama.cpp llama-server")
    for name, values in runs.items():
        results = [r for rep in turns[name] for r in rep]
        valid = sum(1 for r in results if _parses(r["call"]))
        table.add(name, f"{valid}/{len(results)}", median(values), median([r["tokens"] for r in results]),
                  rates[name], f"{rates[name] / reference:.2f}x" if reference else "-")
    table.notes.append("A turn without a tool call (the server answered in text although the call was required) ends "
                       "after its first request; 'turns with a valid call' counts calls whose arguments parse as two integers.")
    table.notes.append(f"{len(QUESTIONS)} questions per run, {repeats} runs per arm after a warm-up, alternating; greedy, "
                       f"max_tokens {MAX_TOKENS} per request; both servers on {threads} threads and the same GGUF.")
    if binary is None:
        table.notes.append("llama-server was not found (PATH or ~/.cache/speclane-anchors): the reference arm did not run.")
    else:
        table.notes.append(f"llama-server: {binary} (--jinja, one slot).")
    return [table]


def _parses(arguments: str | None) -> bool:
    try:
        args = json.loads(arguments) if arguments is not None else None
    except json.JSONDecodeError:
        return False
    return isinstance(args, dict) and isinstance(args.get("a"), int) and isinstance(args.get("b"), int)


def _sum(arguments: str) -> str:
    """What the tool returns: the sum, or the error a real tool would report."""
    if not _parses(arguments):
        return f"error: expected integer arguments a and b, got {arguments!r}"
    args = json.loads(arguments)
    return str(args["a"] + args["b"])
