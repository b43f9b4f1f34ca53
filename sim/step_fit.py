"""A profile's engine step terms fitted to measured engine runs (pure: no I/O, no Ray).

sim/profiles.py times a plain step of B tokens over N decoding requests as

    forward_scale / SPS(B) + step_overhead + N request_overhead + B token_overhead

The SPS table is the engine's own profile of its forward, timed in wall time when the replica starts;
forward_scale is the served engine's CPU for that forward over the table's time (below 1 where the table
was timed while other work, such as the other replica starting, shared the cores); the three overheads
are the engine's work around the forward (scheduling, sampling, bookkeeping, streaming each token out of
the engine). They are fitted
here to runs of the engine as it is served: per run, its steps, the tokens through its forward and the
decoding requests over those steps (the engine's own counters, summed over the run), and the engine
thread's CPU time less its drafting (the engine's own drafting seconds at the share of its steps' wall
time it spent on a CPU: the profile's drafter terms price drafting apart). Each run is one point at its
mean tokens and requests per step (or two, where the engine counted its steps that ran a prompt chunk
apart: those and the decode-only rest, `EngineRun.split_counters`, since a run's mean step hides a few
long prefill steps among many short decode steps); the terms are the least-squares fit, each point
weighted by its steps, of plain CPU per step on (1 / SPS(mean tokens), 1, requests, tokens) over the
points, the first three never below 0 and the token term of either sign, the forward's term kept in (a
step always runs its forward: a fit that would price it at 0 has let the overheads absorb it, and a
profile whose forward costs nothing cannot time the draft gate's comparison, which is on the table's
clock; the fit refuses runs that show no forward cost). A fit needs points that vary both (several
concurrencies, and a run with longer prompts: at one prompt shape tokens per step move with requests per
step and the two terms cannot be told apart).

Where the runs carry the engines' own forward timers (Engine.step times runner.forward), forward_scale is
taken from them instead (fit_forward_scale: each run's forward CPU per step on the table's forward at its
mean step) and the overheads are fitted on the rest. The CPU per step alone cannot tell the forward from
a fixed cost per step: on this machine's sweeps (sittings of 2026-12-02 07:05 and 09:39) the one-stage
fit priced the forward at 0.59-0.69 of the table with 3.8-5.8 ms a step outside it, where the timers
read 1.15-1.36 of the table, leaving 2.0-2.2 ms a step and 0.17-0.28 ms a request. The split matters
beyond the step's total: the simulated draft gate weighs drafting against the forward alone, as the
engine's does (sim/replica.py), and with the forward at half its served cost it drafted a third as often
as the real engines. Weighting by steps makes the fitted steps add up to the runs' CPU (unweighted, the
few long prompt-chunk points pulled the decode points' fit, and the total fell 3-8 % short).

The table's shape is the start-up profile's, timed once as the replica starts, and can be wrong where a
single scale cannot mend it: on the sitting of 2026-12-06 its 1-token point came out below its 2-token
one, its isotonic smoothing pooled 1-6 tokens into one rate, and with the one scale that the timers gave
(1.20) the forward of a one-request step was priced 27-31 % above the engines' timers and that of a
five-to-seven-token step 13-19 % below (their ratios 0.79 / 0.76 at the sweep's 1.5 / 2.6 tokens a step,
1.13 / 1.19 at 5.2 / 7.4). Where the runs carry the timers, the table is reshaped to them first
(reshape_rates: each point's forward scaled by the timers' ratio interpolated at it, forward_ratios),
and forward_scale and the overheads are fitted over the reshaped table. The table decides too (the draft
gate, the verify lengths): over the flat one the simulated gate drafted three times as often as the real
engines, over the reshaped one as often.

Why the token term may be negative: the table is timed on verify-shaped steps (requests of gamma + 1
tokens), while a served prompt chunk runs many tokens of one request, cheaper each; with the forward
priced as served, the prompt chunks' points need that correction (-0.06 to -0.13 ms a token). A profile
whose terms would make a step of any of its table's sizes cost nothing is refused (sim/profiles.py
Profile).

Where the profile prices attention (sim/attention.py: a forward's padded key positions beyond the table's)
and the runs carry the engines' attention counters, each run's forward at its mean step is the
table's plus its mean padding's price (EngineRun.attention_s), and forward_scale, the table's reshape and the
overheads are fitted over that: the sweep's runs hold shorter contexts than the table's timed requests
(a 48-token prompt's against 256), so without it the reshaped table took in the sweep's contexts and
priced the validation's longer ones as if they were the sweep's.

Where the runs count their prompt chunks (the engine's prompt_chunks counter), the overheads take a term
per chunk beside the others (chunk_overhead_s, never below 0; every chunk falls in the prefill steps'
point): the engine's work for a chunk outside its forward (its hidden states handed to the drafter, its
pages offered to the prefix cache, the first token sampled) is its own, about 0.46 ms a chunk on one
engine alone (scratch, 2026-12-06: the outside of a step, per step, on (1, decoders, chunks, prompt
tokens, decode tokens)), and without it the token term took the prompt chunks' cost and the prefill steps
of the sweep's busier runs were priced 22-46 % below their CPU.

The drafter's terms (draft_s_per_step + n draft_s_per_request, on a step where n requests draft) are fitted
alike to runs that draft every round (the draft gate off): the drafting CPU per step on (1, requests).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.attention import AttentionCost

TERMS = ("forward_scale", "step_overhead_s", "request_overhead_s", "token_overhead_s")
DRAFT_TERMS = ("draft_s_per_step", "draft_s_per_request")
CHUNK_TERM = "chunk_overhead_s"


@dataclass(frozen=True)
class EngineRun:
    """An engine run's totals: steps, tokens through the forward, decoding requests summed over steps, the
    engine thread's CPU and the part of it spent drafting."""

    steps: int
    forward_tokens: float
    rounds: float
    cpu_s: float
    draft_cpu_s: float = 0.0
    forward_cpu_s: float | None = None  # its forward's CPU as the engine timed it (None: not timed)
    # Its mean forward's attention beyond the table's price at its mean step, on the table's clock
    # (sim/attention.py, from the engine's attention counters): 0 where not priced or not counted.
    attention_s: float = 0.0
    chunks: float | None = None  # prompt chunks run over its steps (None: not counted)

    @classmethod
    def from_counters(cls, run: dict, attention: AttentionCost | None = None) -> EngineRun:
        """From a bench/serving_cost.py engine run (`engine_steps` entry): its drafting and its forward
        (Engine.step's timer around runner.forward) at the CPU share of its steps' wall; with
        `attention`, its forwards' padded keys priced beyond the table's (where the engine counted them)."""
        wall = run.get("step_time_s", 0.0)
        on_cpu = min(1.0, run["engine_cpu_s"] / wall) if wall > 0 else 1.0
        draft_cpu = run.get("draft_time_s", 0.0) * on_cpu
        forward_cpu = run["forward_time_s"] * on_cpu if run.get("forward_time_s") else None
        counts = (int(run["steps"]), run["forward_tokens"], run["rounds"], run["engine_cpu_s"])
        whole = cls(*counts, draft_cpu, forward_cpu, chunks=run.get("prompt_chunks"))
        return whole.with_attention(attention, run.get("attention_keys"), run.get("attention_query_keys"))

    def with_attention(
        self, attention: AttentionCost | None, keys: float | None, query_keys: float | None
    ) -> EngineRun:
        """The run with its forwards' padded `keys` and `query_keys` (summed over its steps) priced."""
        if attention is None or keys is None or query_keys is None or self.steps == 0:
            return self
        tokens = max(1, round(self.tokens_per_step))
        return replace(
            self, attention_s=attention.extra_s(tokens, keys / self.steps, query_keys / self.steps)
        )

    @classmethod
    def split_counters(cls, run: dict, attention: AttentionCost | None = None) -> list[EngineRun]:
        """A bench/serving_cost.py engine run as two points where its engine counted the steps that ran
        a prompt chunk apart (dspark/stats.py prefill_step_*): those steps and the decode-only rest, each
        with its share of the engine thread's CPU by its share of the steps' wall (the two kinds run on
        the same thread beside the same load); the whole run where it did not, or where one kind is
        missing."""
        whole = cls.from_counters(run, attention)
        prefill = run.get("prefill_steps", 0)
        if not 0 < prefill < whole.steps or run.get("step_time_s", 0.0) <= 0:
            return [whole]
        share = run["prefill_step_time_s"] / run["step_time_s"]
        draft_share = (
            run["prefill_step_draft_time_s"] / run["draft_time_s"] if run.get("draft_time_s") else 0.0
        )
        decode_chunks = None if whole.chunks is None else 0.0  # every chunk runs in a prefill step
        prefill_run = cls(
            int(prefill),
            run["prefill_step_forward_tokens"],
            run["prefill_step_rounds"],
            whole.cpu_s * share,
            whole.draft_cpu_s * draft_share,
            chunks=whole.chunks,
        )
        decode_run = cls(
            whole.steps - prefill_run.steps,
            whole.forward_tokens - prefill_run.forward_tokens,
            whole.rounds - prefill_run.rounds,
            whole.cpu_s - prefill_run.cpu_s,
            whole.draft_cpu_s - prefill_run.draft_cpu_s,
            chunks=decode_chunks,
        )
        counted = ("attention_keys", "attention_query_keys")
        if all(k in run and f"prefill_step_{k}" in run for k in counted):
            in_prefill = [run[f"prefill_step_{k}"] for k in counted]
            prefill_run = prefill_run.with_attention(attention, *in_prefill)
            rest = [run[k] - p for k, p in zip(counted, in_prefill)]
            decode_run = decode_run.with_attention(attention, *rest)
        return [prefill_run, decode_run]

    @property
    def plain_cpu_s(self) -> float:
        return self.cpu_s - self.draft_cpu_s

    @property
    def tokens_per_step(self) -> float:
        return self.forward_tokens / self.steps

    @property
    def requests_per_step(self) -> float:
        return self.rounds / self.steps

    @property
    def chunks_per_step(self) -> float:
        return (self.chunks or 0.0) / self.steps


