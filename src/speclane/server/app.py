"""The FastAPI app (``create_app``) and ``speclane serve`` (``serve``).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(an adapter over chat, ``responses.py``), ``GET /v1/models`` and ``GET /v1/models/{model}``,
``POST /tokenize`` and ``POST /detokenize`` (these need a key when ``--api-keys`` is given),
``GET /health``, ``GET /version``, ``GET /metrics``, ``GET /dashboard`` and its data
``GET /dashboard/state`` (``dashboard.py``).

A generation request goes: drain check (503) -> key (401) -> body validation (400) ->
model (404) -> priority allowance (403) -> tokenize in a worker thread (400 if it does
not fit) -> ``AsyncEngine.generate`` (429 queue full) -> stream or collect. The event
loop never waits on the engine: the engine ticks in its own thread and hands outputs
over through asyncio queues. A client that disconnects aborts its request: streams via
``EventStreamResponse``, non-streaming requests via ``until_disconnect``
(both in ``streaming.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from speclane.cluster.front import ClusterEngine
from speclane.config import (
    SERVE_PACING,
    ClusterConfig,
    EngineConfig,
    RuntimeEnv,
    StreamPacing,
    runtime_env,
)
from speclane.engine.async_engine import AsyncEngine
from speclane.engine.lane_recorder import LaneRecorder, LatencyWindow, merge_states
from speclane.engine.stats import Observers
from speclane.scheduler.scheduler import QueueFullError
from speclane.server.auth import KeyTable, Principal, resolve_principal
from speclane.server.dashboard import install_dashboard
from speclane.server.errors import APIError, install_error_handlers
from speclane.server.head import HeadAsGetMiddleware
from speclane.server.lifecycle import ABORT_WAIT_S, DEFAULT_GRACE_S, DrainingServer, RequestTracker
from speclane.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from speclane.server.logprobs import TokenTexts
from speclane.server.metrics import CONTENT_TYPE, ReplicaView, ServerMetrics
from speclane.server.prompts import EngineInput, Vocabulary, chat_input, completion_input
from speclane.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from speclane.server.reasoning import reads_reasoning, think_end_token
from speclane.server.responses import create_response
from speclane.server.responses_protocol import ResponseObject, ResponsesRequest
from speclane.server.streaming import (
    CANCELLED,
    Echo,
    EventStreamResponse,
    Reading,
    ResponseMeta,
    choices_body,
    collect_choices,
    sse_events,
    until_disconnect,
)
from speclane.server.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    detokenize,
    tokenize,
)
from speclane.version import __version__

QUEUE_FULL_RETRY_AFTER_S = 1
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in (
        (400, "invalid request"), (401, "missing or unknown API key"), (403, "priority not allowed for this key"),
        (404, "unknown model"), (413, "body too large"), (429, "queue full (see Retry-After)"),
        (503, "shutting down"))
}
_STREAM = {"content": {"text/event-stream": {"schema": {"type": "string"}}},
           "description": "JSON, or server-sent events when stream=true"}


class _Server:
    """What the route handlers share: the engine, keys, tokenizer view and live requests."""

    def __init__(self, async_engine: AsyncEngine | ClusterEngine, keys: KeyTable | None, model_name: str,
                 reasoning_parser: str = "auto") -> None:
        engine = async_engine.engine
        self.reasoning = reads_reasoning(reasoning_parser, engine.tokenizer.chat_template)
        self.think_end_token = think_end_token(engine.tokenizer) if self.reasoning else None
        self.decode = engine.tokenizer.decode
        self.async_engine = async_engine
        self.keys = keys
        self.model_name = model_name
        model_vocab = getattr(getattr(getattr(engine, "model", None), "config", None), "vocab_size", None)
        self.vocab = Vocabulary(engine.tokenizer, engine.max_model_len,
                                min(engine.tokenizer.vocab_size, model_vocab or engine.tokenizer.vocab_size),
                                compile_grammar=getattr(engine, "compile_grammar", None), reasoning=self.reasoning)
        self.token_texts = TokenTexts(engine.tokenizer)
        self.tracker = RequestTracker(async_engine)
        self.kv_cache = getattr(engine, "kv_pool", None)  # GET /health's view of the KV pool
        self.max_queue = engine.config.scheduler.max_queue  # each choice of a request waits in it

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"the model '{model[:200]}' does not exist: this server serves "
                                f"'{self.model_name}' (see GET /v1/models)", param="model", code="model_not_found")

    async def generate(self, request: Request, body: ChatCompletionRequest | CompletionRequest,
                       principal: Principal, *, chat: bool) -> Response:
        self.check_model(body.model)
        if self.keys is None:
            principal = Principal(tenant=body.end_user or principal.tenant, may_share_prefix_cache=True)
        principal.check_priority(body.priority)
        principal.check_cache_scope(body.cache_scope)
        build = chat_input if chat else completion_input
        engine_input: EngineInput = await anyio.to_thread.run_sync(build, body, self.vocab)
        meta = ResponseMeta.new(chat=chat, model=self.model_name)
        n = engine_input.num_choices
        if n > self.max_queue:  # its choices could never all wait: a 429 would be retried forever
            raise APIError(400, f"n is {n} but this server queues at most {self.max_queue} requests (--max-queue), "
                                f"one per choice: ask for at most {self.max_queue} choices", param="n")
        # One engine request per choice; choices 1.. copy choice 0's prompt KV.
        rids = [meta.id] if n == 1 else [f"{meta.id}-{i}" for i in range(n)]
        self.tracker.check_admitting()  # again: tokenizing took time
        streams: list[Any] = []
        try:
            for i, rid in enumerate(rids):
                # Tracked from before it is queued: a drain that starts while a cluster's
                # front admits it (an await) must see it.
                self.tracker.start(rid)
                streams.append(await self.async_engine.generate(
                    engine_input.prompt_token_ids, engine_input.sampling_for(i), request_id=rid,
                    priority=engine_input.priority, tenant=principal.tenant, tenant_weight=principal.weight,
                    speculative=engine_input.speculative, prediction_token_ids=engine_input.prediction_token_ids,
                    grammar=engine_input.grammar, prefill_source=rids[0] if i else None,
                    global_cache_scope=body.cache_scope == "global"))
        except BaseException as exc:  # refused, or the handler cancelled: no choice may run on
            # A refused choice was never queued; one whose handler was cancelled mid-call may
            # have been (a cluster front's admission is an await).
            refused = isinstance(exc, QueueFullError | ValueError | RuntimeError)
            for rid in rids[: len(streams) + (0 if refused else 1)]:
                self.async_engine.abort(rid)
            for rid in rids:
                self.tracker.done(rid)
            if isinstance(exc, QueueFullError):
                raise APIError(429, f"{exc}", headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)}) from None
            if isinstance(exc, ValueError):
                raise APIError(400, str(exc)) from None
            if isinstance(exc, RuntimeError):  # the engine thread died earlier, or no replica serves
                raise APIError(503, str(exc), code="engine_stopped", headers={"Retry-After": "5"}) from None
            raise
        reading = Reading(tool_parsing=engine_input.tool_parsing, tool_names=engine_input.tool_names,
                          single_call=engine_input.single_call,
                          top_logprobs=engine_input.top_logprobs,
                          texts=self.token_texts if engine_input.top_logprobs is not None else None,
                          reasoning=chat and self.reasoning, opens_thinking=engine_input.opens_thinking,
                          think_end_token=self.think_end_token,
                          decode=self.decode if self.reasoning and self.think_end_token is None else None,
                          echo=Echo(engine_input.echo_text, tuple(engine_input.prompt_token_ids), engine_input.echo_only)
                          if engine_input.echo_text is not None else None)

        def cancelled(out: Any) -> APIError:
            return self.tracker.cancelled_error(out.request_id, out.finish_reason, getattr(out, "error", None),
                                                getattr(out, "bad_request", False))

        def end() -> None:
            # Closing the engine streams early aborts the requests, but only once a stream
            # was iterated; abort explicitly too (a no-op for a finished request).
            for rid in rids:
                self.async_engine.abort(rid)
                self.tracker.done(rid)

        if body.stream:
            events = sse_events(meta, streams, include_usage=body.include_usage, cancelled_error=cancelled,
                                reading=reading, continuous_usage=body.continuous_usage,
                                prompt_tokens=len(engine_input.prompt_token_ids))
            return EventStreamResponse(events, on_close=end,
                                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            try:
                states = await until_disconnect(request, collect_choices(streams, reading))
            except RuntimeError as exc:  # the engine failed while generating (a stream says so in an event)
                raise APIError(500, f"the engine failed: {exc}", code="engine_stopped") from None
            if states is None:
                return Response(status_code=499)  # nobody is listening; uvicorn drops it
            final = states[-1].final
            if final is not None and final.finish_reason in CANCELLED:
                raise cancelled(final)
        finally:
            end()
        return JSONResponse(choices_body(meta, states))


def create_app(
    async_engine: AsyncEngine | ClusterEngine,
    *,
    api_keys: KeyTable | str | Path | None = None,
    model_name: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    reasoning_parser: str = "auto",
) -> FastAPI:
    """The HTTP app around a running ``AsyncEngine``. ``reasoning_parser``: whose chat
    replies' ``<think>`` block is ``reasoning_content`` (``server/reasoning.py``).

    Installs the app's ``ServerMetrics`` and the dashboard's recorders as the engine's
    observer (one app per engine gets the latency histograms). Does not shut the engine down: its owner does.
    """
    engine = async_engine.engine
    keys = KeyTable.load(api_keys) if isinstance(api_keys, str | Path) else api_keys
    server = _Server(async_engine, keys, model_name or engine.config.model.model, reasoning_parser)
    latency = LatencyWindow()
    if isinstance(async_engine, ClusterEngine):
        cluster = async_engine
        metrics = ServerMetrics(None, replicas=lambda: _replica_view(cluster))
        engine.observer = Observers(metrics, latency)
        cluster.metrics = metrics

        def dashboard_state() -> dict[str, Any]:
            return merge_states(cluster.lane_states(), queued_front=cluster.router.num_queued,
                                latency=latency.percentiles())
    else:
        metrics = ServerMetrics(engine)
        recorder = LaneRecorder(engine)
        engine.observer = Observers(metrics, recorder, latency)

        def dashboard_state() -> dict[str, Any]:
            return merge_states([("0", "healthy", recorder.state())], latency=latency.percentiles())

    app = FastAPI(title="speclane", summary="OpenAI-compatible server with a fairly shared speculative lane",
                  version=__version__)
    started = int(time.time())
    app.state.server = server
    app.state.tracker = server.tracker
    app.state.metrics = metrics
    install_error_handlers(app)
    install_dashboard(app, dashboard_state)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    app.add_middleware(HeadAsGetMiddleware)

    def admitting() -> None:
        server.tracker.check_admitting()

    def principal(request: Request) -> Principal:
        return resolve_principal(server.keys, request.headers.get("authorization"))

    guarded = [Depends(admitting)]

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, dependencies=guarded,
              responses={200: _STREAM, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request,
                               who: Principal = Depends(principal)) -> Response:
        return await server.generate(request, body, who, chat=True)

    @app.post("/v1/completions", response_model=CompletionResponse, dependencies=guarded,
              responses={200: _STREAM, **_ERRORS})
    async def completions(body: CompletionRequest, request: Request,
                          who: Principal = Depends(principal)) -> Response:
        return await server.generate(request, body, who, chat=False)

    @app.post("/v1/responses", response_model=ResponseObject, dependencies=guarded,
              responses={200: _STREAM, **_ERRORS})
    async def responses(body: ResponsesRequest, request: Request,
                        who: Principal = Depends(principal)) -> Response:
        async def chat(chat_body: ChatCompletionRequest) -> Response:
            return await server.generate(request, chat_body, who, chat=True)

        return await create_response(body, chat)

    @app.get("/v1/models", response_model=ModelList, responses={401: _ERRORS[401]})
    async def models(who: Principal = Depends(principal)) -> ModelList:
        return ModelList(data=[ModelCard(id=server.model_name, created=started, max_model_len=engine.max_model_len)])

    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def model(model: str, who: Principal = Depends(principal)) -> ModelCard:
        server.check_model(model)
        return ModelCard(id=server.model_name, created=started, max_model_len=engine.max_model_len)

    @app.post("/tokenize", response_model=TokenizeResponse, responses={k: _ERRORS[k] for k in (400, 401, 404)})
    async def tokenize_endpoint(body: TokenizeRequest, who: Principal = Depends(principal)) -> TokenizeResponse:
        if body.model is not None:
            server.check_model(body.model)
        return await anyio.to_thread.run_sync(tokenize, body, server.vocab)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses={k: _ERRORS[k] for k in (400, 401, 404)})
    async def detokenize_endpoint(body: DetokenizeRequest, who: Principal = Depends(principal)) -> DetokenizeResponse:
        if body.model is not None:
            server.check_model(body.model)
        return await anyio.to_thread.run_sync(detokenize, body, server.vocab)

    @app.get("/health", responses={503: _ERRORS[503]})
    async def health() -> dict[str, Any]:
        if async_engine.error is not None:
            raise APIError(503, f"the engine stopped: {async_engine.error}", code="engine_stopped")
        server.tracker.check_admitting()
        body = {"status": "ok", "model": server.model_name, "running": server.tracker.num_live,
                "kv_cache": server.kv_cache}
        if isinstance(async_engine, ClusterEngine):
            body.update(async_engine.health_state())  # "degraded" while a replica is down
            if body["status"] == "unavailable":
                raise APIError(503, "no replica is serving", code="no_replica")
        return body

    @app.get("/version")
    async def version() -> dict[str, str]:
        """vLLM's ``GET /version``: which speclane answers (scripts check it before a run)."""
        return {"version": __version__}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


