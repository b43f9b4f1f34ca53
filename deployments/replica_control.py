"""What a target replica tells the cluster controller and how it applies what it is told (no Ray).

The replica taps every verify round on the engine thread (`RoundTap`, an engine round observer): per
position, how many rounds reached a slot and how many accepted it, a bounded sample of rounds as
(prefix survivals, accepted, sampling temperature) for the STS refit, and per SLA class the time per
output token its requests saw between their rounds. The controller reads and resets
the tap once per period (`read`), so its window is its own, apart from the router's routing stats.
It writes back three things, all lossless (they change which drafted tokens are verified, never how):
the draft budget, STS temperatures, and a rescaled cost table.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

import torch

from dspark.engine import Engine

MAX_SAMPLED_ROUNDS = 512  # rounds per period sent for the STS refit
FORGET_REQUEST_S = 60.0  # a request with no round for this long has finished (or stalled): forgotten


class RoundTap:
    """Acceptance by position and sampled rounds since the last read (appended on the engine thread)."""

    def __init__(self, gamma: int, clock=time.monotonic) -> None:
        self.gamma = gamma
        self.clock = clock
        self._lock = threading.Lock()
        self._last_round: dict[str, float] = {}  # request -> when its previous round ended
        self._reset()

    def _reset(self) -> None:
        self.reached = [0] * self.gamma  # rounds that verified slot k with slots < k accepted
        self.accepted = [0] * self.gamma  # ... and accepted it
        self.rounds = self.verified = 0
        self.sampled: deque = deque(maxlen=MAX_SAMPLED_ROUNDS)
        self.class_seconds: Counter = Counter()  # SLA class -> seconds between a request's rounds
        self.class_tokens: Counter = Counter()  # ... and the tokens those rounds emitted

    def observe(self, seq, proposal, num_verified: int, verdict) -> None:
        accepted = verdict.num_accepted
        now = self.clock()
        with self._lock:
            # Time per output token by SLA class: each round emits accepted + 1 tokens, and the time
            # since the request's previous round is what its user waited for them.
            previous = self._last_round.get(seq.request_id)
            self._last_round[seq.request_id] = now
            if previous is not None:
                cls = seq.params.sla_class or ""
                self.class_seconds[cls] += now - previous
                self.class_tokens[cls] += accepted + 1
            if num_verified <= 0:
                return
            self.rounds += 1
            self.verified += num_verified
            for k in range(min(num_verified, self.gamma)):
                if k > accepted:
                    break
                self.reached[k] += 1
                self.accepted[k] += k < accepted
            if proposal.confidence is not None:
                survival = torch.cumprod(proposal.confidence[:num_verified].float(), 0).tolist()
                self.sampled.append((survival, accepted, float(seq.params.temperature)))

    def read(self) -> dict:
        """The window's evidence, and a fresh window."""
        with self._lock:
            acceptance = [a / n for a, n in zip(self.accepted, self.reached) if n > 0]
            now = self.clock()
            self._last_round = {r: t for r, t in self._last_round.items() if now - t < FORGET_REQUEST_S}
            out = {
                "tpot_by_class": {c: self.class_seconds[c] / n for c, n in self.class_tokens.items() if n},
                "acceptance_by_position": acceptance,
                "window_rounds": self.rounds,
                "window_verified": self.verified,
                "rounds_sample": list(self.sampled),
            }
            self._reset()
        return out


def running_by_class(engine: Engine) -> dict[str, int]:
    """Requests in the engine per SLA class ("" for none)."""
    return dict(Counter(s.params.sla_class or "" for s in engine.seqs.values()))


def set_sts_temperatures(engine: Engine, temperatures: dict[float, list[float]]) -> dict:
    """Replace the drafter's STS set per serving temperature; returns the sets in force."""
    drafter = engine.drafter
    calibration = getattr(drafter, "calibration", None)
    if calibration is None:
        raise ValueError(f"drafter {getattr(drafter, 'name', '?')!r} has no confidence calibration")
    for t, temps in temperatures.items():
        if len(temps) != drafter.block_size:
            raise ValueError(
                f"STS set for temperature {t} holds {len(temps)} values, need {drafter.block_size}"
            )
        calibration[float(t)] = torch.tensor(temps, dtype=torch.float32, device=drafter.device)
    return {str(t): v.tolist() for t, v in calibration.items()}


def sts_temperatures(engine: Engine) -> dict[str, list[float]]:
    calibration = getattr(engine.drafter, "calibration", None) or {}
    return {str(t): v.tolist() for t, v in calibration.items()}


def rescale_cost_table(engine: Engine, slowdown: float) -> list[list[float]] | None:
    """Divide the cost table's rates by `slowdown` (measured forward time / predicted) everywhere."""
    table = engine.cost_table
    if table is None:
        return None
    if not slowdown > 0:
        raise ValueError(f"slowdown must be positive, got {slowdown!r}")
    table.rates = [r / slowdown for r in table.rates]
    table._fit()
    return [[b, round(r, 3)] for b, r in zip(table.points, table.smoothed)]