Table = Callable[[int], float]  # SPS at a step of B tokens (dspark.cost_table.CostTable is one)


def forward_s(run: EngineRun, table: Table) -> float:
    """The table's forward time at the run's mean tokens per step (the simulator steps whole tokens), with
    its attention beyond the table's where priced."""
    return 1.0 / table(max(1, round(run.tokens_per_step))) + run.attention_s


def model_s(run: EngineRun, table: Table, terms: dict[str, float]) -> float:
    """The step model's CPU per step for the run's mean step."""
    return (
        terms.get("forward_scale", 1.0) * forward_s(run, table)
        + terms["step_overhead_s"]
        + run.requests_per_step * terms["request_overhead_s"]
        + run.tokens_per_step * terms["token_overhead_s"]
        + run.chunks_per_step * terms.get(CHUNK_TERM, 0.0)
    )


def fit_step_terms(
    runs: Sequence[EngineRun], table: Table, forward_scale: float | None = None
) -> dict[str, float]:
    """The least-squares terms over `runs`, each point weighted by its steps (every step counts once, so
    the fitted steps add up to the runs' CPU), the token term of either sign (see the module docstring);
    with `forward_scale` (fit_forward_scale) the overheads alone, on the CPU less that forward."""
    weights = [r.steps**0.5 for r in runs]
    if forward_scale is None:
        x = [[forward_s(r, table), 1.0, r.requests_per_step, r.tokens_per_step] for r in runs]
        y = [r.plain_cpu_s / r.steps for r in runs]
        fit = nonnegative_least_squares(*_weighted(x, y, weights), "requests and tokens", (0,), free=(3,))
        return dict(zip(TERMS, fit))
    # Where every run counted its prompt chunks, a term per chunk beside the others (never below 0).
    counted = all(r.chunks is not None for r in runs)
    x = [
        [1.0, r.requests_per_step, r.tokens_per_step] + ([r.chunks_per_step] if counted else []) for r in runs
    ]
    y = [r.plain_cpu_s / r.steps - forward_scale * forward_s(r, table) for r in runs]
    varied = "requests, tokens and prompt chunks" if counted else "requests and tokens"
    overheads = nonnegative_least_squares(*_weighted(x, y, weights), varied, free=(2,))
    return dict(zip((*TERMS, CHUNK_TERM), [forward_scale, *overheads]))


