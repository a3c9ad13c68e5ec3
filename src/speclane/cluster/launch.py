"""``speclane serve --replicas N``: start (or join) Ray and the replicas, return the front."""

from __future__ import annotations

import dataclasses
import os

from speclane.cluster import ray_actors
from speclane.cluster.front import ClusterEngine
from speclane.config import ClusterConfig, EngineConfig


def replica_threads(engine_config: EngineConfig, num_replicas: int) -> int:
    """Torch threads per replica: ``--num-threads`` if given, else this machine's cores
    shared out (at least one each)."""
    return engine_config.model.num_threads or max(1, (os.cpu_count() or 1) // num_replicas)


def start_cluster(engine_config: EngineConfig, cluster: ClusterConfig) -> ClusterEngine:
    ray_actors.start(cluster.ray_address, cluster.replicas)
    model = dataclasses.replace(engine_config.model, num_threads=replica_threads(engine_config, cluster.replicas))
    config = dataclasses.replace(engine_config, model=model)
    clients = [ray_actors.RayReplica(str(i), config) for i in range(cluster.replicas)]

    def stop() -> None:
        for client in clients:
            client.kill()
        if not cluster.ray_address:
            ray_actors.stop()

    front = ClusterEngine(clients, config, cluster, on_shutdown=stop)
    front.wait_ready()
    return front
