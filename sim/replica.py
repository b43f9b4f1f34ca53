"""One target replica, stepping as dspark/engine.py does, with the forward's time taken from a profile.

Real engine code decides everything the engine decides: admission and KV pages (dspark.kv_cache.
PageManager: a request reserves prompt + max_tokens at admission, pages are handed out per step and
rolled back after verification), the per-request draft caps (Engine._draft_cap: gamma, cut to the tokens
left and to the DraftBudget), whether to draft at all (dspark.draft_gate.DraftGate), and the verify
lengths (dspark.verify_policy's policy for the scheduler mode, over the engine's CostTable), and the
prefill beside them (dspark.step_budget, under the DraftBudget's max_step_s). What the
step would compute is modelled: its duration (sim/profiles.py) and which drafted tokens the target
accepts, drawn position by position from the request's domain's acceptance profile.

Verify-length choices are memoised per composition: requests of one domain and one cap have identical
survival rows, so the policy runs on the batch sorted by (domain, cap) and each group's lengths go back
to its members in arrival order (the engine's own tie-break between identical rows). The DSpark policy
takes the batch as those groups (dspark.verify_policy.choose_groups: Algorithm 1 walking each group's
members at one position as a run, the same lengths as on the batch written out), the others written
out. Ties between rows of different groups that happen to share a survival value may resolve
differently from the engine's arrival-order tie-break; it changes which request verifies a token, not
how many are verified.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark.cost_table import CostTable
from dspark.draft_budget import DraftBudget
from dspark.draft_gate import DraftGate
from dspark.errors import AdmissionError
from dspark.kv_cache import PageManager
from dspark.scheduler import survival
from dspark.step_budget import prefill_tokens
from dspark.verify_policy import SCHEDULED_MODES, choose_groups, make_policy, window_limit
from sim.profiles import Profile
from sim.workload import Request

MAX_MEMO = 200_000


@dataclass(slots=True)
class SimSeq:
    req: Request
    key: str
    computed: int = 0  # tokens whose K/V is in the cache
    generated: int = 0
    decoding: bool = False
    # The PageManager's own page table for it (the same list, grown and cut in place): read to skip
    # ensure/truncate calls that would change nothing, which most steps' calls are.
    table: list[int] = field(default_factory=list)
    caching: bool = False  # its prompt's pages are matched against and offered to the prefix cache

    @property
    def remaining(self) -> int:
        return self.req.max_tokens - self.generated


@dataclass(slots=True)
class Plan:
    """One step as the engine would run it: who verifies how much, which prompt chunks run, how long."""

    decoding: list[SimSeq]
    lengths: list[int]
    chunks: list[tuple[SimSeq, int]]
    tokens: int
    drafting: bool
    draft_seconds: float
    forward_seconds: float
    seconds: float
    # Its forward's padded attention (sim/attention.py): requests x longest context, and that x the most
    # new tokens of a request (0: not priced).
    keys: int = 0
    query_keys: int = 0
    stretch: float = 1.0  # how much longer than alone it ran on its host (sim/host.py), set as it ends
    started: float = 0.0  # when it started (on a host, `seconds` is its time alone until it ends)


@dataclass
class Counters:
    """Cumulative, as dspark.stats.EngineStats counts them (the routing stats derive rates from them)."""

    steps: int = 0
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    finished_requests: int = 0
    step_time_s: float = 0.0
    forward_time_s: float = 0.0
    round_time_s: float = 0.0  # a step's seconds times its decoding requests (steps run back to back)
    round_tokens: int = 0  # its decode tokens (anchors and verified drafts) times its decoding requests
    # Beside the engine's own counters, the model's view of the same steps: tokens through the forward,
    # and the steps' time alone on a core (step_time_s less the host's stretch: the engine thread's CPU).
    forward_tokens: int = 0
    # As the engine counts them, where the profile prices attention.
    attention_keys: int = 0
    attention_query_keys: int = 0
    alone_time_s: float = 0.0
    # The forwards' wall time on the host (forward_time_s stretched by the host's contention): what the
    # engine's own forward_time_s measures, so what the replica publishes (sim/stats.py).
    forward_wall_s: float = 0.0
    max_pages_used: int = 0
    # Request-rounds by (drafts verified, drafts accepted): acceptance by position follows from it.
    verify_accept: Counter = field(default_factory=Counter)


class SimReplica:
    def __init__(
        self,
        replica_id: str,
        profile: Profile,
        scheduler: str = "dspark",
        drafting: bool = True,
        slow: float = 1.0,
        seed: int = 0,
        draft_gate: bool = True,
        max_ongoing: int | None = None,
    ) -> None:
        self.replica_id, self.profile, self.scheduler = replica_id, profile, scheduler
        # Serve's max_ongoing_requests: how many requests Serve lets the replica hold. One value for the
        # whole deployment, so a replica with fewer sequence slots is sent more than it can run, and its
        # engine refuses the rest (admit). None: its own max_num_seqs.
        self.max_ongoing = max_ongoing or profile.max_num_seqs
        self.slow = slow
        self.pages = PageManager(profile.kv_pages, profile.page_size, prefix_caching=profile.prefix_caching)
        # The forward's modelled time comes from the profile's table, fixed. The engine decides (draft
        # gate, verify lengths, prefill budget) on its own table, which it heals online from its observed
        # forwards (CostTable.observe): with `profile.heal_table` a replica keeps a copy that heals the
        # same way from its modelled forwards at their wall time (contention, slowness), bucket by bucket
        # as they are observed, as the engine's does.
        self.model_table = profile.cost_table()
        self.table = self.model_table
        if profile.heal_table:
            base = self.model_table
            self.table = CostTable(list(base.points), list(base.rates), base.max_tokens, source="cache")
        self.policy = make_policy(scheduler)
        self.gamma = window_limit(scheduler, profile.gamma) if drafting else 0
        self.gate = DraftGate() if draft_gate and scheduler in SCHEDULED_MODES and self.gamma > 0 else None
        self.budget = DraftBudget()
        self.seqs: dict[int, SimSeq] = {}  # arrival order
        self.rng = random.Random(seed)
        self.counters = Counters()
        self.stepping = False
        self.alive = True
        # Verify-length choices shared by the profile's replicas, whose tables are one; a healing table is
        # the replica's own and changes every step, so its choices are not kept.
        self._memo = {} if profile.heal_table else profile.cache.setdefault(("lengths", scheduler), {})
        # What it publishes for the router: the engine's table heals online from observed step times
        # (dspark/cost_table.py), so a slow node's published rates are its true ones.
        self._published_table = [[b, round(r / self.slow, 3)] for b, r in profile.published_table()]
        self._survival = {d: survival(row[: profile.gamma]) for d, row in profile.acceptance.items()}

    @property
    def published_table(self) -> list[list[float]]:
        """The table its stats carry (deployments/replica_state.py snapshot): a healing table as it stands
        (it holds the replica's slowness already), else the profile's at the replica's speed."""
        if self.table is self.model_table:
            return self._published_table
        return [[b, round(r, 3)] for b, r in zip(self.table.points, self.table.smoothed)]

    # ---- admission ----------------------------------------------------------------------------------

    def has_slot(self) -> bool:
        """Serve would send it a request: fewer than max_ongoing in flight (the engine may still refuse)."""
        return self.alive and len(self.seqs) < self.max_ongoing

    def admit(self, req: Request) -> str | None:
        """Take the request (None) or refuse it with the engine's reason (KV exhausted, engine full)."""
        if len(self.seqs) >= self.profile.max_num_seqs:
            return f"engine full: {len(self.seqs)} of max_num_seqs={self.profile.max_num_seqs} running"
        key = str(req.rid)
        caching = self.pages.prefix_caching and req.prompt_ids is not None
        try:
            # Engine.add_request: the prompt's leading pages cached here join its table at once.
            prompt = req.prompt_ids if caching else ()
            hits = self.pages.reserve(key, req.prompt_tokens + req.max_tokens, prompt)
        except AdmissionError as exc:
            return str(exc)
        seq = self.seqs[req.rid] = SimSeq(req, key, table=self.pages.table(key), caching=caching)
        self.counters.prompt_tokens += req.prompt_tokens
        self._reuse(seq, hits)
        req.replica = self.replica_id
        return None

    def warm(self, prompts: Sequence[tuple[int, ...]]) -> None:
        """Cache these prompts' pages as a replica that served them before would hold them (prefilled,
        offered to the cache and released: evictable, not in use); no counter moves."""
        if not self.pages.prefix_caching:
            return
        for i, prompt in enumerate(prompts):
            key = f"warm-{i}"
            self.pages.reserve(key, len(prompt) + 1, prompt)
            self.pages.ensure(key, len(prompt))
            self.pages.publish(key, len(prompt))
            self.pages.release(key)

    def set_draft_budget(self, budget: DraftBudget) -> None:
        self.budget = budget

    # ---- the step -----------------------------------------------------------------------------------

    def plan(self) -> Plan | None:
        """The next step (Engine.step up to the forward), or None when nothing runs."""
        budget = self.profile.max_num_batched_tokens
        decoding, prefilling = [], []
        for s in self.seqs.values():
            (decoding if s.decoding else prefilling).append(s)
        step_cap = budget - len(decoding)
        if self.budget.max_step_tokens is not None:
            step_cap = min(step_cap, self.budget.max_step_tokens)
        top = max(0, min(self.gamma, step_cap))
        if self.budget.max_request_tokens is None and not self.budget.max_request_tokens_by_class:
            # No per-request cap: each request's window, cut to the tokens it has left (the same min and
            # max as below, without their calls: this runs for every decoding request of every step).
            caps = [
                top if left >= top else (left if left > 0 else 0)
                for left in [s.req.max_tokens - s.generated - 1 for s in decoding]
            ]
        else:
            caps = []
            limits: dict[str, int | None] = {}  # the budget's cap per SLA class, looked up once a step
            request_cap = self.budget.request_cap
            for s in decoding:
                req = s.req
                cap = min(top, req.max_tokens - s.generated - 1)
                cls = req.sla_class
                limit = limits[cls] if cls in limits else limits.setdefault(cls, request_cap(cls))
                caps.append(max(0, cap if limit is None else min(cap, limit)))
        drafting = self.gate is None or self.gate.should_draft(len(decoding), self.table)
        if not drafting:
            caps = [0] * len(caps)
        lengths = self._lengths(decoding, caps, step_cap)
        tokens = len(decoding) + sum(lengths)
        # The engine's prefill budget (Engine._step_tokens): the room left, cut to the budget's step time.
        left = prefill_tokens(self.table, tokens, self.budget.max_step_s, budget, self.profile.page_size)
        chunks = []
        for s in prefilling:
            if left <= 0:
                break
            if s.caching:  # pages another request committed since this one arrived (Engine._build_items)
                self._reuse(s, self.pages.reuse_cached(s.key, s.computed))
            n = min(s.req.prompt_tokens - s.computed, left)
            chunks.append((s, n))
            left -= n
            tokens += n
        if not decoding and not chunks:
            return None
        # PageManager.ensure where the step's tokens pass the pages held (a page holds page_size tokens).
        ensure, size = self.pages.ensure, self.profile.page_size
        for s, n in zip(decoding, lengths):
            if s.computed + 1 + n > len(s.table) * size:
                ensure(s.key, s.computed + 1 + n)
        for s, n in chunks:
            if s.computed + n > len(s.table) * size:
                ensure(s.key, s.computed + n)
        used = self.pages.num_pages - self.pages.num_free_pages
        self.counters.max_pages_used = max(self.counters.max_pages_used, used)
        drafters = len(caps) - caps.count(0)
        padding = None
        if self.profile.attention is not None:  # requests x longest context, and x most new tokens
            news = [1 + n for n in lengths] + [n for _, n in chunks]
            seqs = decoding + [s for s, _ in chunks]
            keys = len(news) * max(s.computed + n for s, n in zip(seqs, news))
            padding = (keys, keys * max(news))
        forward = self.slow * self.profile.forward_seconds(tokens, self.model_table, padding)
        seconds = self.slow * self.profile.step_seconds(
            tokens, len(decoding), drafters, self.model_table, padding, len(chunks)
        )
        draft = self.slow * (self.profile.draft_s_per_step + drafters * self.profile.draft_s_per_request)
        draft = draft if drafters else 0.0
        keys, query_keys = padding or (0, 0)
        return Plan(decoding, lengths, chunks, tokens, drafting, draft, forward, seconds, keys, query_keys)

    def _lengths(self, decoding: list[SimSeq], caps: list[int], step_cap: int) -> list[int]:
        """The engine's verify-length policy on this batch (memoised per composition, see the docstring)."""
        if not decoding:
            return []
        keys = [(s.req.domain, c) for s, c in zip(decoding, caps)]
        groups = Counter(keys)
        order = sorted(groups)
        # A step cap at or above every window summed never binds (the walk ends first): one memo entry.
        step_cap = min(step_cap, sum(caps))
        key = (step_cap, tuple((g, groups[g]) for g in order))
        by_group = self._memo.get(key)
        if by_group is None:
            windows = [cap for _, cap in order]
            rows = [self._survival[domain][:cap] for domain, cap in order]
            counts = [groups[g] for g in order]
            chosen = choose_groups(self.policy, windows, rows, counts, step_cap, self.table)
            by_group = dict(zip(order, chosen))
            if len(self._memo) > MAX_MEMO:
                # The oldest quarter goes (dicts keep insertion order): the recent compositions, which
                # the fleet's batches keep returning to, stay, where clearing it all made every step miss.
                for old in list(itertools.islice(self._memo, MAX_MEMO // 4)):
                    del self._memo[old]
            self._memo[key] = by_group
        # Each group's lengths go to its members in arrival order.
        members = {g: iter(lengths) for g, lengths in by_group.items()}
        return [next(members[g]) for g in keys]

    def complete(self, plan: Plan, now: float) -> tuple[list[Request], list[Request]]:
        """The step's results at its end: (requests that got their first token, requests finished)."""
        c = self.counters
        c.steps += 1
        c.step_time_s += plan.seconds
        c.alone_time_s += plan.seconds / plan.stretch
        c.forward_tokens += plan.tokens
        c.attention_keys += plan.keys
        c.attention_query_keys += plan.query_keys
        c.forward_time_s += plan.forward_seconds
        c.forward_wall_s += plan.forward_seconds * plan.stretch
        first, done = [], []
        rng = self.rng.random
        seqs, truncate, acceptance = self.seqs, self.pages.truncate, self.profile.acceptance
        size = self.profile.page_size
        verified = []  # (drafts verified, accepted) per request-round, counted once after the loop
        rounds = drafted = accepted_total = 0
        for s, n in zip(plan.decoding, plan.lengths):
            req = s.req
            if req.rid not in seqs:
                continue  # failed or aborted during the step
            rounds += 1
            a = 0
            if n:  # the drafts survive position by position: one draw each, until the first rejection
                row = acceptance[req.domain]
                while a < n and rng() < row[a]:
                    a += 1
                verified.append((n, a))
                drafted += n
                accepted_total += a
            computed = s.computed = s.computed + 1 + a
            if len(s.table) * size >= computed + size:  # a whole page past the kept tokens: roll back
                truncate(s.key, computed)
            generated = s.generated = s.generated + a + 1
            if generated >= req.max_tokens:
                done.append(self._finish(s, now))
        c.verify_accept.update(verified)
        c.rounds += rounds
        c.round_time_s += rounds * plan.seconds
        c.round_tokens += rounds * (rounds + drafted)
        c.drafted_tokens += drafted
        c.accepted_tokens += accepted_total
        c.generated_tokens += rounds + accepted_total
        for s, n in plan.chunks:
            if s.req.rid not in self.seqs:
                continue
            s.computed += n
            if s.caching:  # the prompt pages this chunk filled are offered to the cache (Engine._publish)
                self.pages.publish(s.key, s.computed)
            if s.computed == s.req.prompt_tokens:
                s.decoding = True
                s.generated = 1
                c.generated_tokens += 1
                s.req.first_token = now
                first.append(s.req)
                if s.req.max_tokens <= 1:
                    done.append(self._finish(s, now))
        if self.table is not self.model_table:  # the engine's table heals from the forward it timed
            # The engine times runner.forward alone (Engine.step): the step's overheads (scheduling,
            # sampling, bookkeeping) and its drafting are outside that timer, so the healed table stays
            # near the profiled one (its forwards at the served scale and the host's stretch).
            observed = plan.forward_seconds * plan.stretch
            self.table.observe(plan.tokens, observed, self.profile.heal_rate)
            self._memo.clear()
        if self.gate is not None and plan.decoding:
            # The engine's gate weighs its measured drafting time (wall) against its table, healed
            # toward its measured forwards: a healing table here is on that clock, the drafting at its
            # wall time too; a fixed one times the forward at 1 / forward_scale of the modelled one, and
            # so the drafting.
            if self.table is self.model_table:
                draft_seconds = plan.draft_seconds / self.profile.forward_scale
            else:
                draft_seconds = plan.draft_seconds * plan.stretch
            self.gate.record(
                plan.drafting,
                len(plan.decoding),
                accepted_total,
                sum(plan.lengths),
                draft_seconds,
                self.table,
            )
        return first, done

    def _reuse(self, s: SimSeq, cached: list) -> None:
        """Cached pages joined its table: their tokens count as computed (Engine._reuse)."""
        if cached:
            tokens = sum(len(entry.tokens) for entry in cached)
            s.computed += tokens
            self.counters.cached_prompt_tokens += tokens

    def _finish(self, s: SimSeq, now: float) -> Request:
        del self.seqs[s.req.rid]
        self.pages.release(s.key)
        s.req.finish, s.req.generated, s.req.outcome = now, s.generated, "done"
        self.counters.finished_requests += 1
        return s.req

    def fail(self, now: float) -> list[Request]:
        """The replica dies: every request on it fails; it takes nothing until it is replaced."""
        lost = []
        for s in list(self.seqs.values()):
            self.pages.release(s.key)
            s.req.outcome, s.req.finish, s.req.generated = "failed", now, s.generated
            lost.append(s.req)
        self.seqs.clear()
        self.alive = False
        return lost
