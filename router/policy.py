"""The SLA router's policy, as pure functions: predict what a request would see on each replica, pick one.

The speed model (a replica's steps, its decode rate and TPOT, their calibration and the prefill in the
decode steps) is router/speed.py's; here, what a newcomer and the requests already there would see on each
replica, and the choice.

What a newcomer would see. Its TTFT is the step in flight (half a step on average) plus the steps that
prefill everything queued ahead of it and its own prompt (less any cached prefix), at the capacity
M - n (1 + l) tokens per step the decoding requests leave. Its TPOT is TPOT at n' = running + queued + 1
(the requests queued ahead decode beside it too) with the inflowing prefill. The requests already there
move to TPOT(n') with the inflow, the queue and the newcomer's prompt in their steps: the newcomer's
effect on them is part of its score.

The choice (llm-d's endpoint picker's shape: filters -> scorers -> pick).
  Filters drop replicas that cannot take the request at all: unhealthy, no KV room for prompt +
  max_tokens (a request reserves its whole life at admission, so such a replica would refuse it), or no
  free sequence slot.
  The score is the SLA slack: the least of the newcomer's TTFT and TPOT slack and, for each class of
  equal or higher priority running there, the slack its TPOT keeps, each relative to its target. A
  replica is feasible when the slack is >= 0. Maximising the least slack sends a request to a fast
  replica until that replica's predicted TPOT meets a slow one's, then alternates (once targets get
  tight: see `ample_slack` below).
  The pick takes the best slack among feasible replicas with fresh signals, then stale ones (they rank
  after: their numbers may hide load), then replicas with no signals yet. Slack counts up to
  `ample_slack` (half the targets to spare): beyond it a replica is comfortably fast, and being
  predicted faster still earns nothing, since predictions carry noise and a replica that looks a little
  faster would otherwise take every request. Slacks within `tie_margin` of the best are a tie: the
  least loaded of them for its size wins (the share of its max_num_seqs in use: replicas of different
  sizes fill in proportion), so equal replicas share load instead of one taking every request;
  between equally loaded ones, the soonest predicted first token, then a seeded draw.
  Prefix affinity falls out of the prediction, not a rule of its own: a replica that caches the
  prompt's leading pages skips their prefill, so its TTFT is lower (its slack higher when TTFT binds,
  the tie-break otherwise), while a loaded replica still loses to an idle one.
  A replica that lacks only a free sequence slot may still be the better place: once its first running
  request finishes it would run the newcomer in a smaller batch than the replicas with room run it now.
  When that gives the newcomer `wait_gain` more slack (the wait counted in its TTFT), the request waits
  for it (Serve backs off and asks again) rather than taking the worse replica now: a class with a
  loose TTFT and a tight TPOT target trades a little of the first for the second.
  When no replica is feasible, a class that may shed is refused, with the time until the replica that
  frees up first could meet it (the running requests finish in order of their tokens left, at the TPOT
  the replica runs now); a class that may not shed goes where its slack is largest. When no replica
  passes the filters at all, the request is refused with that hint too, whatever its class, as the
  engine refuses a request its KV cache cannot hold, unless some replica lacks only a free sequence
  slot: then a class that may not shed waits for one, as Serve queues a request for a full replica, and
  so does one that may, if a slot is predicted to free soon enough for its first token to meet its
  TTFT target. Refusing it at once loses requests that would have met their SLA after a short wait
  (two equal replicas near capacity are both full for moments at a time: the simulated uniform setting
  of bench/route.py refused 2 % of its requests at 0.8 x capacity that way, and lost to pow2).
  The TTFT target runs from the request's arrival: the time it has waited for a replica already
  (`waited_s`: in Serve's queue, or deciding again after a wait) counts in its TTFT slack.
"""

from __future__ import annotations

import math
import random
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

from router.speed import Speed, decode_round, prefill_per_step, step_time, tpot, verify_length


@dataclass(frozen=True)
class Sla:
    """A request's latency targets and what may happen to it when no replica can meet them."""

    name: str
    ttft_s: float
    tpot_s: float
    priority: int = 0  # lower is more important: a request never counts harm to less important ones
    may_shed: bool = False  # refuse (429) rather than run late


