"""dspark_client: the Python SDK of the DSpark serving kit (gRPC; needs only grpcio and protobuf)."""

from dspark_client.aio import AsyncClient, AsyncGenerationStream
from dspark_client.client import Client, GenerationStream
from dspark_client.connection import NO_RETRY, RetryPolicy
from dspark_client.errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    DSparkClientError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from dspark_client.types import Completion, Delta, ModelInfo, ReplicaLoad, SpeculationStats, Usage

__all__ = [
    "Client",
    "AsyncClient",
    "GenerationStream",
    "AsyncGenerationStream",
    "RetryPolicy",
    "NO_RETRY",
    "Completion",
    "Delta",
    "Usage",
    "SpeculationStats",
    "ModelInfo",
    "ReplicaLoad",
    "DSparkClientError",
    "InvalidArgumentError",
    "ResourceExhaustedError",
    "DeadlineExceededError",
    "UnavailableError",
    "CancelledError",
    "AlreadyExistsError",
    "NotFoundError",
    "UnauthenticatedError",
]
