"""Reading every target replica's routing stats at once (what GetLoads answers).

A DeploymentHandle reaches one replica of Serve's choosing, so this goes to the replica actors
themselves and calls `record_routing_stats`, the same actor method Serve's controller polls. The actor
naming is Serve's (SERVE_REPLICA::app#deployment#id in namespace "serve"); it is read in this one place.
"""

from __future__ import annotations

import asyncio

import ray

SERVE_NAMESPACE = "serve"
REPLICA_PREFIX = "SERVE_REPLICA::"


def replica_actor_names(app_name: str, deployment: str) -> list[str]:
    prefix = f"{REPLICA_PREFIX}{app_name}#{deployment}#" if app_name else f"{REPLICA_PREFIX}{deployment}#"
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == SERVE_NAMESPACE and a["name"].startswith(prefix)
    )


async def routing_stats(app_name: str, deployment: str, timeout_s: float = 5.0) -> list[dict]:
    """One dict per live replica; a replica that does not answer in time is reported unhealthy."""
    names = await asyncio.to_thread(replica_actor_names, app_name, deployment)

    async def one(name: str) -> dict:
        replica_id = name.rsplit("#", 1)[-1]
        try:
            actor = ray.get_actor(name, namespace=SERVE_NAMESPACE)
            stats = await asyncio.wait_for(actor.record_routing_stats.remote(), timeout_s)
        except Exception:
            return {"replica_id": replica_id, "healthy": False}
        return {**stats, "replica_id": replica_id}

    return list(await asyncio.gather(*(one(n) for n in names)))