@dataclass(frozen=True)
class PromptPages:
    """A prompt's leading full KV pages by name (dspark.prefix_cache.route_hashes), hashed once by the
    ingress: each replica's cache is matched against them without rehashing the prompt."""

    page_size: int
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Newcomer:
    """What the router knows of a request before it runs: its size, its SLA, its prompt's pages."""

    prompt_tokens: int
    max_tokens: int
    sla: Sla
    key: str = ""  # names its decision in the trace (router/decisions.py)
    prefix: PromptPages | None = None  # None: no prefix caching to predict (or not hashed)


@dataclass(frozen=True)
class ReplicaState:
    """One replica as the router sees it: pushed stats merged with the router's own accounting."""

    replica_id: str
    speed: Speed | None  # None: no stats yet
    running: int = 0  # decoding requests
    queued: int = 0  # admitted requests whose prompt is not fully prefilled
    queued_prefill_tokens: int = 0
    free_pages: int = 0  # KV pages neither held nor promised to a running request
    total_pages: int = 0
    page_size: int = 16
    max_num_seqs: int = 1
    running_slas: tuple[Sla, ...] = ()  # one per class running there (targets decide the harm)
    remaining_tokens: tuple[int, ...] = ()  # running requests' tokens left to max_tokens, ascending
    # How old the pushed stats are. The balancer keeps it inf and gives decide() each state's age beside
    # it: the age moves with the clock, so a state carrying it would be rebuilt for every decision.
    age_s: float = math.inf
    healthy: bool = True
    prefill_rate: float = 0.0  # prompt tokens per second arriving lately (router/signals.py); 0: none seen
    # Prefix caching: the short hashes of the prompt pages this replica holds (its pushed summary and
    # what this router sent it since), matched against the newcomer's pages: the prefill it would skip.
    cached_prefix: Container[str] = frozenset()

    @property
    def load(self) -> int:
        return self.running + self.queued

    @property
    def occupancy(self) -> float:
        """The share of its sequence slots in use: how loaded it is for its size. Replicas differ in
        max_num_seqs (a heterogeneous pool), and 2 requests fill one with 2 slots but not one with 8."""
        return self.load / max(1, self.max_num_seqs)