def _weighted(x: list[list[float]], y: list[float], weights: list[float]) -> tuple[list, list]:
    """Rows and targets scaled by the square roots of the points' weights (weighted least squares)."""
    return [[w * v for v in row] for w, row in zip(weights, x)], [w * v for w, v in zip(weights, y)]


def fit_forward_scale(runs: Sequence[EngineRun], table: Table) -> float | None:
    """forward_scale from the engines' own forward timers: the least-squares ratio (through 0) of each
    timed run's forward CPU per step to the table's forward at its mean step; None when no run was
    timed (or the timers show no forward)."""
    timed = [r for r in runs if r.forward_cpu_s is not None]
    xs = [forward_s(r, table) for r in timed]
    ys = [r.forward_cpu_s / r.steps for r in timed]
    xx = sum(x * x for x in xs)
    scale = sum(x * y for x, y in zip(xs, ys)) / xx if xx > 0 else 0.0
    return scale if scale > 0 else None


def forward_ratios(
    runs: Sequence[EngineRun], table: Table, forward_scale: float
) -> list[tuple[float, float]]:
    """(mean tokens per step, the engines' timed forward CPU per step over forward_scale x the table's
    forward at that step) of each timed run, in the runs' order: 1.0 where the scaled table prices the
    served forward as the engines timed it."""
    return [
        (r.tokens_per_step, r.forward_cpu_s / r.steps / (forward_scale * forward_s(r, table)))
        for r in runs
        if r.forward_cpu_s is not None
    ]


