"""The hardware-aware prefix scheduler (Algorithm 1 of the paper), as pure functions; docs/ALGORITHM.md
§7 and §8 explain it.

Inputs are plain floats: per request the prefix survival a_{r,1..n} = prod_{i<=j} c_{r,i} of the
drafted tokens it may verify (already cut to its budget), and SPS(B), the target's step rate for a
forward of B tokens. Output: how many drafted tokens of each request the target verifies.

Why the early stop keeps verification lossless. Rejection sampling at slot j emits exactly p_T only
if the event "slot j is verified" is independent of x_j given x_{<j}. A confidence c_j is computed
before x_j is sampled (it reads x_{j-1}), so a_{r,j} is a function of x_{r,<j}. The walk visits
pairs in descending survival with ties broken by request then position; a_{r,j} never rises with j,
so the pairs ahead of (r, j) are (r, 1..j-1) and pairs of other requests whose order against
(r, j) is settled by a_{r,j} itself. With the stop, (r, j) is verified iff every pair ahead was kept
and (r, j) raises the throughput estimate: a function of x_{r,<j} and of independent requests. A
search that looks past a drop (keeps the best of all prefixes) verifies slot j because of
a_{r,j+1}, a function of x_{r,j}: the bias of the paper's Appendix A (0.7/0.3 turns into 0.85/0.15).
The pipelined variant keeps the same property by taking its capacity K from confidences of two
rounds earlier and using the live ones only to rank: the rank of (r, j) depends on x_{r,<j} alone.

Where the stop is exact. Along the walk tau(K) is concave (survivals are taken in descending order), so
theta(K) = tau(K) / T(B + K) is unimodal whenever the step time T = 1/SPS is convex in B (flat up to a
compute knee, then rising ever faster): the first drop is then the global maximum. A table whose step
time has a concave kink (a steep rise, then a flatter stretch: profiling noise, or figures from runs of
different shapes) puts a local maximum before the flat stretch, and the stop ends the walk there. The
walk is therefore given the convex envelope of the table's step times (`convex_rates`): the stop stays
a stop, so losslessness is untouched, and it ends at the envelope's global optimum.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence

Sps = Callable[[int], float]  # steps per second of a forward with B tokens in total


class RoundRate:
    """Rounds per second when each round pays `seconds` besides its forward of B tokens (the drafter's
    own time): 1 / (1/SPS(B) + seconds).

    Algorithm 1 weighs the forward alone, tau / T(B). Where every round drafts before it verifies, the
    long-run rate of rounds is tau / (T(B) + d): an extra verified token pays when it gains more than
    that rate, and while d is a large share of a round (a CPU) the forward-only walk stops short. The
    drafting is already done when the walk runs, but the next round will pay it again. Adding a constant
    to a convex step time keeps it convex, so the early stop stays exact, and verification lossless.
    """

    def __init__(self, sps: Sps, seconds: float) -> None:
        self.sps, self.seconds = sps, seconds
        self._convex = getattr(sps, "convex", sps)

    def __call__(self, tokens: int) -> float:
        return 1.0 / (1.0 / self.sps(tokens) + self.seconds)

    def convex(self, tokens: int) -> float:
        """The envelope the walk reads: the wrapped table's convex step time plus the drafting."""
        return 1.0 / (1.0 / self._convex(tokens) + self.seconds)


def survival(confidences: Iterable[float]) -> list[float]:
    """Prefix survival a_j = prod_{i<=j} c_i; confidences are clamped to [0, 1] and NaN counts as 0."""
    out, a = [], 1.0
    for c in confidences:
        a *= min(1.0, c) if c > 0 else 0.0  # `c > 0` is False for NaN
        out.append(a)
    return out


def convex_rates(points: Sequence[int], rates: Sequence[float]) -> list[float]:
    """SPS at `points` whose step time 1/SPS is the lower convex envelope of the given ones.

    Points on the envelope keep their rate; a point above it (a step that costs more than the chord of
    its neighbours on the envelope) gets the chord's time. Taken linear in time between points.
    """
    times = [1.0 / r for r in rates]
    hull: list[int] = []  # indices of the envelope's vertices, left to right
    for i, b in enumerate(points):
        while len(hull) >= 2:
            i0, i1 = hull[-2], hull[-1]
            # Drop the middle vertex when it lies on or above the chord from i0 to i.
            if (times[i1] - times[i0]) * (b - points[i0]) >= (times[i] - times[i0]) * (
                points[i1] - points[i0]
            ):
                hull.pop()
            else:
                break
        hull.append(i)
    out = list(rates)
    for i0, i1 in zip(hull, hull[1:]):
        for k in range(i0 + 1, i1):
            share = (points[k] - points[i0]) / (points[i1] - points[i0])
            out[k] = 1.0 / (times[i0] + share * (times[i1] - times[i0]))
    return out


