"""dspark: a lossless speculative decoding engine for DSpark drafters."""

from dspark.async_engine import AsyncEngine
from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.errors import (
    AdmissionError,
    DSparkError,
    EngineDeadError,
    InvalidRequestError,
    ModelLoadError,
    RequestFailedError,
)
from dspark.llm import LLM
from dspark.outputs import RequestOutput
from dspark.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "Engine",
    "EngineConfig",
    "SamplingParams",
    "RequestOutput",
    "DSparkError",
    "InvalidRequestError",
    "AdmissionError",
    "ModelLoadError",
    "EngineDeadError",
    "RequestFailedError",
]
