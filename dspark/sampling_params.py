"""SamplingParams: the per-request decoding options, named and validated like vLLM's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. Temperature 0 is greedy (argmax); top_k <= 0 and top_p == 1 disable."""

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
        if self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {self.temperature}")
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(name, f"must be a number, got {type(value).__name__}")
    if value != value:  # NaN
        raise InvalidRequestError(name, "must not be NaN")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(name, f"must be an integer, got {type(value).__name__}")
