"""How often a model's continuations fall into a short loop: the demo target's quality figure.

A small target trained for minutes degenerates under greedy decoding into cycles such as
`(self__(self__(self` or runs of newlines. A user's first demo then looks broken, and greedy acceptance
figures measured on such text say little (a loop is trivially predictable, or the drafter misses it
every time). This counts the share of continuations whose end is such a cycle, with its uncertainty,
so that a rebuilt target can be compared with the one it replaces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LOOP_TAIL = 32  # tokens at the end of a continuation that must repeat
MAX_PERIOD = 8  # tokens: the longest cycle counted as a short loop (>= 5 repeats within the tail + 1 cycle)
# A sentence-long loop ("The class is a list of the file object.\n\n" over and over): a cycle of up to 24
# tokens filling the last 48 (>= 3 repeats). A better target trades short loops for these, so both count.
LONG_LOOP_TAIL = 48
LONG_MAX_PERIOD = 24


def loop_period(tokens: Sequence[int], tail: int = LOOP_TAIL, max_period: int = MAX_PERIOD) -> int | None:
    """The shortest period p <= max_period such that each of the last `tail` tokens equals the token p
    before it, or None. A continuation too short to hold `tail` tokens after one cycle has none."""
    for period in range(1, max_period + 1):
        if len(tokens) < tail + period:
            return None
        if all(tokens[i] == tokens[i - period] for i in range(len(tokens) - tail, len(tokens))):
            return period
    return None


def wilson_interval(hits: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial share (95% by default); (0, 1) when nothing was counted.
    Unlike the normal approximation it stays inside [0, 1] and is honest at 0 or all hits."""
    if total == 0:
        return 0.0, 1.0
    share = hits / total
    centre = (share + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)