@dataclass(frozen=True)
class PolicyConfig:
    tie_margin: float = 0.05  # slacks this close to the best are a tie (relative to the targets)
    # Slack beyond this is as good as this: replicas that all meet the targets with this much to spare
    # are equals, and load (then the soonest first token, where prefix affinity acts) decides, not
    # small differences between their predicted speeds (noise, when both are comfortably fast).
    ample_slack: float = 0.5
    stale_after_s: float = 1.0  # stats older than this rank after fresh ones
    # A replica's measured speed (tau, forward rate, overhead, calibration) is smoothed over this
    # half-life across its stats readings (router/signals.py smooth_speed); 0: each reading as it is.
    speed_half_life_s: float = 1.0
    # Predict TPOT with the prefill chunks co-scheduled in the decode steps (module docstring). Off by
    # default: closer to what requests see, but in the simulator (10 GPU-class replicas, 80% load,
    # max_num_batched_tokens 2048) it lowered SLA attainment (engine scheduling 0.854 -> 0.777, with the
    # controller 0.869 -> 0.831; equal at a budget of 1024): with slack no longer ample, the choice
    # follows each replica's noisy predicted speed rather than its load, and when the residents' harm
    # makes every replica infeasible a standard request goes where the harm is least, piling up there.
    prefill_aware: bool = False
    # Scale each replica's decode-only TPOT by its measured decode steps (Speed.calibration, router/
    # signals.py decode_calibration). Off by default: it makes the predictions honest (the simulator's
    # GPU regime, 10 replicas, 80% load: realised / predicted TPOT p50 2.05 -> 0.94), but with the
    # predictions no longer optimistic the slack is no longer ample, the choice follows each replica's
    # predicted speed instead of its load, and SLA attainment fell there (0.949 -> 0.867; with
    # ample_slack 0.1, 0.933). With the speed smoothed (speed_half_life_s) it still falls there (40 s
    # traces, seeds 0 and 1: 0.952 / 0.979 -> 0.867 / 0.947), while in bench/route_sim.py's two CPU
    # replicas it gains a little (goodput vs pow2, seeds 0-11: uniform 1.050 -> 1.054, heterogeneous
    # 1.402 -> 1.442): not enough to make it the default.
    calibrate_tpot: bool = False
    # A class that may shed waits for a sequence slot (rather than being refused) when one is predicted
    # to free in time for its TTFT target (`slot_soon`); False: refused as soon as every replica is full.
    slot_wait: bool = True
    # A request waits for a replica that lacks only a free sequence slot when, once its first running
    # request finishes, that replica would give the newcomer this much more slack (relative to the
    # targets, the wait counted in its TTFT) than the best replica with a slot gives it now. A request
    # whose TTFT target is loose and TPOT target tight is better served by a small batch soon than by
    # a large batch now: where max_num_seqs differ, the small replica keeps its batch small and the
    # large one fills (bench/route.py's heterogeneous setting, where the interactive class lost its TPOT
    # on the max_num_seqs 8 replica while the 2 one was full: with 0.1, python bench/route.py --settings
    # heterogeneous --arms pow2 sla, goodput against pow2 1.268, repeats 1.255 / 1.263 / 1.286, where
    # three sittings without it read 1.170, 1.052, 1.250). inf: never wait while a replica has room.
    wait_gain: float = 0.1
    min_retry_s: float = 0.25  # a retry hint never asks for less (signals refresh about this often)
    max_retry_s: float = 30.0
    # Replicas scored per decision: this many drawn at random from a larger fleet, plus those this router
    # sent the prompt's leading page to (router/candidates.py); None: every replica, every time.
    candidates: int | None = 8

    def __post_init__(self) -> None:
        if not self.tie_margin >= 0:
            raise ValueError(f"tie_margin must be >= 0, got {self.tie_margin!r}")
        if not 0 < self.ample_slack <= 1:
            raise ValueError(f"ample_slack must be in (0, 1], got {self.ample_slack!r}")
        if not self.speed_half_life_s >= 0:
            raise ValueError(f"speed_half_life_s must be >= 0, got {self.speed_half_life_s!r}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {self.stale_after_s!r}")
        if not self.wait_gain >= 0:
            raise ValueError(f"wait_gain must be >= 0, got {self.wait_gain!r}")
        if not 0 <= self.min_retry_s <= self.max_retry_s:
            raise ValueError("need 0 <= min_retry_s <= max_retry_s")
        whole = isinstance(self.candidates, int) and not isinstance(self.candidates, bool)
        if self.candidates is not None and not (whole and self.candidates >= 1):
            raise ValueError(f"candidates must be a whole number >= 1 or None, got {self.candidates!r}")


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    tpot_others_s: float  # the TPOT of the requests already there once the newcomer decodes beside them
    slack: float  # the least relative slack over the newcomer's targets and the harm to others
    cached_tokens: int = 0  # prompt tokens the replica is expected to serve from its prefix cache

    def to_dict(self) -> dict:
        out = {
            "ttft_ms": round(self.ttft_s * 1e3, 3),
            "tpot_ms": round(self.tpot_s * 1e3, 3),
            "tpot_others_ms": round(self.tpot_others_s * 1e3, 3),
            "slack": round(self.slack, 4),
        }
        if self.cached_tokens:
            out["cached_tokens"] = self.cached_tokens
        return out


@dataclass(frozen=True)
class Candidate:
    state: ReplicaState
    tier: int  # 0 fresh, 1 stale, 2 no signals
    prediction: Prediction | None  # None in tier 2

    @property
    def feasible(self) -> bool:
        return self.prediction is None or self.prediction.slack >= 0


@dataclass(frozen=True)
class Decision:
    """What the router did with a request, and why: the trace records `to_dict()`."""

    action: str  # "route" | "shed" | "wait"
    ranking: tuple[str, ...]  # replica ids, most preferred first (route only)
    reason: str
    retry_after_s: float | None = None  # shed only
    candidates: tuple[Candidate, ...] = ()
    excluded: Mapping[str, str] = field(default_factory=dict)  # replica id -> the filter that dropped it

    def to_dict(self) -> dict:
        scores = {
            c.state.replica_id: {
                "tier": ("fresh", "stale", "unknown")[c.tier],
                "load": c.state.load,
                **(c.prediction.to_dict() if c.prediction else {}),
            }
            for c in self.candidates
        }
        out = {"action": self.action, "reason": self.reason, "ranking": list(self.ranking), "scores": scores}
        if self.excluded:
            out["excluded"] = dict(self.excluded)
        if self.retry_after_s is not None:
            out["retry_after_s"] = round(self.retry_after_s, 3)
        return out


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


# ---- prediction ----------------------------------------------------------------------------------


