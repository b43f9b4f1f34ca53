"""serving_gc_threshold through real Ray Serve: in the shared app (the defaults), the ingress replica
collects young objects every 10,000 allocations and the target replicas, whose processes the option does
not concern, every 700, Python's own; both run on the heap Serve froze after their start-up (the
bench/route_decision.py cases assume that freeze). Read inside each replica's process."""

from __future__ import annotations

import gc

import ray
from serving import APP

from deployments.gc_policy import PYTHON_YOUNG_THRESHOLD
from deployments.replicas import SERVE_NAMESPACE, replica_actor_names


def collector(actor_name: str) -> tuple[tuple[int, int, int], int]:
    """The replica process's collector thresholds and frozen object count, read in that process (Ray's
    __ray_call__ runs a function on the actor)."""
    actor = ray.get_actor(actor_name, namespace=SERVE_NAMESPACE)
    read = actor.__ray_call__.remote(lambda _: (gc.get_threshold(), gc.get_freeze_count()))
    return ray.get(read, timeout=60)


def test_the_ingress_collects_young_objects_less_often_than_the_target_replicas(serve_stack):
    ingresses = replica_actor_names(APP, "Ingress")
    targets = replica_actor_names(APP, "TargetReplica")
    assert ingresses and targets
    for name in ingresses:
        (young, middle, oldest), frozen = collector(name)
        assert (young, middle, oldest) == (10_000, 10, 10)
        assert frozen > 10_000  # the app, Serve, Ray and their libraries, as start-up left them
    for name in targets:
        (young, _, _), frozen = collector(name)
        assert young == PYTHON_YOUNG_THRESHOLD and frozen > 10_000
