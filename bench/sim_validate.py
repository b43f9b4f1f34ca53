"""Validation of the simulator against the real cluster: one seeded workload, both ways.

Real: the demo stack on real Ray Serve (two target replicas with the DSpark drafter, the app's SLA router,
OpenAI HTTP), an open-loop client that starts each request at its arrival time and streams it (ignore_eos,
so every request runs to its max_tokens), measuring TTFT and TPOT per request. Simulated: the same requests
(arrival, prompt tokens as the target's tokenizer counts them, max_tokens, SLA class, domain) on two
simulated replicas with this machine's profile (sim/profiles/cpu_measured.json), whose SPS table is replaced
by the one the real replicas use (the newest table in the engine's cache after the stack started) and whose
engine settings follow the app's. Reported for each metric: real, simulated, and the relative difference.

Run on an idle machine (the real half measures this machine), by bench/sim.py or alone:

    python bench/sim_validate.py [--quick] [--models models] [--drafter dspark]

which writes bench/results/sim_validate.json and, when bench/results/sim.json exists, puts the result
in its "validation" entry (so `bench/sim.py --skip-validation` and this together make the full report).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from bench.sim import markdown as sim_markdown  # noqa: E402
from sim.cluster import Cluster, ClusterConfig, Group  # noqa: E402
from sim.metrics import summarize  # noqa: E402
from sim.profiles import load  # noqa: E402
from sim.scenario import CLASSES  # noqa: E402
from sim.workload import Request, Workload, generate  # noqa: E402

METRICS = ("throughput_rps", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
ENGINE = {
    "drafter": "dspark",
    "num_speculative_tokens": 7,
    "scheduler": "dspark",
    "cost_table_profile": "coarse",
    "max_num_seqs": 16,
    "kv_cache_memory_mb": 256,
}


def validate(
    models: str, quick: bool = False, drafter: str = "dspark", real_from: dict | None = None
) -> dict:
    """`drafter` other than dspark (ngram) serves a target without trained drafters: a smoke run only.
    `real_from`: an earlier result of this function whose real figures are taken instead of running the
    real stack again (the simulator's half recomputed against the same seeded workload)."""
    target = Path(models) / "target"
    if not (target / "config.json").is_file() or (
        drafter == "dspark" and not (Path(models) / "drafters" / "dspark").is_dir()
    ):
        return {"skipped": f"no demo models under {models!r} (make models)"}
    engine = {**ENGINE, "drafter": drafter}
    rate, duration = (1.0, 6.0) if quick else (3.0, 120.0)
    warmup = 1.0 if quick else 15.0
    work = Workload(
        rate=rate,
        duration_s=duration,
        seed=7,
        classes={"interactive": 0.5, "standard": 0.5},
        domains={"code": 0.5, "prose": 0.5},
        prompt_median=48,
        prompt_sigma=0.4,
        output_median=48 if quick else 64,
        output_sigma=0.5,
        long_prompt_share=0.0,
        max_prompt=192,
        max_output=192,
    )
    trace = generate(work)
    prompts = _prompts(target, trace)
    classes = CLASSES["cpu_measured"]
    shape = {"rate": rate, "duration_s": duration, "requests": len(trace), "seed": work.seed}
    if real_from is not None:
        if real_from.get("workload") != shape:
            raise ValueError(f"the earlier real run's workload {real_from.get('workload')} is not {shape}")
        r = {m: real_from[m]["real"] for m in METRICS}
        table = _engine_table(real_from.get("sps_table"))
        real_steps = real_from.get("real_engine_steps")
    else:
        real, real_steps = _run_real(target, trace, prompts, engine)
        r = summarize(real, classes, warmup, duration)
        table = _engine_table()
    out = {
        "workload": shape,
        "drafter": drafter,
        "sps_table": table.get("path") if table else "profile's own (no engine table found)",
        # The command that measured the real figures (this one, or the earlier run's with --sim-only).
        "real_measured": real_from.get("real_measured", real_from.get("command"))
        if real_from
        else "this run",
        "real_engine_steps": real_steps,
    }
    # The model as it stands (the engines share the host with the serving path: sim/host.py), and the
    # engine alone on its core (no host block), both against the same real figures.
    for label, host in (("sim", True), ("sim_engine_alone", False)):
        s = summarize(_run_sim(trace, table, host), classes, warmup, duration)
        for m in METRICS:
            a, b = r[m], s[m]
            out.setdefault(m, {"real": a})[label] = b
            out[m][f"rel_diff_{label}" if label != "sim" else "rel_diff"] = (
                None if not a or b is None else round((b - a) / a, 4)
            )
    diffs = [abs(v["rel_diff"]) for k, v in out.items() if k in METRICS and v["rel_diff"] is not None]
    out["max_abs_rel_diff"] = round(max(diffs), 4) if diffs else None
    out["within_15pct"] = bool(diffs) and max(diffs) <= 0.15
    out["outside_15pct"] = [
        m for m in METRICS if out[m]["rel_diff"] is not None and abs(out[m]["rel_diff"]) > 0.15
    ]
    return out


def _prompts(target: Path, trace: list[Request]) -> list[str]:
    """A held-out prompt of each request's domain, cut to its prompt length in the target's tokens."""
    from transformers import AutoTokenizer

    from drafter_service.demo.corpus import heldout_prompts

    tokenizer = AutoTokenizer.from_pretrained(target)
    pool = {d: heldout_prompts(d, 64, 256, tokenizer) for d in ("code", "prose")}
    out = []
    for i, req in enumerate(trace):
        ids = tokenizer.encode(pool[req.domain][i % 64], add_special_tokens=False)[: req.prompt_tokens]
        text = tokenizer.decode(ids)
        req.prompt_tokens = len(tokenizer.encode(text, add_special_tokens=False))  # what the engine will see
        out.append(text)
    return out


def _run_real(
    target: Path, trace: list[Request], prompts: list[str], engine: dict
) -> tuple[list[Request], dict]:
    import openai
    import ray
    from ray import serve

    from deployments.app import build_app

    port = _free_port()
    repo = Path(__file__).resolve().parents[1]
    ray.init(
        include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(repo)}}, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = {
            "model": str(target),
            "engine": engine,
            "num_replicas": 2,
            "num_ingress_replicas": 1,
            "torch_num_threads": 1,
            "replica_num_cpus": 0.5,
            "ingress_num_cpus": 0.25,
        }
        serve.run(build_app(app), name="simval", route_prefix="/")
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=600
        )
        real = [dataclasses.replace(r) for r in trace]
        from bench.serving_cost import StepWindow

        with StepWindow("simval") as window:
            asyncio.run(_drive(client, target.resolve().name, real, prompts))
    finally:
        serve.shutdown()
        ray.shutdown()
    return real, engine_steps(window, _engine_table())


