"""The one module that imports Ray: start or join a cluster, run ``ReplicaHost`` actors.

Each replica is a Ray actor (``max_restarts=-1``: Ray restarts a dead one, which loads the
model again, and a replica whose engine fails ends its process to be restarted;
``max_task_retries=0``: a call to a dead replica fails at once and the front decides what
becomes of its requests). ``max_concurrency`` lets ``add`` and ``abort`` run
while a ``poll`` waits. ``RayReplica`` turns an actor into the async client ``front.py``
expects and Ray's errors into ``ReplicaUnavailable``.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from speclane.cluster.client import ReplicaUnavailable
from speclane.cluster.replica import ReplicaHost
from speclane.config import EngineConfig

_ACTOR_OPTIONS = {"max_restarts": -1, "max_task_retries": 0, "max_concurrency": 8}


def _cause(exc: BaseException) -> str:
    """One line for a Ray error: the exception its text ends with (an actor that died in
    its constructor carries that traceback), else its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return f"{type(exc).__name__}: {named[-1][:300]}" if named else type(exc).__name__


def start(address: str, num_replicas: int) -> None:
    """Join ``address`` or start a local Ray with a CPU per replica at least (no Ray dashboard)."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level="warning", log_to_driver=True)
    else:
        ray.init(num_cpus=max(os.cpu_count() or 1, num_replicas), include_dashboard=False,
                 logging_level="warning", log_to_driver=True)


def stop() -> None:
    if ray.is_initialized():
        ray.shutdown()


class RayReplica:
    """An async client of one replica actor (see ``client.ReplicaClient``)."""

    def __init__(self, name: str, config: EngineConfig) -> None:
        self.name = name
        actor_class = ray.remote(num_cpus=1, **_ACTOR_OPTIONS)(ReplicaHost)
        self._actor = actor_class.options(name=f"speclane-replica-{name}-{os.getpid()}").remote(
            config, exit_on_engine_failure=True)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self._actor, method).remote(*args, **kwargs)
        except (RayActorError, GetTimeoutError) as exc:
            raise ReplicaUnavailable(f"replica {self.name}: {_cause(exc)}") from exc
        except RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException) and not isinstance(cause, RayError):
                raise cause from None  # the engine's own error (ValueError, QueueFullError)
            raise ReplicaUnavailable(f"replica {self.name}: {exc}") from exc

    def kill(self) -> None:
        """Stop the actor for good (shutdown)."""
        ray.kill(self._actor, no_restart=True)
