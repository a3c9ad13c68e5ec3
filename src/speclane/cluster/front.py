"""The cluster front: ``AsyncEngine``'s surface (``generate``, ``abort``) over replicas.

The FastAPI app serves a ``ClusterEngine`` exactly as it serves one ``AsyncEngine``. The
front runs its own asyncio loop in a thread (the app's loop only hands requests over and
reads streams), which owns every piece of state below:

- the ``Router`` (``router.py``): the global, tenant-fair admission queue and placement;
- one loop per replica that long-polls it (``ReplicaHost.poll``, ``replica.py``), routes
  each output to its request's stream, measures TTFT and inter-token gaps as the client
  sees them, and every ``counter_sync_ms`` exchanges the lane-service counters
  (``shared_service.py``);
- faults: a replica whose call fails (its process died) or that answers no poll for
  ``health_timeout_s`` is taken out of placement. Its requests that have sent no token yet
  go back to the head of the queue and run elsewhere; the others end with
  ``finish_reason="error"`` (an error event in the stream). The loop then pings it until
  it answers (Ray restarts a dead actor) and puts it back. A replica that answers with a
  new incarnation has restarted: the same happens to the requests it had. A replica whose
  engine fails exits to be restarted (``ReplicaHost``); a poll failing any other way is
  handled as a dead replica, so no replica's loop ends while the front runs.
- refusals before queueing, as one engine refuses: a request no replica's KV pool could
  hold (``ValueError``, a 400), and any request while no replica serves (a 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from speclane.cluster.client import ReplicaClient, ReplicaUnavailable
from speclane.cluster.replica import PollReply
from speclane.cluster.router import Pending, Router, prefix_hashes
from speclane.cluster.shared_service import SharedService
from speclane.config import ClusterConfig, EngineConfig, StreamPacing
from speclane.engine.engine import RequestOutput, check_token_ids
from speclane.engine.stats import EngineObserver, sum_snapshots, totals_only
from speclane.engine.stream_mailbox import StreamMailbox, paced_interval_s, read_stream
from speclane.request import SamplingParams
from speclane.scheduler.scheduler import check_request_fits

log = logging.getLogger("speclane.cluster")

STATUS_EVERY_S = 0.25  # how often a poll also brings the replica's counters and lane state
POLL_WAIT_S = 0.2
PING_EVERY_S = 0.5


class ClusterMetricsSink(Protocol):
    """What the front measures beyond an ``EngineObserver``'s TTFT and gaps."""

    def on_tick(self, seconds: float) -> None: ...

    def observe_spec_wait(self, seconds: float) -> None: ...

    def observe_dispatch(self, seconds: float) -> None: ...  # arrival -> the replica accepted it

    def observe_delivery(self, seconds: float) -> None: ...  # a poll reply's trip from the replica


@dataclass(frozen=True)
class _VocabShape:
    vocab_size: int


@dataclass
class FrontView:
    """What the app reads of "the engine" (``app._Server``): the model's tokenizer, context,
    vocabulary and KV pool, as replica 0 describes them; grammars compile here to be checked
    (the replica compiles the spec again, from its cache)."""

    config: EngineConfig
    tokenizer: Any
    max_model_len: int
    kv_pool: dict[str, object]
    vocab_size: int
    observer: EngineObserver | None = None
    _grammars: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model(self) -> Any:
        return _ModelShape(_VocabShape(self.vocab_size))

    def compile_grammar(self, spec: Any) -> Any:
        from speclane.grammar.compiler import GrammarCompiler

        with self._lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size)
        return self._grammars.compile(spec)


@dataclass(frozen=True)
class _ModelShape:
    config: _VocabShape


@dataclass(eq=False)
class _Live:
    request_id: str
    tenant: str
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams
    options: dict[str, Any]
    mailbox: StreamMailbox  # to the app's loop
    arrival_s: float
    pending: Pending | None = None
    replica: int | None = None
    tokens_sent: int = 0
    last_token_s: float = 0.0
    aborted: bool = False