def check_listening(host: str, port: int) -> None:
    """A ValueError where ``host:port`` cannot be listened on (another process holds it, an
    address not of this machine), found before the model loads: uvicorn finds it only when it
    starts, after the load and calibration, and exits with its own status. The probe binds as
    uvicorn does (asyncio's ``create_server``: every address the host resolves to)."""
    if port == 0:
        return

    async def probe() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host=host, port=port,
                                                                reuse_address=True)
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(probe())
    except OSError as exc:
        where = f"[{host}]:{port}" if ":" in host else f"{host or '*'}:{port}"
        reason = str(exc.strerror or exc).rsplit("): ", 1)[-1]  # asyncio's names the address again
        raise ValueError(f"cannot listen on {where}: {reason}") from None


def serve(engine_config: EngineConfig, *, host: str = "127.0.0.1", port: int = 8000,
          api_keys: str | Path | None = None, grace_s: float | None = None, log_level: str = "info",
          env: RuntimeEnv | None = None, cluster: ClusterConfig | None = None,
          stream_pacing: StreamPacing = SERVE_PACING, reasoning_parser: str = "auto") -> int:
    """Load the engine (or, with ``cluster.replicas`` > 1 or a Ray address, start the
    replicas), serve until SIGTERM/SIGINT, drain (``grace_s``, default
    ``env.shutdown_grace_s``: ``SPECLANE_SHUTDOWN_GRACE_S`` or 30 s), and return 0."""
    reads_reasoning(reasoning_parser, None)  # a bad choice fails before the model loads
    grace = grace_s if grace_s is not None else (env or runtime_env()).shutdown_grace_s(DEFAULT_GRACE_S)
    _configure_logging(log_level)
    keys = KeyTable.load(api_keys) if api_keys else None  # a bad key file fails before the model loads
    check_listening(host, port)  # and a port another process holds
    async_engine: AsyncEngine | ClusterEngine
    if cluster is not None and (cluster.replicas > 1 or cluster.ray_address):
        try:
            from speclane.cluster.launch import start_cluster  # imports Ray
        except ModuleNotFoundError as exc:
            raise ValueError(f"--replicas and --ray-address need Ray ({exc}): pip install 'speclane[cluster]'") from None
        async_engine = start_cluster(engine_config, cluster)
    else:
        from speclane.engine.engine import LLMEngine

        async_engine = AsyncEngine(LLMEngine(engine_config))
    async_engine.stream_pacing = stream_pacing
    try:
        app = create_app(async_engine, api_keys=keys, reasoning_parser=reasoning_parser)
        config = uvicorn_config(app, host=host, port=port, grace_s=grace, log_level=log_level)
        DrainingServer(config, app.state.tracker, grace).run()
    finally:
        async_engine.shutdown()
    return 0


def _replica_view(cluster: ClusterEngine) -> ReplicaView:
    return ReplicaView(cluster.snapshots(), [(c.name, h == "healthy") for c, h in zip(cluster.clients, cluster.health,
                                                                                   strict=True)],
                       cluster.router.num_queued)


def _configure_logging(level: str) -> None:
    """Our own log lines (draining, aborts) next to uvicorn's, in the same style."""
    speclane_logger = logging.getLogger("speclane")
    if not speclane_logger.handlers:
        from uvicorn.logging import DefaultFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
        speclane_logger.addHandler(handler)
    speclane_logger.setLevel(level.upper())


def uvicorn_config(app: FastAPI, *, host: str, port: int, grace_s: float, log_level: str = "info") -> Any:
    import uvicorn

    # uvicorn's own graceful timeout is only the backstop after our drain (or a second signal).
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                          timeout_graceful_shutdown=int(grace_s + ABORT_WAIT_S + 5))
