"""SamplingParams: the per-request decoding options, named and validated like vLLM's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark.errors import InvalidRequestError

# Below this temperature a request is decoded greedily, as vLLM does (its _SAMPLING_EPS): dividing
# logits by anything smaller only approximates argmax, at the price of float overflow.
GREEDY_TEMPERATURE = 1e-5
# The engine's ceiling, far above any useful value (OpenAI allows 2): beyond it a request is a mistake.
MAX_TEMPERATURE = 100.0
# Seeds seed a torch.Generator, which takes a signed 64-bit integer.
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. Temperature 0 (below 1e-5) is greedy (argmax); top_k <= 0 and
    top_p == 1 disable. Every accepted value is numerically safe to sample with."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    include_stop_str_in_output: bool = False
    sla_class: str | None = field(default=None)

    def __post_init__(self) -> None:
        # Normalise list inputs so instances stay hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, Sequence):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, Sequence):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._validate()

    def _validate(self) -> None:
        _check_number("temperature", self.temperature)
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidRequestError(
                "temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}"
            )
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k)
        _check_int("max_tokens", self.max_tokens)
        if self.max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError("stop", f"every stop string must be a non-empty str, got {s!r}")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t)
            if t < 0:
                raise InvalidRequestError("stop_token_ids", f"token ids are >= 0, got {t}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError("ignore_eos", f"must be a bool, got {type(self.ignore_eos).__name__}")
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
                raise InvalidRequestError("seed", f"must fit in a signed 64-bit integer, got {self.seed}")
        if self.sla_class is not None and not isinstance(self.sla_class, str):
            raise InvalidRequestError("sla_class", f"must be a str, got {type(self.sla_class).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(name, f"must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequestError(name, f"must be a finite number, got {value}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(name, f"must be an integer, got {type(value).__name__}")