def engine_steps(window, table: dict | None) -> dict:
    """The real engines' steps over the run (bench/serving_cost.StepWindow) with the profile's model of
    the same steps: where a simulated step and a real one part, step by step rather than only in the
    latencies."""
    from bench.serving_cost import engine_model_s

    steps = window.steps
    mean_step = round(steps["step_time_s"] / max(1, steps["steps"]), 5)
    return {**steps, "mean_step_wall_s": mean_step, **engine_model_s(steps, table)}


async def _drive(client, model: str, requests: list[Request], prompts: list[str]) -> None:
    import openai

    t0 = time.perf_counter()

    async def one(req: Request, prompt: str) -> None:
        await asyncio.sleep(max(0.0, req.arrival - (time.perf_counter() - t0)))
        try:
            stream = await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=req.max_tokens,
                temperature=1.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                extra_headers={"x-sla-class": req.sla_class},
            )
            async for chunk in stream:
                now = time.perf_counter() - t0
                if req.first_token is None and chunk.choices and chunk.choices[0].text:
                    req.first_token = now
                if chunk.usage is not None:
                    req.generated = chunk.usage.completion_tokens
            req.finish, req.outcome = time.perf_counter() - t0, "done"
        except openai.RateLimitError:
            req.outcome, req.finish = "shed", time.perf_counter() - t0

    await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts)))


def _engine_table(path: str | None = None) -> dict | None:
    """The SPS table the real replicas use: the newest cached table profiled for these engine settings
    (or the one at `path`, when it is still there)."""
    cache = Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark")
    given = [Path(path)] if path and Path(path).is_file() else []
    for path in given + sorted(cache.glob("sps-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        data = json.loads(path.read_text())
        engine = data.get("fingerprint", {}).get("engine", {})
        if (engine.get("max_seqs"), engine.get("gamma"), engine.get("coarse")) == (
            ENGINE["max_num_seqs"],
            ENGINE["num_speculative_tokens"],
            ENGINE["cost_table_profile"] == "coarse",
        ):
            return {
                "path": str(path),
                "points": data["points"],
                "rates": data["smoothed"],
                "fingerprint": data.get("fingerprint"),
            }
    return None


def _run_sim(trace: list[Request], table: dict | None, host: bool = True) -> list[Request]:
    profile = load("cpu_measured")
    profile = dataclasses.replace(
        profile, max_num_seqs=ENGINE["max_num_seqs"], host=profile.host if host else None, cache={}
    )
    if table is not None:
        profile = dataclasses.replace(
            profile,
            sps_points=tuple(table["points"]),
            sps_rates=tuple(table["rates"]),
            max_num_batched_tokens=max(profile.max_num_batched_tokens, table["points"][-1]),
            cache={},
        )
    requests = [
        dataclasses.replace(r, replica=None, first_token=None, finish=None, generated=0, outcome="pending")
        for r in trace
    ]
    config = ClusterConfig(
        fleet=[Group(profile, 2)], classes=CLASSES["cpu_measured"], default_class="standard", router="sla"
    )
    Cluster(config, requests).run(trace[-1].arrival + 600.0 if trace else 0.0)
    return requests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: 6 s of arrivals at 1 request/s")
    p.add_argument("--models", default="models")
    p.add_argument("--drafter", default="dspark", help="ngram: a stack without trained drafters (smoke)")
    p.add_argument("--out", type=Path, default=None, help="bench/results (build/sim_quick with --quick)")
    p.add_argument(
        "--sim-only",
        action="store_true",
        help="keep the real figures of OUT/sim_validate.json (same workload) and rerun only the simulator",
    )
    args = p.parse_args(argv)
    out = args.out or (REPO / "build" / "sim_quick" if args.quick else REPO / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    real_from = json.loads((out / "sim_validate.json").read_text()) if args.sim_only else None
    result = validate(args.models, quick=args.quick, drafter=args.drafter, real_from=real_from)
    result["wall_minutes"] = round((time.time() - start) / 60, 2)
    result["command"] = "python bench/sim_validate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if result.get("real_measured") == "this run":
        result["real_measured"] = result["command"]
    (out / "sim_validate.json").write_text(json.dumps(result, indent=1))
    report = out / "sim.json"
    if report.is_file():
        data = json.loads(report.read_text())
        data["validation"] = result
        report.write_text(json.dumps(data, indent=1))
        (out / "sim.md").write_text(sim_markdown(data))  # its table shows the validation too
    print(json.dumps(result, indent=1))
    print("wrote", out / "sim_validate.json", *([report] if report.is_file() else []))


if __name__ == "__main__":
    main()
