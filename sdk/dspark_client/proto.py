"""The generated gRPC modules, built on first import from a source checkout when missing or stale."""

from __future__ import annotations

from dspark_client import _codegen

if _codegen.is_stale():
    try:
        _codegen.generate()
    except ImportError as exc:  # no grpcio-tools: only a stale copy can still be usable
        if not (_codegen.OUT_DIR / _codegen.HASH_FILE).is_file():
            raise ImportError(
                "dspark_client's gRPC code is not generated; install grpcio-tools and run "
                "`python -m dspark_client._codegen`"
            ) from exc

from dspark_client._generated.dspark.v1 import controller_pb2 as admin_pb  # noqa: E402
from dspark_client._generated.dspark.v1 import controller_pb2_grpc as admin_pb_grpc  # noqa: E402
from dspark_client._generated.dspark.v1 import generation_pb2 as pb  # noqa: E402
from dspark_client._generated.dspark.v1 import generation_pb2_grpc as pb_grpc  # noqa: E402

# Import paths for Ray Serve's `grpc_servicer_functions` and for servers.
add_GenerationServicer_to_server = pb_grpc.add_GenerationServicer_to_server
GenerationStub = pb_grpc.GenerationStub
SERVICE_NAME = "dspark.v1.Generation"
# The cluster controller's admin service (proto/dspark/v1/controller.proto), on the same port.
add_ControllerAdminServicer_to_server = admin_pb_grpc.add_ControllerAdminServicer_to_server
ControllerAdminStub = admin_pb_grpc.ControllerAdminStub

__all__ = [
    "pb",
    "pb_grpc",
    "admin_pb",
    "admin_pb_grpc",
    "add_GenerationServicer_to_server",
    "add_ControllerAdminServicer_to_server",
    "GenerationStub",
    "ControllerAdminStub",
    "SERVICE_NAME",
]
