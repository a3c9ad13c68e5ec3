"""One engine replica: an ``LLMEngine`` ticking in its own thread, read by polling.

``ReplicaHost`` knows nothing of Ray: ``ray_actors.py`` runs it as an actor (several
calls at once: ``add``/``abort`` while a ``poll`` waits), and tests can run it in-process.

Streaming design: the front does not open one stream per request. Each replica's outputs
pile up in one outbox; the front's loop for that replica calls ``poll`` (a long poll: it
returns as soon as there are outputs, or after ``wait_s``) and routes each output to its
request's stream. One call per replica per tick carries every request's new tokens, and
the same call carries the shared lane-service counters both ways (``fairness.py``) and,
when asked, the replica's status (counters and the dashboard's lane recorder).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from speclane.config import EngineConfig
from speclane.engine.async_engine import start_ticking, tick_until_stopped
from speclane.engine.engine import LLMEngine, RequestOutput
from speclane.engine.lane_recorder import LaneRecorder
from speclane.engine.stats import Observers
from speclane.request import Request, SamplingParams
from speclane.scheduler.fairness import ResetBatch

log = logging.getLogger("speclane.cluster")


@dataclass
class PollReply:
    incarnation: str
    outputs: list[RequestOutput]
    charged: dict[str, float] | None = None  # lane service per tenant, when asked
    charged_complete: bool = True  # charged holds every tenant's, not only those charged after the version asked
    charged_version: int = 0  # the lane's version of charged (ask from it next time)
    charged_dropped: dict[str, float] = field(default_factory=dict)  # charges the lane forgot after the version asked
    status: dict[str, Any] | None = None  # when asked
    tick_s: list[float] = field(default_factory=list)  # tick times since the last poll
    spec_wait_s: list[float] = field(default_factory=list)  # finished lane requests' waits
    sent_s: float = 0.0  # time.time() when the replica sent it (one machine's clock, or synced clocks)


class _Samples:
    """The engine's tick and lane-wait samples, until the next poll takes them (the front
    feeds them into its histograms)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tick_s: list[float] = []
        self.spec_wait_s: list[float] = []

    def on_tick(self, seconds: float) -> None:
        with self.lock:
            self.tick_s.append(seconds)

    def on_idle(self) -> None:
        pass

    def on_first_token(self, seconds: float) -> None:
        pass

    def on_token_gap(self, seconds: float, num_tokens: int) -> None:
        pass

    def on_finish(self, request: Request) -> None:
        if request.spec.grants or request.spec.wait_ms:
            with self.lock:
                self.spec_wait_s.append(request.spec.wait_ms / 1000.0)

    def take(self) -> tuple[list[float], list[float]]:
        with self.lock:
            out = self.tick_s, self.spec_wait_s
            self.tick_s, self.spec_wait_s = [], []
            return out


class ReplicaHost:
    """``exit_on_engine_failure`` (a Ray actor's): an exception from the engine's tick ends
    the process, so Ray restarts the replica and the front, finding it dead, runs its
    requests that sent nothing elsewhere; kept alive, it would answer polls as healthy
    and be handed new requests it can only refuse. Without it (in-process replicas), every
    live request fails with the engine's error."""

    def __init__(self, config: EngineConfig, *, exit_on_engine_failure: bool = False) -> None:
        self.exit_on_engine_failure = exit_on_engine_failure
        self.incarnation = uuid.uuid4().hex
        self.engine = LLMEngine(config)
        self.engine.exchange_lane_service(None)  # its lane counts what it charges, to share it
        self.recorder = LaneRecorder(self.engine)
        self._samples = _Samples()
        self.engine.observer = Observers(self.recorder, self._samples)
        self._outbox: list[RequestOutput] = []
        self._live: set[str] = set()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="speclane-replica", daemon=True)
        start_ticking(self._thread)

    # -- the front's calls ----------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the front needs to tokenize and validate for this model."""
        engine = self.engine
        return {"tokenizer": engine.tokenizer, "max_model_len": engine.max_model_len,
                "vocab_size": engine.model.config.vocab_size, "kv_pool": engine.kv_pool,
                "incarnation": self.incarnation, "pid": os.getpid()}

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> str:
        return self.incarnation

    def add(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams,
            options: dict[str, Any]) -> None:
        """Queue a request (raises ``ValueError``, ``QueueFullError`` as the engine does)."""
        with self._cond:  # under the lock _failed sets the error in: a request is refused or failed
            if self.error is not None:
                raise RuntimeError(f"the replica's engine stopped: {self.error}")
            self._live.add(request_id)
        try:
            self.engine.add_request(request_id, prompt_token_ids, sampling, **options)
        except BaseException:
            with self._cond:
                self._live.discard(request_id)
            raise
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self._wake.set()

    def poll(self, remote_service: dict[str, float] | None = None, *, active_elsewhere: set[str] | None = None,
             wait_s: float = 0.2, want_charged: bool = False, want_status: bool = False,
             charged_since: tuple[str, int] | None = None, resets: Sequence[ResetBatch] = ()) -> PollReply:
        """New outputs (waiting up to ``wait_s`` for some); applies the other replicas' lane
        service (who runs there, whose remote service restarts from zero) and returns this
        one's when asked: every tenant's, or those charged or dropped after ``charged_since``
        (an incarnation and a version of its lane, from an earlier reply; a version of an
        earlier incarnation counts as none)."""
        report = None
        since = charged_since[1] if charged_since is not None and charged_since[0] == self.incarnation else 0
        if remote_service or active_elsewhere is not None or want_charged or resets:
            report = self.engine.exchange_lane_service(remote_service, active_elsewhere, since, resets)
        with self._cond:
            if not self._outbox:
                self._cond.wait(wait_s)
            outputs, self._outbox = self._outbox, []
        ticks, waits = self._samples.take()
        return PollReply(self.incarnation, outputs, charged=report.charged if report else None, charged_complete=since == 0,
                         charged_version=report.version if report else 0,
                         charged_dropped=report.dropped if report else {},
                         status=self.status() if want_status else None, tick_s=ticks, spec_wait_s=waits,
                         sent_s=time.time())

    def status(self) -> dict[str, Any]:
        """Counters (as ``/metrics`` reads them) and the lane recorder's state."""
        snapshot = self.engine.counters.snapshot()
        return {"counters": snapshot, "lane": self.recorder.state(), "error": self.error}

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    # -- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        tick_until_stopped(self.engine, self._wake, self._stop, self._post, self._failed)

    def _post(self, outputs: list[RequestOutput]) -> None:
        if outputs:
            with self._cond:
                for out in outputs:
                    if out.finished:
                        self._live.discard(out.request_id)
                self._outbox.extend(outputs)
                self._cond.notify_all()

    def _failed(self, exc: BaseException) -> None:
        if self.exit_on_engine_failure:
            log.critical("the replica's engine failed; exiting for a restart", exc_info=exc)
            for handler in logging.getLogger().handlers + log.handlers:
                handler.flush()
            os._exit(70)  # EX_SOFTWARE
        self._fail_all(f"{type(exc).__name__}: {exc}")  # the front hears every live request fail

    def _fail_all(self, error: str) -> None:
        with self._cond:
            self.error = error
            failed = [RequestOutput(rid, "", [], True, "error", 0, 0, error=f"engine error: {self.error}")
                      for rid in self._live]
            self._live.clear()
            self._outbox.extend(failed)
            self._cond.notify_all()