def ranked(survivals: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """Every (request, position) pair, positions 1-based, in descending survival.

    Ties go to the lower request index, then the earlier position; token values never enter, so
    equal confidences cannot leak which token was drawn into the order.
    """
    pairs = [(-a, r, j) for r, surv in enumerate(survivals) for j, a in enumerate(surv, start=1)]
    pairs.sort()
    return [(r, j) for _, r, j in pairs]


def schedule(
    survivals: Sequence[Sequence[float]], sps: Sps, step_cap: int, fixed_tokens: int = 0
) -> list[int]:
    """Algorithm 1 with the early stop: verify lengths l_r, at most `step_cap` drafted tokens in all.

    `fixed_tokens` are drafted tokens already committed to this forward (requests verified without
    confidences); they count in B but add nothing to the expected tokens tau.
    """
    num_requests = len(survivals)
    lengths = [0] * num_requests
    tokens = num_requests + fixed_tokens
    tau = float(num_requests)
    best = tau * sps(tokens)
    # The ranking of `ranked`, as positions in the flattened rows: a stable sort by descending survival
    # keeps equal ones in (request, position) order, its tie-break. Only the pairs the walk reaches are
    # turned back into (request, position): the engine runs this every step, the stop comes early.
    flat = list(itertools.chain.from_iterable(survivals))
    starts = list(itertools.accumulate((len(surv) for surv in survivals), initial=0))
    for kept, k in enumerate(sorted(range(len(flat)), key=flat.__getitem__, reverse=True)):
        if kept == step_cap:
            break
        tau += flat[k]
        tokens += 1
        theta = tau * sps(tokens)
        if theta <= best:
            break  # the stop: never look past a drop (see the module docstring)
        r = bisect.bisect_right(starts, k) - 1
        lengths[r], best = k - starts[r] + 1, theta
    return lengths


def write_out(items: Sequence, counts: Sequence[int]) -> list:
    """Groups written out: `items[g]` repeated `counts[g]` times, group after group."""
    return [item for item, count in zip(items, counts) for _ in range(count)]


def split_groups(flat: Sequence, counts: Sequence[int]) -> list[list]:
    """`flat`, one entry per member of groups written out (write_out), back into its groups' lists."""
    members = iter(flat)
    return [list(itertools.islice(members, count)) for count in counts]


def schedule_groups(
    rows: Sequence[Sequence[float]], counts: Sequence[int], sps: Sps, step_cap: int, fixed_tokens: int = 0
) -> list[list[int]]:
    """`schedule` on requests that come in groups of identical survival rows: `counts[g]` requests with
    `rows[g]`, group after group. Each group's members' lengths, in order: exactly what `schedule` gives
    the rows repeated `counts[g]` times (tests/dspark/test_scheduler.py holds it to that).

    The cluster simulator's requests of one domain and window share their rows, and its replicas batch
    dozens of them: the walk then takes a group's members at one position as a run (they are adjacent in
    the ranking, equal survivals ranked by request), with no ranking of every pair and no lookup of
    whose pair each one is. Still one SPS reading and one comparison per pair, as `schedule` makes them,
    so the stop falls where it does there, to the last bit. Rows whose survival repeats a value (a
    certain or an impossible token) interleave their members' positions in the ranking: those take the
    plain walk.
    """
    if any(b >= a for row in rows for a, b in zip(row, row[1:])):
        return split_groups(schedule(write_out(rows, counts), sps, step_cap, fixed_tokens), counts)
    lengths = [[0] * count for count in counts]
    tokens = sum(counts) + fixed_tokens
    tau = float(sum(counts))
    best = tau * sps(tokens)
    # Each group's pairs at one position rank together: by survival, descending; equal survivals of
    # different groups by group (their requests come in that order), as schedule's stable sort ranks them.
    runs = sorted((-a, g, j) for g, row in enumerate(rows) if counts[g] for j, a in enumerate(row, start=1))
    left = step_cap  # pairs the step cap still admits (a negative cap admits all, as in schedule)
    for negative, g, j in runs:
        a, members = -negative, lengths[g]
        for m in range(len(members)):
            if left == 0:
                return lengths
            left -= 1
            tau += a
            tokens += 1
            theta = tau * sps(tokens)
            if theta <= best:
                return lengths
            members[m], best = j, theta
    return lengths


def best_capacity(
    survivals: Sequence[Sequence[float]], num_requests: int, sps: Sps, step_cap: int, fixed_tokens: int = 0
) -> int:
    """How many drafted tokens maximise tau * SPS(B) over every prefix of the ranking, with no stop.

    Only safe on confidences whose tokens are already resolved (the pipelined variant feeds it the
    round two rounds back): on live confidences this is the biased search of Appendix A.
    """
    values = sorted((a for surv in survivals for a in surv), reverse=True)[: max(0, step_cap)]
    tokens = num_requests + fixed_tokens
    tau = float(num_requests)
    best, capacity = tau * sps(tokens), 0
    for k, a in enumerate(values, start=1):
        tau += a
        theta = tau * sps(tokens + k)
        if theta > best:
            best, capacity = theta, k
    return capacity


def pick_top(survivals: Sequence[Sequence[float]], capacity: int) -> list[int]:
    """Verify the `capacity` highest-survival pairs (a prefix of the ranking, so prefixes per request)."""
    lengths = [0] * len(survivals)
    for r, j in ranked(survivals)[: max(0, capacity)]:
        lengths[r] = j
    return lengths
