"""What a run achieved: SLA attainment, goodput, throughput, latency percentiles, per class.

A request attains its SLA when it finished with TTFT and TPOT within its class's targets; shed (429 by
the router), refused (429 by the engine), failed (its replica died) and unfinished requests miss it.
Only requests that arrived after the warm-up count. The attainment of each half of that window shows
whether the run reached a steady state: an arm over its capacity queues ever more, so its second half
scores below its first and its overall figure falls as the trace grows (it has no steady state to report).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from router.policy import Sla
from sim.workload import Request


def attained(req: Request, sla: Sla) -> bool:
    if req.outcome != "done":
        return False
    return req.ttft <= sla.ttft_s and req.tpot <= sla.tpot_s


def attained_share(reqs: list[Request], classes: Mapping[str, Sla]) -> float | None:
    """The share of these requests that attained their class's SLA (None for none)."""
    return round(sum(attained(r, classes[r.sla_class]) for r in reqs) / len(reqs), 6) if reqs else None


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 6) if values else None


def summarize(
    requests: Iterable[Request], classes: Mapping[str, Sla], warmup_s: float, duration_s: float
) -> dict:
    reqs = [r for r in requests if warmup_s <= r.arrival < duration_s]
    window = duration_s - warmup_s
    done = [r for r in reqs if r.outcome == "done"]
    met = sum(attained(r, classes[r.sla_class]) for r in reqs)
    out = {
        "requests": len(reqs),
        "finished": len(done),
        "shed": sum(r.outcome == "shed" for r in reqs),
        "refused": sum(r.outcome == "refused" for r in reqs),
        "failed": sum(r.outcome == "failed" for r in reqs),
        "unfinished": sum(r.outcome == "pending" for r in reqs),
        "attainment": attained_share(reqs, classes),
        "attainment_halves": halves(reqs, classes, warmup_s, duration_s),
        "goodput_rps": round(met / window, 6),
        "throughput_rps": round(len(done) / window, 6),
        "output_tok_s": round(sum(r.generated for r in done) / window, 3),
        "ttft_p50_s": _pct([r.ttft for r in done], 50),
        "ttft_p99_s": _pct([r.ttft for r in done], 99),
        "tpot_p50_s": _pct([r.tpot for r in done if r.generated > 1], 50),
        "tpot_p99_s": _pct([r.tpot for r in done if r.generated > 1], 99),
        "by_class": {},
    }
    for name in sorted({r.sla_class for r in reqs}):
        mine = [r for r in reqs if r.sla_class == name]
        out["by_class"][name] = {"requests": len(mine), "attainment": attained_share(mine, classes)}
    return out


def halves(reqs: list[Request], classes: Mapping[str, Sla], warmup_s: float, duration_s: float) -> list:
    """Attainment of the requests that arrived in the first and in the second half of the scored window."""
    middle = (warmup_s + duration_s) / 2
    first, second = [r for r in reqs if r.arrival < middle], [r for r in reqs if r.arrival >= middle]
    return [attained_share(first, classes), attained_share(second, classes)]


PARTS = ("path_s", "queue_s", "prefill_s")  # Request.ttft_parts, named


def ttft_split(requests: Iterable[Request], warmup_s: float, duration_s: float) -> dict:
    """TTFT in its parts (Request.ttft_parts) over the finished requests that arrived in the scored
    window and have them: mean, p50 and p99 of each part (percentiles of parts do not add up to TTFT's;
    means do), and of the path's way in (`inbound_s`: arrival to admitted, a simulated request's; a real
    one's record puts its whole path there, bench/ttft_split.place, so the validation replaces it with
    its replica's `received` stamp)."""
    timed = [
        r
        for r in requests
        if warmup_s <= r.arrival < duration_s and r.outcome == "done" and r.ttft_parts is not None
    ]
    parts = [r.ttft_parts for r in timed]
    out: dict = {"requests": len(parts)}
    for i, name in enumerate(PARTS):
        out[name] = spread([p[i] for p in parts])
    out["inbound_s"] = spread([r.admitted - r.arrival for r in timed])
    return out


def spread(values: list[float]) -> dict:
    """Mean, p50 and p99 (None for no values)."""
    return {
        "mean": round(float(np.mean(values)), 6) if values else None,
        "p50": _pct(values, 50),
        "p99": _pct(values, 99),
    }