def ttft(state: ReplicaState, prompt_tokens: int) -> float:
    """Seconds until the first token of a prompt of `prompt_tokens` uncached tokens admitted now."""
    speed = state.speed
    assert speed is not None
    # What depends on the replica alone, remembered per Speed: every candidate scoring of a replica
    # between two of its changes asks the same (only the newcomer's prompt differs).
    key = ("ttft", state.running, state.queued_prefill_tokens, state.load > 0)
    found = speed._memo.get(key)
    if found is None:
        decode_tokens = state.running * (1 + verify_length(speed, state.running)) if state.running else 0
        capacity = max(1, speed.max_batch_tokens - decode_tokens)  # prefill tokens per step
        in_flight = 0.0
        if state.load:  # a step is running: on average half of it is left
            in_flight = 0.5 * step_time(speed, decode_tokens + min(state.queued_prefill_tokens, capacity))
        found = speed._memo[key] = (decode_tokens, capacity, in_flight)
    decode_tokens, capacity, in_flight = found
    todo = state.queued_prefill_tokens + prompt_tokens
    steps = math.ceil(todo / capacity)
    return in_flight + steps * step_time(speed, min(speed.max_batch_tokens, decode_tokens + todo))


def slack(sla: Sla, ttft_s: float, tpot_s: float, max_tokens: int) -> float:
    """The least relative margin to the targets (negative: missed by that fraction)."""
    margin = (sla.ttft_s - ttft_s) / sla.ttft_s
    if max_tokens > 1:  # one token has no time per output token
        margin = min(margin, (sla.tpot_s - tpot_s) / sla.tpot_s)
    return margin


def cached_tokens(state: ReplicaState, newcomer: Newcomer) -> int:
    """The newcomer's leading prompt tokens `state` holds in its prefix cache (a prediction: pages may
    be evicted before it arrives). Pages are named per page size: another size matches nothing."""
    pages = newcomer.prefix
    if pages is None or not state.cached_prefix or pages.page_size != state.page_size:
        return 0
    # dspark.prefix_cache.held_prefix_pages, inlined: importing dspark would load torch into the policy.
    hits = 0
    for h in pages.hashes:  # a prefix: the first page missing ends the match
        if h not in state.cached_prefix:
            break
        hits += 1
    return hits * pages.page_size


