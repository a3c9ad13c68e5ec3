"""What the front needs of a replica: an async ``call(method, *args)`` on a ``ReplicaHost``.

``ray_actors.RayReplica`` is the real one; ``LocalReplica`` runs a ``ReplicaHost`` in this
process (each call in a worker thread), for tests of the front without Ray.
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio


class ReplicaUnavailable(RuntimeError):
    """The replica did not answer: its process died, or it is restarting."""


class ReplicaClient(Protocol):
    name: str

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def kill(self) -> None: ...


class LocalReplica:
    def __init__(self, name: str, host: Any) -> None:
        self.name = name
        self.host = host

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: getattr(self.host, method)(*args, **kwargs))

    def kill(self) -> None:
        self.host.shutdown()
