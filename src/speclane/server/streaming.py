"""Engine outputs -> OpenAI response bodies and server-sent events.

A request has ``n`` choices, one engine request each (``ChoiceState`` reads one: text,
tool calls, logprobs). A stream is: (chat only) a chunk with ``delta.role`` per choice;
chunks with each choice's new text (``delta.content``), tool calls (a chunk with the
call's ``id``, ``type`` and name, then one with its ``arguments``) and logprobs, the
choices interleaved as they come, each chunk naming its choice's ``index``; per choice
a chunk with an empty delta and its ``finish_reason``; with
``stream_options.include_usage`` a last chunk with no choices and the ``usage`` of all
choices (every earlier chunk then carries ``"usage": null``, as OpenAI does, or with
vLLM's ``continuous_usage_stats`` the token counts so far); then ``data: [DONE]``.
A request the server had to cancel (shutdown) or that failed in the engine ends with
an ``{"error": ...}`` event instead of the finish chunk, then ``data: [DONE]``.
Leaving a stream early closes the engine stream, which aborts the request; the HTTP
side of that (a client that hangs up) is ``EventStreamResponse`` for streams and
``until_disconnect`` for plain responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from speclane.engine.engine import RequestOutput
from speclane.request import TokenLogprob
from speclane.server.errors import APIError
from speclane.server.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from speclane.server.reasoning import CLOSE, ReasoningSplitter
from speclane.server.tools import ParsedCall, ToolCallParser, ToolParsing

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"
CANCELLED = ("abort", "error")  # finish reasons that mean "no complete answer"


@dataclass(frozen=True)
class ResponseMeta:
    """What every chunk and response of one request repeats."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def new(cls, *, chat: bool, model: str) -> ResponseMeta:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat=chat, model=model, id=f"{prefix}-{uuid.uuid4().hex}")

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def tokens_through(token_ids: list[int], text: str, decode: Callable[[list[int]], str]) -> int:
    """How many of ``token_ids`` it takes for their decoded text to hold ``text`` (which
    it does); a binary search, since a longer prefix's text holds a shorter one's."""
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if text in decode(token_ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return low


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class Echo:
    """A completion's prompt as its answer starts (``echo``): its text and token ids."""

    text: str
    token_ids: tuple[int, ...]
    only: bool = False  # max_tokens 0: the prompt alone; the one token the engine chose is left out


@dataclass(frozen=True)
class Reading:
    """How a request's outputs become choices: thinking split off or not (``reasoning.py``),
    tool calls parsed or not, logprobs or not."""

    tool_parsing: ToolParsing = "none"
    tool_names: tuple[str, ...] = ()
    single_call: bool = False  # parallel_tool_calls false: calls after the first are dropped
    top_logprobs: int | None = None
    texts: TokenTexts | None = None  # needed with logprobs
    reasoning: bool = False  # a chat reply's <think> block is reasoning_content
    opens_thinking: bool = False  # the prompt ends inside <think>: the reply starts in it
    think_end_token: int | None = None  # </think> as one token: reasoning tokens are counted by it
    echo: Echo | None = None  # completions' echo: the prompt, sent before the answer
    # Where </think> is several tokens: the tokenizer's decode, to find the token that ends it.
    decode: Callable[[list[int]], str] | None = None


@dataclass
class Delta:
    """What one engine output (or the end of a choice) adds to the answer."""

    content: str = ""
    reasoning: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


class ChoiceState:
    """One choice of a request: turns its engine outputs into deltas and keeps the whole answer.

    Streaming sends the deltas; a plain response is built from the same deltas, so both
    carry the same content, calls and logprobs."""

    def __init__(self, index: int, reading: Reading) -> None:
        self.index = index
        self.reading = reading
        self.splitter = ReasoningSplitter(thinking=reading.opens_thinking) if reading.reasoning else None
        self.parser = (ToolCallParser(reading.tool_names, bare_json=reading.tool_parsing == "auto",
                                      held=reading.tool_parsing in ("forced", "tagged"), single=reading.single_call,
                                      calls_only=reading.tool_parsing == "forced")
                       if reading.tool_parsing != "none" else None)
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.num_tokens = 0  # the reply's tokens so far (what continuous usage reports)
        self.think_end_at: int | None = None  # tokens up to and including the one that ends the first </think>
        # The reply's token ids, kept only where </think> is found by decoding them.
        self.token_ids: list[int] | None = [] if reading.reasoning and reading.think_end_token is None \
            and reading.decode is not None else None
        self.calls: list[ParsedCall] = []
        self.logprobs: list[TokenLogprob] = []
        self.text_offset = 0  # completions: characters of text in the logprobs so far
        self.echo = reading.echo  # the prompt to send before the answer, until the first output
        self.echo_only = reading.echo is not None and reading.echo.only
        self.final: RequestOutput | None = None

    def feed(self, out: RequestOutput) -> Delta:
        if self.echo_only:  # the answer's token is not sent, nor counted
            reason = "length" if out.finish_reason == "stop" else out.finish_reason  # its end is not the prompt's
            out = dataclasses.replace(out, text="", token_ids=[], logprobs=None, completion_tokens=0,
                                      finish_reason=reason)
        delta = Delta(logprobs=list(out.logprobs or ()))
        end = self.reading.think_end_token
        if end is not None and self.think_end_at is None and end in out.token_ids:
            self.think_end_at = self.num_tokens + out.token_ids.index(end) + 1
        self.num_tokens += len(out.token_ids)
        text = out.text
        echo, self.echo = self.echo, None
        if echo is not None:  # completions' echo: the prompt first, its logprobs before the answer's
            text = echo.text + text
            if self.reading.top_logprobs is not None:
                delta.logprobs = [TokenLogprob(echo.token_ids[0], None), *(out.prompt_logprobs or ()),
                                  *delta.logprobs]
        if self.splitter is not None:  # the thinking first; tool calls are read in the answer only
            delta.reasoning, text = self.splitter.feed(text)
            if out.finished:
                reasoning, rest = self.splitter.finish()
                delta.reasoning, text = delta.reasoning + reasoning, text + rest
            if self.token_ids is not None and self.think_end_at is None:
                self.token_ids.extend(out.token_ids)
                if self.splitter.closed and self.reading.decode is not None:
                    self.think_end_at = tokens_through(self.token_ids, CLOSE, self.reading.decode)
                    self.token_ids = None  # counted: nothing more to keep
        events = self.parser.feed(text) if self.parser is not None else [text] if text else []
        if out.finished:
            self.final = out
            if self.parser is not None:
                events += self.parser.finish()
        for event in events:
            if isinstance(event, str):
                delta.content += event
            else:
                delta.calls.append(event)
        self.content.append(delta.content)
        self.reasoning.append(delta.reasoning)
        self.calls.extend(delta.calls)
        self.logprobs.extend(delta.logprobs)
        return delta

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens of the reply's thinking (``reasoning.py``); None where they cannot be told."""
        if self.splitter is None or self.reading.think_end_token is None and self.reading.decode is None:
            return None
        if not self.splitter.thought:
            return 0
        return self.think_end_at if self.think_end_at is not None else self.num_tokens

    @property
    def finish_reason(self) -> str | None:
        reason = self.final.finish_reason if self.final is not None else None
        return "tool_calls" if self.calls and reason == "stop" else reason

    def chat_logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.reading.top_logprobs is None or self.reading.texts is None:
            return None
        return {"content": chat_logprobs(entries, self.reading.top_logprobs, self.reading.texts), "refusal": None}

    def completion_logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.reading.top_logprobs is None or self.reading.texts is None:
            return None
        body = completion_logprobs(entries, self.reading.top_logprobs, self.reading.texts, self.text_offset)
        self.text_offset += sum(len(token) for token in body["tokens"])
        return body

    # -- streaming --------------------------------------------------------------------

    def chunk_choices(self, delta: Delta, *, chat: bool) -> list[dict[str, Any]]:
        """The chunk choices of one delta (none when it adds nothing)."""
        if not chat:
            if not delta.content and not delta.logprobs:
                return []
            return [{"index": self.index, "text": delta.content,
                     "logprobs": self.completion_logprobs(delta.logprobs), "finish_reason": None}]
        deltas: list[dict[str, Any]] = []
        if delta.reasoning:
            deltas.append({"reasoning_content": delta.reasoning})
        if delta.content:
            deltas.append({"content": delta.content})
        first_call = len(self.calls) - len(delta.calls)
        for number, call in enumerate(delta.calls, start=first_call):
            deltas.append({"tool_calls": [{"index": number, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": number, "function": {"arguments": call.arguments}}]})
        if not deltas and delta.logprobs:
            deltas.append({})
        return [{"index": self.index, "delta": d, "logprobs": self.chat_logprobs(delta.logprobs) if i == 0 else None,
                 "finish_reason": None} for i, d in enumerate(deltas)]

    def finish_choice(self, *, chat: bool) -> dict[str, Any]:
        if chat:
            return {"index": self.index, "delta": {}, "logprobs": None, "finish_reason": self.finish_reason}
        return {"index": self.index, "text": "", "logprobs": None, "finish_reason": self.finish_reason}

    # -- the whole answer -------------------------------------------------------------

    def answer(self, *, chat: bool) -> dict[str, Any]:
        text = "".join(self.content)
        if not chat:
            self.text_offset = 0
            return {"index": self.index, "text": text, "logprobs": self.completion_logprobs(self.logprobs),
                    "finish_reason": self.finish_reason}
        # Forced calls leave no room for text: an answer whose one call was cut short is null, not "".
        null_if_empty = bool(self.calls) or self.reading.tool_parsing == "forced"
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not null_if_empty else None}
        if self.splitter is not None:
            message["reasoning_content"] = "".join(self.reasoning) or None
        if self.calls:
            message["tool_calls"] = [call.as_dict() for call in self.calls]
        return {"index": self.index, "message": message, "logprobs": self.chat_logprobs(self.logprobs),
                "finish_reason": self.finish_reason}


def chunk(meta: ResponseMeta, choices: list[dict[str, Any]], *, include_usage: bool = False,
          usage: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": meta.id, "object": meta.chunk_object, "created": meta.created,
                            "model": meta.model, "choices": choices}
    if include_usage:
        body["usage"] = usage
    return body


def usage_so_far(state: ChoiceState, prompt_tokens: int) -> dict[str, int]:
    """``continuous_usage_stats``' usage of a chunk of ``state``'s choice: the prompt and that
    choice's tokens so far (vLLM's: with ``n``, each choice counts its own)."""
    completion = state.num_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def role_choice(index: int) -> dict[str, Any]:
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def choices_usage(states: list[ChoiceState]) -> dict[str, Any]:
    """``total_usage`` of the finished choices, with their reasoning tokens where counted."""
    usage = total_usage([s.final for s in states if s.final is not None])
    counts = [s.reasoning_tokens for s in states if s.final is not None]
    if counts and None not in counts:
        usage["completion_tokens_details"]["reasoning_tokens"] = sum(counts)  # type: ignore[arg-type,index]
    return usage


def total_usage(finals: list[RequestOutput]) -> dict[str, Any]:
    """``usage`` of a request's choices: the prompt once, every choice's completion tokens."""
    usage = finals[0].usage
    for final in finals[1:]:
        more = final.usage
        usage["completion_tokens"] += more["completion_tokens"]  # type: ignore[operator]
        details, more_details = usage["completion_tokens_details"], more["completion_tokens_details"]
        for key in details:  # type: ignore[attr-defined]
            details[key] += more_details[key]  # type: ignore[index]
        spec, more_spec = usage["speculative"], more["speculative"]
        for key in spec:  # type: ignore[attr-defined]
            spec[key] += more_spec.get(key, 0)  # type: ignore[index,union-attr]
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]  # type: ignore[operator]
    if "wait_ms" in usage["speculative"]:  # type: ignore[operator]
        usage["speculative"]["wait_ms"] = round(usage["speculative"]["wait_ms"], 3)  # type: ignore[index]
    return usage


def usage_chunk(meta: ResponseMeta, usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": meta.id, "object": meta.chunk_object, "created": meta.created, "model": meta.model,
            "choices": [], "usage": usage}


async def merged(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The outputs of a request's choices as they come, each with its choice's index.
    Leaving early closes every stream (which aborts the choices still running)."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]):  # type: ignore[type-var]
            async for out in streams[0]:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for out in stream:
                    await queue.put((index, out))
            await queue.put((index, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def sse_events(
    meta: ResponseMeta,
    streams: list[AsyncIterator[RequestOutput]],
    *,
    include_usage: bool,
    cancelled_error: Callable[[RequestOutput], APIError],
    reading: Reading | None = None,
    continuous_usage: bool = False,
    prompt_tokens: int = 0,
) -> AsyncIterator[bytes]:
    """The event stream of one request and its choices; ``cancelled_error`` says why an
    aborted one ended. ``continuous_usage`` (with ``include_usage``): each chunk's usage is
    the counts so far, ``prompt_tokens`` and its choice's tokens."""
    states = [ChoiceState(i, reading or Reading()) for i in range(len(streams))]
    outputs = merged(streams)

    def frame(state: ChoiceState, choice: dict[str, Any]) -> bytes:
        usage = usage_so_far(state, prompt_tokens) if continuous_usage else None
        return sse(chunk(meta, [choice], include_usage=include_usage, usage=usage))

    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        if meta.chat:
            for state in states:
                yield frame(state, role_choice(state.index))
        try:
            unfinished = len(states)
            async for index, out in outputs:
                state = states[index]
                if out.finished and out.finish_reason in CANCELLED:
                    if out.token_ids:  # tokens that came with the end (a paced or joined chunk) go out first
                        sent = dataclasses.replace(out, finished=False, finish_reason=None)
                        for choice in state.chunk_choices(state.feed(sent), chat=meta.chat):
                            yield frame(state, choice)
                    yield sse(cancelled_error(out).body())
                    break
                for choice in state.chunk_choices(state.feed(out), chat=meta.chat):
                    yield frame(state, choice)
                if out.finished:
                    yield frame(state, state.finish_choice(chat=meta.chat))
                    unfinished -= 1
                    if unfinished == 0:
                        if include_usage:
                            yield sse(usage_chunk(meta, choices_usage(states)))
                        break
        except RuntimeError as exc:  # the engine stopped: say so, do not hang the client
            yield sse(APIError(500, f"the engine failed: {exc}").body())
        yield DONE


async def collect_choices(streams: list[AsyncIterator[RequestOutput]], reading: Reading | None = None) -> (
        list[ChoiceState]):
    """Every choice of a non-streaming request, finished (or the first that was cancelled)."""
    states = [ChoiceState(i, reading or Reading()) for i in range(len(streams))]
    outputs = merged(streams)
    unfinished = len(states)
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for index, out in outputs:
            states[index].feed(out)
            if out.finished:
                if out.finish_reason in CANCELLED:
                    return [states[index]]
                unfinished -= 1
                if unfinished == 0:
                    return states
    raise RuntimeError("the engine stream ended without a final output")


def choices_body(meta: ResponseMeta, states: list[ChoiceState]) -> dict[str, Any]:
    return {"id": meta.id, "object": "chat.completion" if meta.chat else "text_completion",
            "created": meta.created, "model": meta.model,
            "choices": [state.answer(chat=meta.chat) for state in states],
            "usage": choices_usage(states)}


# -- HTTP: streaming responses and disconnects ----------------------------------------


class EventStreamResponse(StreamingResponse):
    """Server-sent events. However the response ends — finished, failed, or the client
    went away (Starlette then cancels the body) — the body iterator is closed at once,
    not when it is garbage-collected, and ``on_close`` runs even if the body never
    started (a client gone before the first byte)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            finally:
                self.on_close()


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; if the client disconnects first, cancel it (aborting the request) and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