def reshape_rates(
    points: Sequence[int], rates: Sequence[float], ratios: Sequence[tuple[float, float]]
) -> list[float]:
    """The table's rates with the forward at each point scaled by the timers' ratio there (forward_ratios:
    linear in tokens between the runs' mean steps, held beyond them): the start-up profile given the
    served forward's shape where the runs measured it."""
    by_tokens = sorted(ratios)
    xs, ys = [x for x, _ in by_tokens], [y for _, y in by_tokens]
    return [round(rate / float(np.interp(b, xs, ys)), 6) for b, rate in zip(points, rates)]


def fit_draft_terms(runs: Sequence[EngineRun]) -> dict[str, float]:
    """The drafter's terms over runs that drafted every round: drafting CPU per step on (1, requests)."""
    x = [[1.0, r.requests_per_step] for r in runs]
    y = [r.draft_cpu_s / r.steps for r in runs]
    return dict(zip(DRAFT_TERMS, nonnegative_least_squares(x, y, "requests")))


def nonnegative_least_squares(
    rows: list[list[float]],
    y: list[float],
    varied: str,
    required: tuple[int, ...] = (),
    free: tuple[int, ...] = (),
) -> list[float]:
    """argmin |y - x c| over c >= 0 (c > 0 for the `required` columns, any sign for the `free` ones),
    exact for a few unknowns: every subset of the columns (holding the required ones) is solved
    unconstrained, the others held at 0, and the feasible solution of least squared error is kept, which
    is where the constrained optimum lies."""
    x, target = np.array(rows), np.array(y)
    terms = x.shape[1]
    if len(rows) < terms:
        raise ValueError(f"a fit of {terms} terms needs at least {terms} runs, got {len(rows)}")
    if np.linalg.matrix_rank(x) < terms:
        raise ValueError(f"the runs do not vary {varied} per step independently: add runs")
    best, best_err = None if required else np.zeros(terms), float(target @ target)
    for size in range(1, terms + 1):
        for cols in itertools.combinations(range(terms), size):
            if not set(required) <= set(cols):
                continue
            coef = np.zeros(terms)
            coef[list(cols)] = np.linalg.lstsq(x[:, cols], target, rcond=None)[0]
            err = float(np.sum((target - x @ coef) ** 2))
            bounded = [c for c in range(terms) if c not in free]
            feasible = coef[bounded].min() >= 0 and all(coef[c] > 0 for c in required)
            if feasible and (best is None or err < best_err - 1e-18):
                best, best_err = coef, err
    if best is None:
        raise ValueError(f"no fit with positive terms {list(required)}: the runs do not show their cost")
    return [float(v) for v in best]


def cpu_over_model(runs: Sequence[EngineRun], table: Table, terms: dict[str, float]) -> list[float]:
    """Each run's measured CPU per plain step over the model's (1.0: the model explains the run)."""
    return [r.plain_cpu_s / r.steps / model_s(r, table, terms) for r in runs]
