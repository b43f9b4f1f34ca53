"""Ingress: the application's entry deployment, serving OpenAI HTTP and the gRPC services at once.

HTTP routes live in deployments/http_api.py, RPC methods in deployments/grpc_api.py (and the controller's
admin RPCs in deployments/controller_grpc.py); both use the
Frontend this class is, which forwards admitted requests to the TargetReplica deployment. It runs as
`num_ingress_replicas` replicas behind Ray Serve's proxies and keeps no request state of its own.
"""

from __future__ import annotations

from ray import serve

from deployments import gc_policy, thread_policy
from deployments.config import AppConfig
from deployments.controller_grpc import ControllerAdminService
from deployments.frontend import Frontend
from deployments.grpc_api import GrpcService
from deployments.http_api import app as http_app
from deployments.serve_context import replica_context


@serve.deployment(name="Ingress")
@serve.ingress(http_app)
class Ingress(Frontend, GrpcService, ControllerAdminService):
    def __init__(self, replica, config: dict, controller=None) -> None:
        super().__init__(replica, AppConfig(**config))
        self.controller = controller  # the Controller's handle, for its admin routes (or None)
        # Only a Serve replica owns its process: called directly (tests, benches), the class leaves its
        # caller's threads and collector as they were, as TargetReplica does.
        if replica_context() is not None:
            # Its threads (Serve's, Ray's, the servers started later inherit it) yield to an engine thread
            # on wake-up and stay off its CPU (engine_cpu) where a replica shares its host (thread_policy.py).
            thread_policy.apply(self.config.serving_thread_policy, engine_cpu=self.config.engine_cpu)
            # Young objects collected less often: fewer collections inside routing decisions (gc_policy.py).
            gc_policy.apply(self.config.serving_gc_threshold)
