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
import time
from typing import Any

from speclane.bench.common import Table, alternate, median
from speclane.bench.driver import progress
from speclane.bench.http_streams import new_tenant
from speclane.bench.llama_cpp import find_llama_cpp_tool, llama_server
from speclane.bench.servers import speclane_server
from speclane.config import EngineConfig

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers and return their sum.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
QUESTIONS = ["What is 17 plus 25?", "Add 301 and 99 for me.", "How much is 12 + 30?", "What do 7 and 8 add up to?"]
MAX_TOKENS = 48


# The call as a JSON object in the reply's text: how a server that enforces no tool_choice
# can still be made to answer with a valid call, through its structured outputs.
CALL_FORMAT = {"type": "json_schema", "json_schema": {"name": "add_call", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"const": "add"}, "arguments": ADD_TOOL["function"]["parameters"]},
    "required": ["name", "arguments"], "additionalProperties": False}}}


def agent_turn(url: str, model: str, question: str, extra: dict[str, Any] | None = None, *,
               call_by_schema: bool = False) -> dict[str, Any]:
    """One turn; returns its wall time, tokens, the call's arguments and the answer.

    ``call_by_schema``: the first request asks for the call through ``response_format``
    (``CALL_FORMAT``) instead of ``tool_choice: "required"``, and the call is read from the text.
    """
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=300)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    started = time.perf_counter()
    forcing: dict[str, Any] = {"response_format": CALL_FORMAT} if call_by_schema else {
        "tools": [ADD_TOOL], "tool_choice": "required"}
    first = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS,
                                           extra_body=extra, **forcing)
    message = first.choices[0].message
    call_id, arguments = "call_0", None
    if call_by_schema:
        with contextlib.suppress(json.JSONDecodeError, TypeError, KeyError):
            arguments = json.dumps(json.loads(message.content or "")["arguments"])
    elif message.tool_calls:
        call_id, arguments = message.tool_calls[0].id, message.tool_calls[0].function.arguments
    tokens = first.usage.completion_tokens
    prompt_tokens = first.usage.prompt_tokens
    if arguments is None:  # no call although one was required: no second request
        return {"wall_s": time.perf_counter() - started, "tokens": tokens, "prompt_tokens": prompt_tokens,
                "call": None, "answer": message.content or ""}
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call_id, "content": _sum(arguments)})
    second = client.chat.completions.create(model=model, messages=messages, tools=[ADD_TOOL], temperature=0,
                                            max_tokens=MAX_TOKENS, extra_body=extra)
    return {"wall_s": time.perf_counter() - started, "tokens": tokens + second.usage.completion_tokens,
            "prompt_tokens": prompt_tokens + second.usage.prompt_tokens, "call": arguments,
            "answer": second.choices[0].message.content or ""}


def toolcall(config: EngineConfig, quick: bool = False) -> list[Table]:
    from speclane.models.loader import resolve_model

    threads = config.model.num_threads or 2
    model = config.model.model
    binary = find_llama_cpp_tool("llama-server")
    repeats = 2 if quick else 3
    turns: dict[str, list[dict[str, Any]]] = {}

    def arm(name: str, url: str, served: str, extra: dict[str, Any] | None = None, call_by_schema: bool = False):
        def run() -> float:
            # Each of speclane's runs a tenant of its own: the questions repeat run after run, and
            # under one tenant the suffix drafter would draft each answer from the last run's. Within
            # a run the turns share it, as one application's do (and its tools' prefix in the cache).
            body = extra if url != ours else new_tenant(extra)
            results = [agent_turn(url, served, q, body, call_by_schema=call_by_schema) for q in QUESTIONS]
            turns.setdefault(name, []).append(results)
            return median([r["wall_s"] for r in results])
        return run

    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(speclane_server(config)).url
        arms = {"speclane (lane on)": arm("speclane (lane on)", ours, model),
                "speclane (speculation off)": arm("speclane (speculation off)", ours, model, {"speculative": False})}
        if binary is not None:
            theirs = stack.enter_context(llama_server(binary, resolve_model(model), threads)).url
            arms["llama.cpp llama-server"] = arm("llama.cpp llama-server", theirs, model)
            arms["llama.cpp, call by response_format"] = arm("llama.cpp, call by response_format", theirs, model,
                                                             call_by_schema=True)
        arms["speclane, call by response_format"] = arm("speclane, call by response_format", ours, model,
                                                        call_by_schema=True)
        progress("toolcall: " + ", ".join(arms))
        runs = alternate(arms, repeats=repeats)
    table = Table("One agent turn over HTTP (a required call -> the tool's result -> the answer)",
                  ["server", "turns with a valid call", "turn s (median)", "prompt tokens per turn",
                   "completion tokens per turn", "tok/s over the turn"])
    for name, values in runs.items():
        results = [r for rep in turns[name] for r in rep]
        valid = sum(1 for r in results if _parses(r["call"]))
        rate = sum(r["tokens"] for r in results) / sum(r["wall_s"] for r in results)
        table.add(name, f"{valid}/{len(results)}", median(values), median([r["prompt_tokens"] for r in results]),
                  median([r["tokens"] for r in results]), rate)
    if "llama.cpp, call by response_format" in runs:
        ours_s, theirs_s = (median(runs[f"{who}, call by response_format"]) for who in ("speclane", "llama.cpp"))
        table.notes.append("Like for like (both servers forced to the call by the same json_schema response_format, two "
                           f"requests per turn, greedy): llama.cpp's turn takes {theirs_s / ours_s:.2f}x speclane's. The "
                           "answers differ in length (each server renders the history with its own template), so the "
                           "tok/s column is the per-token comparison.")
    table.notes.append("A turn without a call (the server answered in text although one was required) ends after its "
                       "first request; 'turns with a valid call' counts calls whose arguments parse as two integers. "
                       "'call by response_format': the first request asks for the call as a JSON object through "
                       "response_format json_schema instead of tool_choice, and the call is read from the text.")
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
