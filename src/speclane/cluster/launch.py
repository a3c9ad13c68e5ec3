"""``speclane serve --replicas N``: start (or join) Ray and the replicas, return the front."""

from __future__ import annotations

import dataclasses
import os

from speclane.cluster import ray_actors
from speclane.cluster.client import ReplicaUnavailable
from speclane.cluster.front import ClusterEngine
from speclane.config import ClusterConfig, EngineConfig
from speclane.models.loader import resolve_model


def replica_threads(engine_config: EngineConfig, num_replicas: int) -> int:
    """Torch threads per replica: ``--num-threads`` if given, else this machine's cores
    shared out (at least one each)."""
    return engine_config.model.num_threads or max(1, (os.cpu_count() or 1) // num_replicas)


def start_cluster(engine_config: EngineConfig, cluster: ClusterConfig) -> ClusterEngine:
    if not cluster.ray_address:  # a local cluster shares this machine's files: a missing model fails here
        resolve_model(engine_config.model.model)
    ray_actors.start(cluster.ray_address, cluster.replicas)
    model = dataclasses.replace(engine_config.model, num_threads=replica_threads(engine_config, cluster.replicas))
    config = dataclasses.replace(engine_config, model=model)
    clients = [ray_actors.RayReplica(str(i), config) for i in range(cluster.replicas)]

    def stop() -> None:
        for client in clients:
            client.kill()
        if not cluster.ray_address:
            ray_actors.stop()

    front: ClusterEngine | None = None
    try:
        front = ClusterEngine(clients, config, cluster, on_shutdown=stop)
        front.wait_ready()
    except BaseException as exc:
        # Nothing left running (actors, a local Ray); the cause in one line, as serve's
        # other start-up errors are (a bad --model fails in every replica's start).
        if front is not None:
            front.shutdown()
        else:
            stop()
        if isinstance(exc, ReplicaUnavailable | TimeoutError):
            raise ValueError(f"the replicas did not start: {exc}") from exc
        raise
    return front
