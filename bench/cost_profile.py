"""sim/profiles/cpu_measured.json's measured terms, derived from bench/serving_cost.py's measurement.

The host block (sim/host.py) comes from the serving runs and request_path_s from their path run (or, for a
measurement without one, from bench/serve.py's proxy run);
with an engine sweep, the profile's SPS table (the one the served replicas used) and its step, request
and token overheads are fitted to the sweep's runs, and with a draft sweep (the draft gate off) its
drafter terms (sim/step_fit.py). Each fitted term's source entry is rewritten to name the runs it came
from; a measurement without a sweep leaves those terms and their sources as they are. host_check sets the
host model's stretch beside the one measured in each sweep run (runs that record their wall time). Pure
but for profile_from and write_profile, which read the measurements (and write the profile).

    python bench/serving_cost.py --write-profile [--out MEASUREMENT]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim import step_fit
from sim.attention import AttentionCost
from sim.host import HostCost, beyond, path_latency, path_parts
from sim.profiles import from_dict

REPO = Path(__file__).resolve().parents[1]

PATH_GROUPS = ("proxy", "ingress", "client", "ray_other")  # the serving path beside the replicas
PROFILE = REPO / "sim" / "profiles" / "cpu_measured.json"


# How far back the engines' steps see the serving path's streaming work (HostCost.step_window_s; its
# requests' work they see over window_s): a modelling choice, made on serving_cost's open-loop runs
# (bench/sim_arrivals.py). A request alone on its replica decodes 36 % slower beside a busy engine than
# beside an idle one for real; under the mixed law the simulated one did 10 % slower with the steps
# seeing the path's work over 1 s, 23 / 25 / 26 % over 100 / 50 / 25 ms (the per-core law over 1 s: 4 %).
# The shorter the window, the nearer the simulated TPOTs and the farther the steps' mean stretch (at 4
# requests per second 1.299 / 1.328 / 1.356 against the real 1.293): 50 ms between.
STEP_WINDOW_S = 0.05


def sharing_law(sharing: dict | None) -> dict:
    """How the engines share the cores with the path (HostCost's law, per_core_share, step_window_s): the
    per-core law over the path's 1 s window without a measurement of it; with bench/host_sharing.py's
    (`sharing`), "mixed" at the share of the per-core law's stretch its stand-in engines' lone steps paid
    beyond the fluid law's (the mean over its regimes and engines), the steps seeing the path's streaming
    work over STEP_WINDOW_S."""
    if not sharing:
        return {"law": "per_core", "per_core_share": 1.0, "step_window_s": None}
    shares = []
    for regime in sharing["regimes"]:
        for engine in regime["engines"]:
            fluid, per_core = engine["law_alone"]["fluid"], engine["law_alone"]["per_core"]
            if per_core > fluid:
                shares.append((engine["measured_alone"] - fluid) / (per_core - fluid))
    share = round(float(np.mean(shares)), 3)
    return {"law": "mixed", "per_core_share": share, "step_window_s": STEP_WINDOW_S}


def host_block(serving: dict, cores: int = 2, replicas: int = 2, sharing: dict | None = None) -> dict:
    """sim/host.py's HostCost fields from a `serving` measurement (negative noise taken as 0) and the law
    from bench/host_sharing.py's measurement, if any (sharing_law)."""
    req, tok, idle = serving["cpu_s_per_request"], serving["cpu_s_per_token"], serving["idle_cores"]
    return {
        "cores": cores,
        "replicas": replicas,
        "idle_cores": round(sum(idle.values()), 4),
        "cpu_s_per_request": round(sum(max(0.0, req[k]) for k in PATH_GROUPS), 5),
        "cpu_s_per_token": round(sum(max(0.0, tok[k]) for k in PATH_GROUPS), 6),
        "replica_cpu_s_per_request": round(max(0.0, req["replica_other"]), 5),
        "replica_cpu_s_per_token": round(max(0.0, tok["replica_other"]), 6),
        "path_processes": len(PATH_GROUPS) + 1,  # and the replicas' serving threads, counted as one group
        "window_s": 1.0,
        "path_stretches": True,  # the path's CPU stretches with the host's (sim/host.py path_latency)
        **sharing_law(sharing),  # how the engines share the cores with the path
    }


def path_load_fit(serving: dict, host: dict) -> dict:
    """The serving path's CPU per token and per engine step (HostCost.cpu_s_per_token, cpu_s_per_step),
    fitted by least squares (never below 0) to the engine sweep's and open-loop runs' measured serving
    load (the stack's busy cores less the engines' threads') less the host block's idle cores and its
    per-request CPU at the run's request rate, on each run's token and step rates. The per-token cost of
    the two-run measurement (host_block) is taken at one rate; across the runs the path's CPU grows slower
    than the tokens, with the tokens a step serves (sim/host.py). The replicas' own per-token part stays as
    measured and the path's is the rest. Empty with fewer than three runs that recorded their wall."""
    rates = run_rates(serving)
    if len(rates) < 3:
        return {}
    per_request = host["cpu_s_per_request"] + host["replica_cpu_s_per_request"]
    rows = [[r["tokens_per_s"], r["steps_per_s"]] for r in rates.values()]
    ys = [
        r["serving_load_cores"] - host["idle_cores"] - r["requests_per_s"] * per_request
        for r in rates.values()
    ]
    per_token, per_step = step_fit.nonnegative_least_squares(rows, ys, "tokens and steps per second")
    return {
        "cpu_s_per_token": round(max(0.0, per_token - host["replica_cpu_s_per_token"]), 6),
        "cpu_s_per_step": round(per_step, 6),
    }


def run_rates(serving: dict) -> dict[str, dict]:
    """Each engine sweep and open-loop run that recorded its wall: its requests, tokens and engine steps per
    second and its measured serving load (the stack's busy cores less the engines' threads'). A sweep run's
    requests are its tokens over the measurement's max_tokens (each runs to it); an open-loop run's are
    the ones it recorded."""
    out = {}
    arrivals = serving.get("arrival_runs") or {}
    for label in [*serving.get("engine_sweep", []), *arrivals]:
        run = serving["engine_steps"].get(label)
        if run is None or "wall_s" not in run:
            continue
        if label in arrivals:
            requests = len(arrivals[label]["requests"])
        else:
            requests = run["generated_tokens"] / serving["max_tokens"]
        out[label] = run_rate(run, requests)
    return out


def run_rate(run: dict, requests: float) -> dict:
    """An engine run's (bench/serving_cost StepWindow steps, with its wall) rates of its `requests`,
    tokens and engine steps per second and its measured serving load (the stack's busy cores less the
    engines' threads')."""
    wall = run["wall_s"]
    return {
        "requests_per_s": requests / wall,
        "tokens_per_s": run["generated_tokens"] / wall,
        "steps_per_s": run["steps"] / wall,
        "serving_load_cores": run["stack_cores"] - run["engine_cpu_s"] / wall,
    }


# The validation's layout is the proxy path (bench/sim_validate.py); `make bench`'s serve.json measures the
# direct-ingress path, so the proxy run is kept beside it
# (bench/serve.py --out bench/results/serve_proxy.json).
SERVE_PROXY = REPO / "bench" / "results" / "serve_proxy.json"
HOST_SHARING = REPO / "bench" / "results" / "host_sharing.json"  # bench/host_sharing.py's measurement
STEP_NOISE = REPO / "bench" / "results" / "step_noise.json"  # bench/step_noise.py's measurement
ATTENTION = REPO / "bench" / "results" / "attention_cost.json"  # bench/attention_cost.py's measurement


def request_path_s(serve: dict) -> float:
    """TTFT over HTTP less offline at concurrency 1 (bench/serve.py). The replica's per-request serving
    CPU stays in it: that work runs on the request's way to the engine, beside the engine's thread (it
    does not delay the engine's steps: serving_cost.json's engine_blocked_s is about 0), so the host model
    counts it only in the host's load."""
    path = serve.get("config", {}).get("path", "proxy")
    if path != "proxy":
        raise ValueError(f"serve run measured the {path!r} path; the validation's layout is 'proxy'")
    ttft = {(p["method"], p["concurrency"]): p["ttft_s"] for p in serve["points"]}
    return round(ttft["http", 1] - ttft["offline", 1], 4)


PATH_SOURCE = "serving path latency:"
HOST_SOURCE = "host block (sim/host.py):"
STEP_SOURCE = "engine overhead per step, per request and per token:"  # and forward_scale
DRAFT_SOURCE = "drafter cost per step:"
SPS_SOURCE = "SPS(B):"


def provenance(measurement: dict) -> str:
    """What the derived sources name as a measurement's origin: its command, and the UTC time it started
    where it recorded one."""
    at = measurement.get("measured_at")
    return f"{measurement['command']}, started {at}" if at else measurement["command"]


def derive_profile(
    profile: dict,
    serving: dict,
    serve: dict,
    command: str,
    sharing: dict | None = None,
    noise: dict | None = None,
    attention: dict | None = None,
) -> dict:
    """cpu_measured.json (as a dict) with its host block and request_path_s derived from `serving` (its
    own path run when it has one, else `serve`, bench/serve.py's proxy run); when `serving` has an engine
    sweep, its SPS table and step terms fitted to the sweep, and when it has a draft sweep, its drafter
    terms (a measurement without them leaves those, and their sources, as they are). `command`: the
    measurement's provenance(); `sharing`: bench/host_sharing.py's measurement (sharing_law); `noise`:
    bench/step_noise.py's, the step_noise block (noise_block; without it the profile's stays as it is);
    `attention`: bench/attention_cost.py's, the attention block, which the step fit then prices in the
    sweep's forwards (without it the profile's stays as it is)."""
    out = {**profile, "host": host_block(serving, sharing=sharing)}
    if noise is not None:
        out["step_noise"] = noise_block(noise)
    if attention is not None:
        from bench.attention_cost import block

        out["attention"] = block(attention)
    out["host"].update(path_load_fit(serving, out["host"]))
    out.pop("request_path_in_s", None)  # the measurement's own split, or none
    if "path" in serving:
        out["request_path_s"] = serving["path"]["request_path_s"]
        if "request_path_in_s" in serving["path"]:
            out["request_path_in_s"] = serving["path"]["request_path_in_s"]
        sources = {PATH_SOURCE: _own_path_source(serving["path"], command)}
    else:
        out["request_path_s"] = request_path_s(serve)
        sources = {PATH_SOURCE: _path_source(serve)}
    if "request_path_in_s" in out:
        out["host"].update(path_beyond(serving, out["host"], out["request_path_s"], out["request_path_in_s"]))
    sources[HOST_SOURCE] = _host_source(serving, command, out["host"])
    if serving.get("engine_sweep") and serving.get("sps_table"):
        sources.update(_fit_steps(out, serving, command))
    if serving.get("draft_sweep"):
        sources.update(_fit_drafter(out, serving, command))
    out["sources"] = [
        next((text for prefix, text in sources.items() if s.startswith(prefix)), s)
        for s in profile["sources"]
    ]
    return out


def noise_block(measurement: dict) -> dict:
    """The machine's speed wander (sim/noise.py) fitted to bench/step_noise.py's measurement, with its
    source."""
    from bench.step_noise import fit

    noise = measurement["noise"]
    return {
        **fit(noise),
        "source": (
            f"bench/step_noise.py's measurement ({measurement['command']}, started "
            f"{measurement['started']}): one engine alone, one request at a time, {noise['decode_steps']} "
            f"decode steps, log sd {noise['decode_log_sd']} around their median; the autocorrelation by lag "
            "fitted as (1 - w) exp(-lag / correlation_s), the variance split w per step, 1 - w slow "
            "(bench/step_noise.py fit). The slow part is taken to be the host's (bench/results/"
            "host_wander.json: two engines pinned to the two cores wander largely together) and to scale "
            "every step alike, whatever its batch"
        ),
    }


_NOT_DELAYING = (
    "the replica's own per-request serving CPU included (it runs on the request's way to the engine, "
    "beside the engine's thread, not delaying its steps: serving_cost.json's engine_blocked_s is about 0)"
)


def _path_source(serve: dict) -> str:
    ttft = {(p["method"], p["concurrency"]): p["ttft_s"] for p in serve["points"]}
    return (
        f"{PATH_SOURCE} bench/results/serve_proxy.json ({serve.get('command', 'python bench/serve.py')}; "
        f"one replica, concurrency 1): TTFT over OpenAI HTTP {ttft['http', 1] * 1e3:.1f} ms against "
        f"{ttft['offline', 1] * 1e3:.1f} ms offline; request_path_s is that difference, {_NOT_DELAYING}"
    )


def _own_path_source(path: dict, command: str) -> str:
    engine = (
        f"the engine's part per request {path['engine_s'] * 1e3:.1f} ms (received at the replica to its "
        "first token, from each request's timing: bench/ttft_split.py)"
        if "engine_s" in path
        else f"the engines' mean step wall per request {path['engine_step_s'] * 1e3:.1f} ms"
    )
    split = (
        f"; of it, request_path_in_s {path['request_path_in_s'] * 1e3:.1f} ms is the way in (sent to the "
        "replica's received stamp, the client and the replicas sharing the host's monotonic clock), the "
        f"rest, {path['request_path_back_s'] * 1e3:.1f} ms, the first token's way back"
        if "request_path_in_s" in path
        else ""
    )
    return (
        f"{PATH_SOURCE} serving_cost's path run ({command}; the validation's stack, two replicas, one "
        f"ingress, OpenAI HTTP streaming; {path['requests']} requests sent one at a time for one token "
        f"each, {path['engine_steps']} engine steps): mean TTFT at the client {path['ttft_s'] * 1e3:.1f} ms "
        f"less {engine}; request_path_s is that difference, {_NOT_DELAYING}{split}"
    )


def _host_source(serving: dict, command: str, host: dict) -> str:
    runs = serving.get("arrival_runs") or {}
    if not host.get("path_in_beyond"):
        beyond = ""
    elif runs:
        rates = ", ".join(f"{run['rate']:g}" for run in runs.values())
        count = sum(len(run["requests"]) for run in runs.values())
        beyond = (
            "; path_in_beyond / path_back_beyond = each direction's latency beyond the CPU-stretch model of "
            f"it at its run's load, by the requests open when the request arrived (way in) or its first "
            f"token was made (way back), the mean over the {count} requests of serving_cost's open-loop "
            f"runs (Poisson arrivals at {rates} per second, {serving.get('max_tokens')} tokens each, its "
            f"own prompts), counts with at least {MIN_ARRIVALS} requests (bench/cost_profile.py "
            "open_loop_beyond); path_in_jitter / path_back_jitter = those requests' deviations from the "
            "mean at their count, as 21 quantiles (every 5 %), one drawn for each simulated request "
            "(spread_quantiles, sim/host.py jitter)"
        )
    else:
        beyond = (
            "; path_in_beyond / path_back_beyond = each direction's mean latency in the engine sweep's "
            "closed-loop runs beyond the CPU-stretch model of it, by the requests open (the run's "
            "concurrency; 1 open: the path run itself, 0 beyond), the mean of the runs at one concurrency "
            "(bench/cost_profile.py closed_loop_beyond)"
        )
    return (
        f"{HOST_SOURCE} bench/serving_cost.py's measurement ({command}; derived by bench/cost_profile.py "
        "with request_path_s: the validation's stack, two demo target replicas with the DSpark drafter, "
        f"one ingress, OpenAI HTTP streaming; {serving['requests']} requests at concurrency "
        f"{serving['concurrency']}, max_tokens 1 then {serving['max_tokens']}; CPU time per process from "
        "/proc). cpu_s_per_request = proxy + ingress + client + Ray's other processes (negative noise "
        "taken as 0); replica_cpu_s_per_request/token = the replicas' threads other than the engine's "
        f"(Serve's request handling and streaming, in the engine's process); {_per_token_source(host)}"
        "idle_cores = every process of "
        "the stack with no traffic (Ray, Serve's stats polling, the client); cores = this machine's 2; "
        f"replicas = 2 per host, the validation's layout{beyond}{_law_source(host)}"
    )


def _law_source(host: dict) -> str:
    if host.get("law") != "mixed":
        return ""
    return (
        f"; law = mixed, per_core_share = {host['per_core_share']}: a step's stretch that share of the way "
        "from the fluid law's to the per-core law's, the mean share bench/host_sharing.py's stand-in "
        "engines' steps alone paid (bench/results/host_sharing.json); step_window_s = "
        f"{host['step_window_s']:g} s: the steps see the path's streaming work (per token and per step) "
        "over that window, its requests' work over window_s, as the path's own latency does all of it "
        "(bench/cost_profile.py STEP_WINDOW_S, chosen on the open-loop runs)"
    )


def _per_token_source(host: dict) -> str:
    if "cpu_s_per_step" not in host:
        return "cpu_s_per_token = the same groups' per token; "
    return (
        "cpu_s_per_token (the path's, less the replicas' own) and cpu_s_per_step = the least-squares fit "
        "(never below 0) of the engine sweep's and open-loop runs' serving load (the stack's busy cores "
        "less the engines' threads'), less the idle cores and the per-request CPU at each run's request "
        "rate, on the run's tokens and engine steps per second (bench/cost_profile.py path_load_fit: the "
        "path's CPU grows slower than its tokens, with the tokens a step serves); "
    )


def _runs(
    serving: dict, labels: list[str], attention: AttentionCost | None = None
) -> list[step_fit.EngineRun]:
    return [step_fit.EngineRun.from_counters(serving["engine_steps"][label], attention) for label in labels]


def _points(
    serving: dict, labels: list[str], attention: AttentionCost | None = None
) -> list[step_fit.EngineRun]:
    """The step fit's points: each run's prefill steps and decode steps apart where its engine counted
    them (step_fit.EngineRun.split_counters), else the run; with `attention`, their forwards' padded keys
    priced beyond the table's (where the engines counted them)."""
    return [
        p
        for label in labels
        for p in step_fit.EngineRun.split_counters(serving["engine_steps"][label], attention)
    ]


def _fit_steps(out: dict, serving: dict, command: str) -> dict[str, str]:
    """The SPS table and the step terms into `out`; their sources by prefix."""
    sweep, table = serving["engine_sweep"], serving["sps_table"]
    attention = AttentionCost.from_json(out.get("attention"))
    runs, points = _runs(serving, sweep, attention), _points(serving, sweep, attention)
    out["sps"] = {"points": list(table["points"]), "rates": list(table["rates"])}
    out["sps_fingerprint"] = table.get("fingerprint") or out.get("sps_fingerprint")
    out.pop("sps_served", None)
    cost = from_dict(out).cost_table()
    scale = step_fit.fit_forward_scale(runs, cost)
    reshaped = ""
    if scale is not None:  # the start-up table given the served forward's shape (sim/step_fit.py)
        ratios = step_fit.forward_ratios(runs, cost, scale)
        out["sps"]["rates"] = step_fit.reshape_rates(table["points"], table["rates"], ratios)
        out["sps_served"] = True
        reshaped = (
            "; reshaped to the served forward: each point's forward scaled by the engines' own forward "
            "timers over the table's (at its fitted forward_scale) at the sweep runs' mean steps, linear in "
            "tokens between them and held beyond (sim/step_fit.py reshape_rates): "
            + ", ".join(f"{q:.3f} at {b:.2f}" for b, q in sorted(ratios))
        )
        cost = from_dict(out).cost_table()
        scale = step_fit.fit_forward_scale(runs, cost)
    terms = {k: round(v, 9) for k, v in step_fit.fit_step_terms(points, cost, scale).items()}
    out.pop(step_fit.CHUNK_TERM, None)  # this measurement's own, or none
    out.update(terms)
    ratios = ", ".join(f"{r:.3f}" for r in step_fit.cpu_over_model(points, cost, terms))
    timed = ", ".join(
        f"{r:.2f}" for r in forward_over_model(serving, sweep, cost, terms["forward_scale"], attention)
    )
    timers = (
        "the engines' own forward timers (their forward's wall at the CPU share of their steps') over the "
        f"fitted forward at each run's mean step, per run: {timed} (a check of the split between the "
        "forward and the rest, which the fit alone cannot see); "
        if timed
        else ""
    )
    split = len(points) > len(runs)
    counted = attention is not None and all("attention_keys" in serving["engine_steps"][k] for k in sweep)
    priced = (
        "; each run's forward at its mean step priced with its padded key positions beyond the table's "
        "(the engines' attention_keys counter over its steps, at the attention block's s_per_key: "
        "sim/attention.py), so the table's reshape and the forward_scale are the forward's at the table's "
        "own contexts"
        if counted
        else ""
    )
    per = (
        "each run's steps that ran a prompt chunk and its decode-only steps as two points (the engine counts "
        "them apart: dspark/stats.py prefill_step_*), each point's CPU its share of the run's by wall"
        if split
        else "each run one point at its mean step"
    )
    over = "per-point (prefill, decode by run)" if split else "per-run"
    drafted = sum(serving["engine_steps"][label]["drafted_tokens"] for label in sweep)
    forward = sum(r.forward_tokens for r in runs)
    draft_share = sum(r.draft_cpu_s for r in runs) / sum(r.cpu_s for r in runs)
    return {
        SPS_SOURCE: f"{SPS_SOURCE} the engine's own profiled cost table (dspark/cost_table.py) the served "
        f"replicas used in serving_cost's engine sweep ({command}), cache file {Path(table['path']).name}, "
        f"fingerprint in `sps_fingerprint`; the smoothed (isotonic) rates{reshaped}",
        STEP_SOURCE: f"{STEP_SOURCE} {_fit_source(scale, step_fit.CHUNK_TERM in terms)}{priced} over "
        f"serving_cost's engine sweep ({command}; runs "
        f"{', '.join(sweep)}: concurrency x prompt tokens, two replicas at 1 torch thread, closed loop, its "
        f"own held-out prompts, never the validation's trace; {per}); {over} CPU over the fitted model "
        f"{ratios}; {timers}the engines drafted {int(drafted)} of {int(forward)} forward tokens there "
        "(their draft gate "
        f"declines most rounds on this machine), and drafting took {draft_share:.1%} of their CPU (the "
        "engine's drafting seconds at its CPU share of the steps' wall), taken out: the drafter terms "
        "price drafting apart",
    }


def _fit_source(scale: float | None, chunks: bool = False) -> str:
    """How the step terms were fitted: forward_scale from the engines' forward timers where the runs
    carry them, else with the overheads (sim/step_fit.py)."""
    signs = "the token term of either sign (the table is timed on verify-shaped steps; a prompt chunk's "
    signs += "tokens cost less each)"
    chunked = ", prompt chunks per step (the engines' prompt_chunks counter)" if chunks else ""
    bounded = "first two and the chunk term" if chunks else "first two"
    if scale is None:
        return (
            "least-squares fit (sim/step_fit.py) of the served engine thread's CPU per step, less its "
            "drafting, on (1/SPS(mean tokens per step), 1, decoding requests per step, tokens per step), the "
            f"first three never below 0 and {signs}, the first term's coefficient being forward_scale (the "
            "served forward's CPU over the table's wall time, which was timed as the replicas started)"
        )
    return (
        f"forward_scale {scale:.4f} from the engines' own forward timers (each sweep run's forward wall at "
        "the CPU share of its steps' wall, per step, on the table's forward at its mean step: "
        "sim/step_fit.py fit_forward_scale); the overheads a least-squares fit of the served engine "
        "thread's CPU per step, less its drafting and that forward, on (1, decoding requests per step, "
        f"tokens per step{chunked}), the {bounded} never below 0 and {signs}"
    )


def forward_over_model(
    serving: dict, labels: list[str], table, forward_scale: float, attention: AttentionCost | None = None
) -> list[float]:
    """Each run's forward CPU per step as the engines timed it (their forward's wall, forward_time_s, at
    the CPU share of their steps' wall) over the fitted forward at its mean step, forward_scale /
    SPS(mean tokens) (with its padded keys priced, given `attention`); runs without the timer are left
    out."""
    counters = [serving["engine_steps"][label] for label in labels]
    runs = [step_fit.EngineRun.from_counters(c, attention) for c in counters if c.get("step_time_s")]
    return [ratio for _, ratio in step_fit.forward_ratios(runs, table, forward_scale)]


def _fit_drafter(out: dict, serving: dict, command: str) -> dict[str, str]:
    """The drafter terms into `out`; their source by prefix."""
    sweep = serving["draft_sweep"]
    draft = {k: round(v, 9) for k, v in step_fit.fit_draft_terms(_runs(serving, sweep)).items()}
    out.update(draft)
    return {
        DRAFT_SOURCE: f"{DRAFT_SOURCE} non-negative least-squares fit (sim/step_fit.py) of the served "
        "engine thread's drafting CPU per step (the engine's drafting seconds at its CPU share of the "
        "steps' wall) on (1, decoding requests per step) over serving_cost's draft sweep, the same "
        f"replicas redeployed with the draft gate off ({command}; runs {', '.join(sweep)}, never the "
        f"validation's trace): {draft['draft_s_per_step'] * 1e3:.3g} ms + "
        f"{draft['draft_s_per_request'] * 1e3:.3g} ms x N",
    }


def host_check(
    serving: dict, host: dict, request_path_s: float | None = None, request_path_in_s: float | None = None
) -> dict[str, dict]:
    """The host model (sim/host.py) against the engine sweep's runs: each run's measured stretch (the
    engines' step wall over their CPU) beside the model's at the run's own measured serving load (the
    stack's busy cores less the engines'), and the same with the other work on the machine added to that
    load. A step finds the other engine stepping for the share of the run the engines stepped (taken as
    independent): the model's stretch is the mix of one and two engines stepping in that proportion. Runs
    recorded without their wall time (before it was recorded) are left out. Two engines per host.

    With the runs' TTFT in parts (serving_cost's ttft_split) and the idle path (`request_path_s`), the
    serving path's mean latency in each run beside sim/host.py's path_latency of it: at the host model's
    path stretch (the engines' own when both step, for the share of arrivals that find both stepping,
    taken as engines_stepping squared; none otherwise) and at the run's measured step stretch (the
    premise alone: the path's CPU stretches as the engines' does). With the idle way in too
    (`request_path_in_s`) and runs that recorded theirs, the way in likewise (its share of the path's CPU,
    sim/host.py path_parts)."""
    # The simulator's own law, its per-core share included (HostCost.stretch_at): the path's remainder
    # (path_beyond) is what the model leaves out, so it must be measured against the model as simulated.
    out, cost = {}, HostCost.from_json(host)
    rates = {
        label: (r["requests_per_s"], r["tokens_per_s"], r["steps_per_s"])
        for label, r in run_rates(serving).items()
    }
    for label in [*serving.get("engine_sweep", []), *serving.get("arrival_runs", {})]:
        run = serving["engine_steps"].get(label)
        if run is None or "wall_s" not in run:  # not recorded (or recorded before its wall time was)
            continue
        wall, cpu = run["wall_s"], run["engine_cpu_s"]
        load = run["stack_cores"] - cpu / wall
        other = max(0.0, run["machine_busy_cores"] - run["stack_cores"])
        share = run["step_time_s"] / (host["replicas"] * wall)

        def mixed(cores_busy: float, share: float = share) -> float:
            one, two = (cost.stretch_at(cores_busy, n) for n in (1, 2))
            return round(share * two + (1 - share) * one, 3)

        out[label] = {
            "measured": round(run["step_time_s"] / cpu, 3),
            "model": mixed(load),
            "model_with_other_work": mixed(load + other),
            "serving_load_cores": round(load, 3),
            "serving_load_model_cores": round(cost.load_at(*rates[label]), 3),
            "other_work_cores": round(other, 3),
            "engines_stepping": round(share, 3),
        }
        timed = (serving.get("ttft_split") or {}).get(label)
        if request_path_s is not None and timed:
            one, two = (cost.stretch_at(load, n) for n in (1, 2))
            path_cpu = cost.path_cpu_s

            def path_ms(cpu_stretch: float, path_cpu: float = path_cpu) -> float:
                return round(path_latency(request_path_s, path_cpu, cpu_stretch) * 1e3, 2)

            model_stretch = share**2 * two + (1 - share**2) * one
            out[label].update(
                path_ms=round(timed["path_s"] * 1e3, 2),
                path_model_ms=path_ms(model_stretch),
                path_at_measured_stretch_ms=path_ms(run["step_time_s"] / cpu),
                path_idle_ms=round(request_path_s * 1e3, 2),
            )
            if request_path_in_s is not None and "path_in_s" in timed:
                (idle_in, cpu_in), _ = path_parts(request_path_s, request_path_in_s, path_cpu)
                out[label].update(
                    path_in_ms=round(timed["path_in_s"] * 1e3, 2),
                    path_in_model_ms=round(path_latency(idle_in, cpu_in, model_stretch) * 1e3, 2),
                    path_in_idle_ms=round(idle_in * 1e3, 2),
                )
    return out


def path_beyond(serving: dict, host: dict, request_path_s: float, request_path_in_s: float) -> dict:
    """The serving path's latency beyond sim/host.py's CPU-stretch model, by the requests open on it
    (HostCost.path_in_beyond / path_back_beyond). From the measurement's open-loop runs when it has them
    (open_loop_beyond), else from its engine sweep's closed-loop runs (closed_loop_beyond). Empty without
    either."""
    checked = host_check(serving, host, request_path_s, request_path_in_s)
    runs = serving.get("arrival_runs") or {}
    residuals = open_loop_residuals(runs, checked) if runs else None
    table = beyond_means(*residuals) if residuals else closed_loop_beyond(checked)
    if not table:
        return {}
    out = {
        "path_in_beyond": [[n, round(way_in, 5)] for n, way_in, _ in table],
        "path_back_beyond": [[n, round(back, 5)] for n, _, back in table],
    }
    if residuals:  # the requests' spread around those means (HostCost.path_in_jitter, path_back_jitter)
        for key, by_open, column in zip(("path_in_jitter", "path_back_jitter"), residuals, (1, 2)):
            out[key] = spread_quantiles(by_open, {row[0]: row[column] for row in table})
    return out


JITTER_QUANTILES = 21  # the spread's quantiles, every 5 %


def spread_quantiles(by_open: dict[int, list[float]], means: dict[int, float]) -> list[float]:
    """Quantiles (every 5 %, the least to the most) of every request's latency beyond the model less the
    table's mean at its count (interpolated, held at the table's ends, as the simulator reads it)."""
    table = tuple(sorted(means.items()))
    deviations = [v - beyond(table, n) for n, values in by_open.items() for v in values]
    if not deviations:
        return []
    qs = np.percentile(deviations, np.linspace(0, 100, JITTER_QUANTILES))
    return [round(float(q), 5) for q in qs]


MIN_ARRIVALS = 5  # requests that arrived with one count open, for that count's mean to stand in the table


def arrival_rows(run: dict) -> list[dict]:
    """An open-loop run's requests (bench/serving_cost.py arrival_run: columns and rows), each as a dict by
    column; the validation's real runs keep theirs alike (bench/sim_validate.py request_rows)."""
    return [dict(zip(run["columns"], row)) for row in run["requests"]]


def open_loop_beyond(runs: dict, checked: dict) -> list[tuple[int, float, float]]:
    """(open, way in, way back) beyond the model: every timed request of the open-loop runs (serving_cost
    arrival_runs) by the requests open when it arrived (sent and not yet ended, itself included; for its
    way back, when its engine produced its first token), its way in and its way back (its time to first
    token less its way in and its engine's queue and prefill) less the model's of them at its run's load
    (host_check), the mean over the requests at one count. Counts with fewer than MIN_ARRIVALS requests
    are left out (the simulator holds the table at its ends and interpolates between its counts)."""
    return beyond_means(*open_loop_residuals(runs, checked))


def beyond_means(
    way_in: dict[int, list[float]], back: dict[int, list[float]]
) -> list[tuple[int, float, float]]:
    """(open, way in, way back): the mean residuals at each count (open_loop_residuals, means)."""
    ins, backs = means(way_in), means(back)
    counts = sorted(set(ins) | set(backs))
    return [(n, _at(ins, n), _at(backs, n)) for n in counts]


def means(by_open: dict[int, list[float]]) -> dict[int, float]:
    """The mean at each count with at least MIN_ARRIVALS requests."""
    return {n: sum(v) / len(v) for n, v in by_open.items() if len(v) >= MIN_ARRIVALS}


def open_loop_residuals(runs: dict, checked: dict) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Every timed request's way in and way back beyond the model at its run's load (open_loop_beyond),
    by the requests open as it arrived and as its engine made its first token."""
    way_in: dict[int, list[float]] = {}
    back: dict[int, list[float]] = {}
    for label, run in runs.items():
        model = checked.get(label)
        if not model or "path_in_model_ms" not in model:
            continue
        model_in = model["path_in_model_ms"] / 1e3
        model_back = (model["path_model_ms"] - model["path_in_model_ms"]) / 1e3
        rows = arrival_rows(run)
        spans = [(r["sent_s"], r["end_s"]) for r in rows]
        for r in rows:
            if None in (r["inbound_s"], r["queue_s"], r["prefill_s"]):
                continue
            engine_first = r["sent_s"] + r["inbound_s"] + r["queue_s"] + r["prefill_s"]
            way_back = r["first_token_s"] - engine_first
            way_in.setdefault(_open_at(spans, r["sent_s"]), []).append(r["inbound_s"] - model_in)
            back.setdefault(_open_at(spans, engine_first), []).append(way_back - model_back)
    return way_in, back


def _open_at(spans: list[tuple[float, float]], t: float) -> int:
    """Requests open at time t: sent at or before it and not yet ended."""
    return sum(1 for sent, end in spans if sent <= t < end)


def _at(table: dict[int, float], n: int) -> float:
    """`table` at count n, interpolated between its counts (held at its ends) where n is not one."""
    return table[n] if n in table else beyond(tuple(sorted(table.items())), n)


def closed_loop_beyond(checked: dict) -> list[tuple[int, float, float]]:
    """(open, way in, way back) beyond the model from the engine sweep's closed-loop runs that timed their
    way in: each direction's mean measured latency less the model's of it (host_check: the way back is the
    path less the way in, both ways), keyed by the run's concurrency (that many requests open), the mean
    of the runs at one concurrency; at 1 open, 0 (the path run, one request at a time, is the idle
    latency the model starts from). A closed loop keeps its requests open and replaces each the moment it
    ends: on this machine it reads the path far slower at 8 and 12 open than open-loop traffic does."""
    by_open: dict[int, list[tuple[float, float]]] = {}
    for label, run in checked.items():
        if "path_in_ms" not in run or not label.startswith("engine_"):
            continue
        way_in = (run["path_in_ms"] - run["path_in_model_ms"]) / 1e3
        back = (run["path_ms"] - run["path_in_ms"] - (run["path_model_ms"] - run["path_in_model_ms"])) / 1e3
        by_open.setdefault(_concurrency(label), []).append((way_in, back))
    if not by_open:
        return []
    table = [(1, [(0.0, 0.0)])] if 1 not in by_open else []
    table += sorted(by_open.items())
    return [(n, *[sum(x) / len(x) for x in zip(*runs)]) for n, runs in table]


def _concurrency(label: str) -> int:
    """An engine sweep run's concurrency from its label (bench/serving_cost.py sweep_label)."""
    return int(label.split("_c", 1)[1].split("_", 1)[0])


ACCEPT = REPO / "bench" / "results" / "accept.json"
ACCEPT_ROWS = {"drafter": "dspark", "temperature": 1.0, "block_size": 7}  # the validation samples at T=1


def acceptance_rows(accept: dict) -> dict[str, list[float]]:
    """The profile's per-position conditional acceptance by domain: bench/accept.py's DSpark rows at
    temperature 1, block 7 (the source the profile names)."""
    return {
        row["domain"]: [round(a, 4) for a in row["accept_by_position"]]
        for row in accept["rows"]
        if all(row[k] == v for k, v in ACCEPT_ROWS.items())
    }


def profile_from(
    measurement: dict,
    base: Path = PROFILE,
    serve: Path = SERVE_PROXY,
    noise: dict | None = None,
    attention: dict | None = None,
) -> dict:
    """The profile derived from a serving_cost measurement (as loaded), over `base`'s settings, sources and
    assumptions, with accept.json's rows, the speed wander fitted to `noise` (a bench/step_noise.py
    measurement; None: the committed one, bench/results/step_noise.json) and the attention block from
    `attention` (a bench/attention_cost.py measurement; None: the committed one, if any)."""
    current = json.loads(base.read_text())
    current["acceptance"] = acceptance_rows(json.loads(ACCEPT.read_text()))
    serve_run = json.loads(serve.read_text())
    sharing = json.loads(HOST_SHARING.read_text()) if HOST_SHARING.is_file() else None
    if noise is None and STEP_NOISE.is_file():
        noise = json.loads(STEP_NOISE.read_text())
    if attention is None and ATTENTION.is_file():
        attention = json.loads(ATTENTION.read_text())
    command = provenance(measurement)
    return derive_profile(current, measurement["serving"], serve_run, command, sharing, noise, attention)


def write_profile(measured: Path, out: Path = PROFILE) -> dict:
    profile = profile_from(json.loads(measured.read_text()))
    out.write_text(json.dumps(profile, indent=1) + "\n")
    return profile