class ClusterEngine:
    """See the module docstring. ``clients[i]`` is replica i (``client.ReplicaClient``)."""

    def __init__(self, clients: Sequence[ReplicaClient], config: EngineConfig, cluster: ClusterConfig, *,
                 on_shutdown: Callable[[], None] | None = None, ready_timeout_s: float = 300.0) -> None:
        self.clients = list(clients)
        self.cluster = cluster
        self.error: BaseException | None = None
        self.stream_pacing = StreamPacing()  # read_stream's (serve sets it)
        self.metrics: ClusterMetricsSink | None = None  # the app's histograms (create_app sets it)
        self._on_shutdown = on_shutdown
        self._ready_timeout_s = ready_timeout_s
        n = len(self.clients)
        self.router = Router(n, capacity=config.scheduler.max_num_seqs, max_queue=config.scheduler.max_queue,
                             affinity_slack=cluster.affinity_slack)
        for i in range(n):
            self.router.set_healthy(i, False)  # until its first poll answers
        self.shared = SharedService(n)
        self.health = ["starting"] * n
        self.outages = [0] * n
        self.statuses: list[dict[str, Any] | None] = [None] * n
        self._incarnations: list[str | None] = [None] * n
        self._live: dict[str, _Live] = {}
        self._retired: dict[str, Any] = {}  # counters of replica incarnations that are gone
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="speclane-front", daemon=True)
        self._thread.start()
        described = self._run(self.clients[0].call("describe"), ready_timeout_s)
        self.engine = FrontView(config, described["tokenizer"], described["max_model_len"], described["kv_pool"],
                                described["vocab_size"])
        self._tasks = [self._run(self._spawn(self._replica_loop(i)), 10) for i in range(n)]

    # -- the app's side (any loop) --------------------------------------------------------
    async def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams, *,
                       request_id: str | None = None, **options: Any) -> AsyncIterator[RequestOutput]:
        """Queue a request in the cluster and return its stream (``AsyncEngine.generate``)."""
        check_token_ids(self.engine.vocab_size, prompt_token_ids, options.get("prediction_token_ids", ()), sampling)
        pool = self.engine.kv_pool  # every replica's: they share one config
        check_request_fits(len(prompt_token_ids), sampling.max_tokens, self.engine.max_model_len,
                           int(pool["block_size"]), int(pool["blocks"]))  # type: ignore[call-overload]
        if not any(h == "healthy" for h in self.health):
            raise ReplicaUnavailable("no replica is serving (every one is restarting or down): retry later")
        grammar = options.get("grammar")
        if grammar is not None and hasattr(grammar, "spec"):
            options["grammar"] = grammar.spec  # a compiled grammar stays here; the replica compiles the spec
        live = _Live(request_id or uuid.uuid4().hex, options.get("tenant", "anonymous"), list(prompt_token_ids),
                     sampling, options, StreamMailbox(asyncio.get_running_loop()), time.monotonic())
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._admit(live), self._loop))
        return self._stream(live)

    def _stream(self, live: _Live) -> AsyncIterator[RequestOutput]:
        def closed(finished: bool) -> None:
            if not finished:  # the consumer left early: cancel the work
                self.abort(live.request_id)

        return read_stream(live.mailbox, closed, lambda: paced_interval_s(self.stream_pacing, self.num_streams))

    def abort(self, request_id: str) -> None:
        with contextlib.suppress(RuntimeError):  # the front's loop is closed
            self._loop.call_soon_threadsafe(self._abort, request_id)

    @property
    def num_streams(self) -> int:
        return len(self._live)

    def health_state(self) -> dict[str, Any]:
        healthy = sum(h == "healthy" for h in self.health)
        status = "ok" if healthy == len(self.health) else "degraded" if healthy else "unavailable"
        return {"status": status, "replicas": [
            {"name": c.name, "health": h, "outages": o, "running": self.router.load(i)}
            for i, (c, h, o) in enumerate(zip(self.clients, self.health, self.outages, strict=True))],
            "queued": self.router.num_queued}

    def snapshots(self) -> list[tuple[str, dict[str, Any]]]:
        """Each answering replica's counters (``EngineCounters.snapshot``), at most
        ``STATUS_EVERY_S`` old, and the totals of replica incarnations that are gone (so
        the sums never go back)."""
        live = [(c.name, s["counters"]) for c, s in zip(self.clients, self.statuses, strict=True) if s is not None]
        return [*live, ("retired", self._retired)] if self._retired else live

    def lane_states(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """``(name, health, LaneRecorder.state())`` per replica, for the dashboard."""
        return [(c.name, h, s["lane"] if s is not None and h == "healthy" else None)
                for c, h, s in zip(self.clients, self.health, self.statuses, strict=True)]

    def replica_pid(self, i: int) -> int:
        """The process id of replica ``i`` (operations, the fault tests)."""
        return int(self._run(self.clients[i].call("pid"), 30))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until every replica answers (tests, start-up)."""
        deadline = time.monotonic() + timeout_s
        while any(h != "healthy" for h in self.health):
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas not ready after {timeout_s:.0f} s: {self.health}")
            time.sleep(0.1)

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        with contextlib.suppress(Exception):
            self._run(self._cancel_tasks(), timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if self._on_shutdown is not None:
            self._on_shutdown()

    # -- the front's loop -------------------------------------------------------------------
    def _run(self, coroutine: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coroutine)

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _admit(self, live: _Live) -> None:
        if live.request_id in self._live:
            raise ValueError(f"request id {live.request_id!r} is already in use")
        weight = float(live.options.get("tenant_weight", 1.0))
        live.pending = Pending(live.request_id, live.tenant, weight, prefix_hashes(live.tenant, live.prompt_token_ids),
                               payload=live)
        self.router.enqueue(live.pending)
        self._live[live.request_id] = live
        self._dispatch()

    def _dispatch(self) -> None:
        while (pending := self.router.place_next()) is not None:
            live: _Live = pending.payload
            live.replica = pending.replica
            asyncio.get_running_loop().create_task(self._start(pending))

    async def _start(self, pending: Pending) -> None:
        live: _Live = pending.payload
        replica = pending.replica
        assert replica is not None
        try:
            await self.clients[replica].call("add", live.request_id, live.prompt_token_ids, live.sampling,
                                             live.options)
        except ReplicaUnavailable:
            self.health[replica] = "down"  # its loop finds out too, and puts it back when it answers
            self.router.set_healthy(replica, False)
            if live.replica == replica and not live.aborted:
                self.router.requeue(pending)
                live.replica = None
            self._dispatch()
            return
        except Exception as exc:  # noqa: BLE001 - the engine refused it (ValueError, queue full)
            self._end(live, "error", f"replica {self.clients[replica].name} refused the request: {exc}")
            return
        if self.metrics is not None:
            self.metrics.observe_dispatch(time.monotonic() - live.arrival_s)
        if live.aborted:
            await self._abort_on(replica, live.request_id)

    def _abort(self, request_id: str) -> None:
        live = self._live.get(request_id)
        if live is None or live.aborted:
            return
        live.aborted = True
        if live.replica is None:  # still queued here (or put back after its replica died)
            self._end(live, "abort", None)
            return
        # Its replica ends it and sends the final output; its slot is free for placement now.
        self.router.cancel(request_id)
        asyncio.get_running_loop().create_task(self._abort_on(live.replica, request_id))
        self._dispatch()

    async def _abort_on(self, replica: int, request_id: str) -> None:
        with contextlib.suppress(ReplicaUnavailable):
            await self.clients[replica].call("abort", request_id)

    def _end(self, live: _Live, reason: str, error: str | None) -> None:
        """Finish ``live`` here (not by its replica): a final output with ``reason``."""
        self.router.cancel(live.request_id)
        self._live.pop(live.request_id, None)
        out = RequestOutput(live.request_id, "", [], True, reason, len(live.prompt_token_ids), live.tokens_sent,
                            error=error)
        live.mailbox.put(out)
        self._dispatch()

    def _deliver(self, replica: int, out: RequestOutput) -> None:
        live = self._live.get(out.request_id)
        if live is None or live.replica != replica:
            # Ended here already, or re-run elsewhere after this replica was drained. A replica
            # that hung and came back still runs what the front ended: stop it there.
            if not out.finished:
                asyncio.get_running_loop().create_task(self._abort_on(replica, out.request_id))
            return
        now = time.monotonic()
        n = len(out.token_ids)
        if n:
            self.router.charge(live.tenant, n)
            observer = self.engine.observer
            if observer is not None:
                if live.tokens_sent == 0:
                    observer.on_first_token(now - live.arrival_s)
                else:
                    observer.on_token_gap((now - live.last_token_s) / n, n)
            live.tokens_sent += n
            live.last_token_s = now
        if out.finished:
            self.router.cancel(out.request_id)
            del self._live[out.request_id]
        live.mailbox.put(out)

    async def _replica_loop(self, i: int) -> None:
        client = self.clients[i]
        sync_s = self.cluster.counter_sync_ms / 1000.0
        next_sync = next_status = 0.0
        sent_elsewhere: set[str] | None = None
        # The replica reports the tenants charged after the version of its last report that
        # arrived (a lost reply is asked for again from the same version).
        charged_since: tuple[str, int] | None = None
        while not self._stopping:
            now = time.monotonic()
            sync, want_status = now >= next_sync, now >= next_status
            remote = self.shared.remote_for(i) if sync else None
            resets = self.shared.pending_resets(i) if sync else []
            batch_at_send = self.shared.last_batch
            elsewhere = self.router.tenants_elsewhere(i) if sync else None
            if elsewhere is not None and elsewhere == sent_elsewhere:
                elsewhere = None  # unchanged since the last sync
            sent_elsewhere = elsewhere if elsewhere is not None else sent_elsewhere
            # The first poll waits for the replica to load its model.
            timeout = self.cluster.health_timeout_s if self._incarnations[i] else self._ready_timeout_s
            try:
                reply: PollReply = await asyncio.wait_for(
                    client.call("poll", remote, active_elsewhere=elsewhere, wait_s=POLL_WAIT_S, want_charged=sync,
                                want_status=want_status, charged_since=charged_since, resets=resets),
                    timeout)
            except Exception as exc:  # noqa: BLE001 - whatever failed, the replica's streams must not hang
                if not isinstance(exc, ReplicaUnavailable | TimeoutError):
                    log.exception("replica %s: its poll failed unexpectedly", client.name)
                await self._replica_down(i, f"{type(exc).__name__}: {exc}")
                next_sync = next_status = 0.0
                sent_elsewhere = None
                self.shared.resend(i)  # the remote service that poll carried may never have arrived
                continue
            if reply.incarnation != self._incarnations[i]:
                if self._incarnations[i] is not None:  # restarted between two polls
                    self._retire_status(i)
                    self._drain_replica(i, "restarted")
                self._incarnations[i] = reply.incarnation
            if self.health[i] != "healthy":
                self.health[i] = "healthy"
                self.router.set_healthy(i, True)
                log.info("replica %s is serving", client.name)
                self._dispatch()
            for out in reply.outputs:
                self._deliver(i, out)
            if resets:
                self.shared.confirm_resets(i, resets[-1][0])
            if reply.charged is not None:
                self.shared.report(i, reply.incarnation, reply.charged, complete=reply.charged_complete,
                                   dropped=reply.charged_dropped, batch_at_send=batch_at_send)
                charged_since = (reply.incarnation, reply.charged_version)
                next_sync = now + sync_s
            if reply.status is not None:
                self.statuses[i] = reply.status
                next_status = now + STATUS_EVERY_S
            self._observe_samples(reply)
            if any(out.finished for out in reply.outputs):
                self._dispatch()

    def _observe_samples(self, reply: PollReply) -> None:
        sink = self.metrics
        if sink is None:
            return
        sink.observe_delivery(max(0.0, time.time() - reply.sent_s))
        for seconds in reply.tick_s:
            sink.on_tick(seconds)
        for seconds in reply.spec_wait_s:
            sink.observe_spec_wait(seconds)

    async def _replica_down(self, i: int, reason: str) -> None:
        """Take replica ``i`` out, end or re-queue its requests, and wait until it answers."""
        if self._stopping:
            return
        name = self.clients[i].name
        log.warning("replica %s is unavailable (%s): draining it", name, reason)
        self.health[i] = "down"
        self.router.set_healthy(i, False)
        self._retire_status(i)
        self._drain_replica(i, "became unavailable")
        self.outages[i] += 1
        while not self._stopping:
            await asyncio.sleep(PING_EVERY_S)
            with contextlib.suppress(ReplicaUnavailable, TimeoutError):
                await asyncio.wait_for(self.clients[i].call("ping"), self.cluster.health_timeout_s)
                return  # the next poll marks it healthy (and sees its new incarnation)

    def _retire_status(self, i: int) -> None:
        """Replica ``i``'s incarnation is gone: keep its last totals, forget its live sizes."""
        status, self.statuses[i] = self.statuses[i], None
        if status is not None:
            self._retired = totals_only(sum_snapshots([self._retired, totals_only(status["counters"])]))

    def _drain_replica(self, i: int, what: str) -> None:
        for live in [live for live in self._live.values() if live.replica == i]:
            if live.aborted:
                self._end(live, "abort", None)
            elif live.tokens_sent == 0 and live.pending is not None:
                self.router.requeue(live.pending)  # nothing sent yet: run it elsewhere
                live.replica = None
            else:
                self._end(live, "error", f"replica {self.clients[i].name} {what} while generating this request: "
                                         "retry it")
        self._dispatch()