def resident_backlog(state: ReplicaState, newcomer: Newcomer, prompt_tokens: int) -> float:
    """The prefill per step the queued prompts and the newcomer's `prompt_tokens` add to the residents'
    steps, spread over their remaining rounds: the median of their tokens left (of the soonest 64 when
    the replica reports only those: a pessimistic spread; the newcomer's max_tokens when it reports
    none) over tau."""
    backlog = state.queued_prefill_tokens + prompt_tokens
    if not backlog or not state.running:
        return 0.0
    speed = state.speed
    assert speed is not None
    left = state.remaining_tokens
    tokens = left[len(left) // 2] if left else newcomer.max_tokens
    _, gain = decode_round(speed, state.load + 1)
    return backlog / max(1.0, tokens / gain)


def predict(
    state: ReplicaState, newcomer: Newcomer, inflow_rate: float | None = None, waited_s: float = 0.0
) -> Prediction:
    """What the newcomer would see on `state`, and its residents with it. With `inflow_rate` (prompt
    tokens per second reaching the replica while the newcomer decodes) the steps carry prefill: that
    inflow, and for the residents the queue and the newcomer's prompt. None: decode tokens only (the
    policy's default, `PolicyConfig.prefill_aware`). `waited_s`: how long it has waited for a replica
    already, which its TTFT target counts too (the prediction's ttft_s is from now)."""
    speed = state.speed
    assert speed is not None
    cached = cached_tokens(state, newcomer)
    # The last prompt token always runs: it makes the first output token.
    prompt = max(1, newcomer.prompt_tokens - cached)
    batch = state.load + 1
    first = ttft(state, prompt)
    if inflow_rate is None:
        own, others = tpot(speed, batch, newcomer.sla.name), tpot(speed, batch)
    else:
        inflow = prefill_per_step(speed, batch, inflow_rate)
        own = tpot(speed, batch, newcomer.sla.name, inflow)
        others = tpot(speed, batch, None, inflow + resident_backlog(state, newcomer, prompt))
    score = slack(newcomer.sla, waited_s + first, own, newcomer.max_tokens)
    for sla in state.running_slas:
        if sla.priority <= newcomer.sla.priority:  # harm to less important classes does not count
            score = min(score, (sla.tpot_s - others) / sla.tpot_s)
    return Prediction(first, own, others, score, cached)


# ---- filters, pick, retry hint -------------------------------------------------------------------


UNHEALTHY, NO_KV_ROOM, NO_SLOT = "unhealthy", "no KV room", "no free sequence slot"


def exclusion(state: ReplicaState, newcomer: Newcomer) -> str | None:
    """Why `state` cannot take the request now; None when it can."""
    if not state.healthy:
        return UNHEALTHY
    if state.speed is None:
        return None  # no stats yet: only the router's own accounting, checked as it comes
    if pages_for(newcomer.prompt_tokens + newcomer.max_tokens, state.page_size) > state.free_pages:
        return NO_KV_ROOM
    if state.load >= state.max_num_seqs:
        return NO_SLOT
    return None


def tier(state: ReplicaState, config: PolicyConfig, age_s: float | None = None) -> int:
    """0 fresh, 1 stale, 2 no signals; `age_s`: the signals' age when not the state's own."""
    if state.speed is None:
        return 2
    return 0 if (state.age_s if age_s is None else age_s) <= config.stale_after_s else 1


def decide(
    replicas: Sequence[ReplicaState],
    newcomer: Newcomer,
    config: PolicyConfig,
    rng: random.Random,
    ages: Sequence[float] | None = None,
    waited_s: float = 0.0,
) -> Decision:
    """Rank `replicas` for `newcomer`. `ages`: each replica's signal age, in the same order, when their
    states do not carry it (the only thing age decides is the fresh/stale tier). `waited_s`: how long the
    request has waited for a replica already (its TTFT runs from its arrival)."""
    excluded: dict[str, str] = {}
    candidates: list[Candidate] = []
    keys: list[tuple] = []  # each candidate's rank key, computed once: the sort and the tie-break read it
    inflow = inflow_rate(replicas) if config.prefill_aware else None
    full: list[ReplicaState] = []  # lacking only a free slot, their signals fresh: worth a wait?
    for state, age_s in zip(replicas, ages if ages is not None else [s.age_s for s in replicas], strict=True):
        reason = exclusion(state, newcomer)
        if reason is not None:
            excluded[state.replica_id] = reason
            if reason == NO_SLOT and tier(state, config, age_s) == 0:
                full.append(state)
            continue
        t = tier(state, config, age_s)
        candidate = Candidate(state, t, predict(state, newcomer, inflow, waited_s) if t < 2 else None)
        candidates.append(candidate)
        keys.append(_rank_key(candidate, config.ample_slack))
    sla = newcomer.sla
    if not candidates:
        # Full, not out of KV room: a patient class waits for a slot, as Serve queues a request for a
        # full replica; one that may shed waits too if a slot is predicted to free in time for its TTFT.
        if NO_SLOT in excluded.values() and not never_fits(replicas, newcomer):
            if not sla.may_shed or (
                config.slot_wait and slot_soon(replicas, newcomer, excluded, inflow, waited_s)
            ):
                return Decision(
                    "wait", (), "every replica with KV room is at max_num_seqs; waiting", excluded=excluded
                )
        return _shed(replicas, newcomer, config, "no replica has room", excluded, inflow)
    if sla.may_shed and all(key[0] for key in keys):  # key[0]: not feasible
        reason = f"no replica can meet SLA class {sla.name!r}"
        return _shed(replicas, newcomer, config, reason, excluded, inflow)
    ranks = sorted(range(len(keys)), key=keys.__getitem__)  # stable: equal keys keep the replicas' order
    order = [candidates[i] for i in ranks]
    chosen = _break_tie(order, [keys[i] for i in ranks], config.tie_margin, rng)
    score_now = _score(chosen, config.ample_slack)
    # A wait can win only if the chosen replica leaves wait_gain below ample_slack (slack counts up to it):
    # most decisions (a loose class, any request with ample slack now, wait_gain inf) predict no wait.
    if full and score_now + config.wait_gain <= config.ample_slack:
        better = better_soon(full, newcomer, score_now, config, inflow, waited_s)
        if better is not None:
            rid, wait = better
            reason = (
                f"replica {rid} is predicted to free a slot in {wait:.3f} s with more slack than any has now"
            )
            return Decision("wait", (), reason, candidates=tuple(order), excluded=excluded)
    ranking = (chosen.state.replica_id, *(c.state.replica_id for c in order if c is not chosen))
    reason = "meets the SLA" if chosen.feasible else "best slack; no replica meets the SLA"
    return Decision("route", ranking, reason, candidates=tuple(order), excluded=excluded)


def slot_soon(
    replicas: Sequence[ReplicaState],
    newcomer: Newcomer,
    excluded: Mapping[str, str],
    inflow: float | None,
    waited_s: float = 0.0,
) -> bool:
    """Whether a replica that lacks only a free sequence slot is predicted to take the newcomer soon
    enough that its first token still meets the TTFT target: the wait for room (time_until_room) plus
    its TTFT on the replica as it is now (no sooner once room frees: its queue is still ahead)."""
    target = newcomer.sla.ttft_s
    for state in replicas:
        if excluded.get(state.replica_id) != NO_SLOT:
            continue
        prompt = max(1, newcomer.prompt_tokens - cached_tokens(state, newcomer))
        budget = target - waited_s - ttft(state, prompt)
        if budget > 0 and time_until_room(state, newcomer, inflow, budget) <= budget:
            return True
    return False


def better_soon(
    full: Sequence[ReplicaState],
    newcomer: Newcomer,
    score_now: float,
    config: PolicyConfig,
    inflow: float | None,
    waited_s: float = 0.0,
) -> tuple[str, float] | None:
    """The replica among `full` (each lacking only a free slot) worth waiting for, and the wait: once its
    first running request finishes it meets the newcomer's SLA with at least `config.wait_gain` more
    slack than `score_now` (the best replica's with a slot, capped at ample_slack as the ranking caps
    it). The wait counts in the TTFT slack. None: none is."""
    best: tuple[float, str, float] | None = None
    for state in full:
        wait, after = first_slot(state, newcomer, inflow)
        if exclusion(after, newcomer) is not None:
            continue
        slack = predict(after, newcomer, inflow, waited_s + wait).slack
        score = min(slack, config.ample_slack)
        if slack >= 0 and score >= score_now + config.wait_gain and (best is None or score > best[0]):
            best = (score, state.replica_id, wait)
    return None if best is None else (best[1], best[2])


def first_slot(state: ReplicaState, newcomer: Newcomer, inflow: float | None) -> tuple[float, ReplicaState]:
    """When `state`'s first running request is predicted to finish (its queued prompts prefilled, then
    the fewest tokens left at today's TPOT), and the replica as it is then."""
    left, per_token, drain, pages_each = _draining(state, newcomer, inflow)
    if not left:
        return drain, state
    return max(drain, left[0] * per_token), _freed(state, 1, left, pages_each)


def inflow_rate(replicas: Sequence[ReplicaState]) -> float:
    """The prompt tokens per second a replica can expect while a newcomer decodes: the candidates' mean
    recent inflow. Where prompts go next is the router's own choice, and it spreads them; a replica's
    own past rate would make one that was spared lately look fast until everything had gone there."""
    rates = [s.prefill_rate for s in replicas if s.speed is not None]
    return sum(rates) / len(rates) if rates else 0.0


def _score(c: Candidate, ample: float) -> float:
    return min(c.prediction.slack, ample) if c.prediction else 0.0


def _rank_key(c: Candidate, ample: float) -> tuple:
    return (not c.feasible, c.tier, -_score(c, ample), c.state.occupancy)


def _break_tie(order: list[Candidate], keys: list[tuple], tie_margin: float, rng: random.Random) -> Candidate:
    """Among the candidates tied with the best (same class of rank, slack within the tie margin, or
    both ample), the least loaded for its size (occupancy); between equally loaded ones, the soonest
    first token; then a draw. `order` is ranked by `keys` (_rank_key), so the tied ones lead it."""
    unfit, best_tier, best, _ = keys[0]
    floor = -best - tie_margin  # the rank key holds the slack negated
    tied = []
    for c, (f, t, negative, occupancy) in zip(order, keys):
        if f != unfit or t != best_tier or -negative < floor:
            break
        tied.append((occupancy, c))
    least = min(occupancy for occupancy, _ in tied)
    tied_c = [c for occupancy, c in tied if occupancy == least]
    # Equally loaded: the one predicted to start the newcomer soonest, which is where prefix affinity
    # acts: a replica holding the prompt's prefix skips that prefill. A draw between equals.
    soonest = min(_ttft(c) for c in tied_c)
    return rng.choice([c for c in tied_c if _ttft(c) <= soonest])


def _ttft(c: Candidate) -> float:
    return c.prediction.ttft_s if c.prediction else 0.0


def never_fits(replicas: Sequence[ReplicaState], newcomer: Newcomer) -> bool:
    """True when the request's KV reservation exceeds every known replica's whole cache."""
    known = [s for s in replicas if s.speed is not None]
    need = newcomer.prompt_tokens + newcomer.max_tokens
    return bool(known) and all(pages_for(need, s.page_size) > s.total_pages for s in known)


def _shed(
    replicas: Sequence[ReplicaState],
    newcomer: Newcomer,
    config: PolicyConfig,
    reason: str,
    excluded: Mapping[str, str],
    inflow: float | None = None,
) -> Decision:
    if never_fits(replicas, newcomer):
        # No wait helps: the engine's own refusal for this case says retry 0 (dspark/kv_cache.py).
        need = newcomer.prompt_tokens + newcomer.max_tokens
        return Decision("shed", (), f"{need} tokens exceed every replica's KV cache", 0.0, excluded=excluded)
    # The soonest replica's wait, clamped to max_retry_s: a replica is followed only while its wait could
    # still lower that (time_until_room's `within`), the same answer as scanning each one to the end.
    wait = math.inf
    for state in replicas:
        if state.healthy and state.speed is not None:
            wait = min(wait, time_until_room(state, newcomer, inflow, min(wait, config.max_retry_s)))
    retry = min(config.max_retry_s, max(config.min_retry_s, wait))
    return Decision("shed", (), reason, retry, excluded=excluded)


def time_until_room(
    state: ReplicaState, newcomer: Newcomer, inflow_rate: float | None = None, within: float = math.inf
) -> float:
    """Seconds until `state` could take the newcomer within its SLA: queued prompts prefill, then the
    running requests finish in order of their tokens left at today's TPOT. inf: not even when idle, or
    not sooner than `within` (the waits only grow as more requests finish, so the scan stops there)."""
    left, per_token, drain, pages_each = _draining(state, newcomer, inflow_rate)
    # The newcomer's own prompt, less its cached prefix, as predict() counts it: its TTFT is checked first
    # (a long prompt misses it until most requests have finished, and then the rest need no prediction).
    prompt = max(1, newcomer.prompt_tokens - cached_tokens(state, newcomer))
    target = newcomer.sla.ttft_s
    for finished in range(state.load + 1):
        wait = max(drain, left[finished - 1] * per_token) if finished else drain
        if wait >= within:
            return math.inf
        after = _freed(state, finished, left, pages_each)
        if exclusion(after, newcomer) is not None or (target - ttft(after, prompt)) / target < 0:
            continue
        if predict(after, newcomer, inflow_rate).slack >= 0:
            return wait
    return math.inf


def _draining(
    state: ReplicaState, newcomer: Newcomer, inflow_rate: float | None
) -> tuple[list[int], float, float, float]:
    """How `state` drains: its requests' tokens left, ascending (the newcomer's max_tokens for those it
    does not report); seconds per token at today's batch; seconds to prefill its queued prompts; KV
    pages each request holds on average."""
    speed = state.speed
    assert speed is not None
    batch = max(state.load, 1)
    per_token = tpot(speed, batch, None, prefill_per_step(speed, batch, inflow_rate or 0.0))
    drain = ttft(state, 0) if state.queued_prefill_tokens else 0.0
    used_pages = state.total_pages - state.free_pages
    pages_each = used_pages / state.load if state.load else 0.0
    left = list(state.remaining_tokens) + [newcomer.max_tokens] * max(
        0, state.load - len(state.remaining_tokens)
    )
    left.sort()
    return left, per_token, drain, pages_each


def _freed(state: ReplicaState, finished: int, left: Sequence[int], pages_each: float) -> ReplicaState:
    """`state` once its `finished` requests with the fewest tokens `left` are done and its queue
    prefilled: their slots and pages free, the rest running."""
    return ReplicaState(
        state.replica_id,
        state.speed,
        state.load - finished,
        0,
        0,
        state.free_pages + round(finished * pages_each),
        state.total_pages,
        state.page_size,
        state.max_num_seqs,
        state.running_slas,
        tuple(left[finished:]),
        state.age_s,
        state.healthy,
        state.prefill_rate,
        state.cached_prefix,
    )
