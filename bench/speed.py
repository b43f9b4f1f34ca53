"""Single-stream decoding speed of every method, side by side in one run, at T=0 and T=1.

Methods:
- peers: `transformers` generate, its prompt-lookup decoding (the n-gram peer) and its assisted generation
  with the draft LM bench/load.py trains (cached under models/hf_assistant);
- ours: plain decoding twice (two identical engines: their ratio is the noise band of this run), n-gram
  drafting, and every learned drafter the demo build trains: DSpark with a fixed block and with the
  scheduler (the engine's default), DFlash, EAGLE-3, MTP-1.

Each repetition runs every method on every prompt in rotating order, so drift on a noisy machine hits
all of them alike; results are ratios from the same run. Every speed-up is printed beside the drafting
that earned it (tau, drafted tokens verified per round, share of drafted tokens accepted): a ratio with
no verified drafts beside it is plain decoding under another name.

    python bench/speed.py --model models/target              # about 8 minutes on an idle 2-core machine
    python bench/speed.py --model models/target --quick      # 2 prompts, 32 tokens, 1 repeat: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from drafter_service.demo.corpus import heldout_prompts
from dspark import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from load import MARKER, ensure_assistant  # noqa: E402  (bench/ is a folder of scripts)

RESULTS = Path(__file__).parent / "results"
GAMMA = 7
# Our methods: name -> engine options (learned drafters are found beside the target: models/drafters/NAME).
ENGINES: dict[str, dict] = {
    "plain": {"drafter": "none", "scheduler": "plain"},
    "plain_repeat": {"drafter": "none", "scheduler": "plain"},  # identical work: the noise band
    "ngram": {"drafter": "ngram", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "dspark": {"drafter": "dspark", "num_speculative_tokens": GAMMA},  # the engine's default scheduler
    "dspark_fixed": {"drafter": "dspark", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "dflash": {"drafter": "dflash", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "eagle3": {"drafter": "eagle3", "num_speculative_tokens": GAMMA, "scheduler": "fixed"},
    "mtp1": {"drafter": "mtp1", "scheduler": "mtp1"},
}
PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted")


def hf_runner(model, new_tokens: int, temperature: float, eos: int, **extra):
    """transformers generate of exactly `new_tokens` tokens; `extra` selects its speculative mode."""
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature}
    if temperature:
        sampling |= {"top_k": 0, "top_p": 1.0}  # our SamplingParams' defaults, not transformers' top_k 50

    def run(prompt_ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=eos,
                **sampling,
                **extra,
            )
        return out[0, len(prompt_ids) :].tolist()

    return run


def engine_runner(llm: LLM, new_tokens: int, temperature: float):
    def run(prompt_ids: list[int], seed: int) -> list[int]:
        params = SamplingParams(temperature=temperature, max_tokens=new_tokens, ignore_eos=True, seed=seed)
        return llm.generate([prompt_ids], params)[0].token_ids

    return run


def drafting(llm: LLM) -> dict:
    """What the drafter did since the stats were reset: the work a speed-up may be credited to."""
    st = llm.engine.stats
    rounds = max(st.rounds, 1)
    return {
        "tau": round((st.accepted_tokens + st.rounds) / rounds, 3),
        "verified_drafts_per_round": round(st.drafted_tokens / rounds, 3),
        "accepted_drafts_per_round": round(st.accepted_tokens / rounds, 3),
        "draft_acceptance": round(st.accepted_tokens / st.drafted_tokens, 3) if st.drafted_tokens else 0.0,
        "gated_rounds": st.gated_rounds,
        "drafter_share": round(st.draft_time_s / st.step_time_s, 3) if st.step_time_s else 0.0,
    }


def measure(methods: dict, prompts: list[list[int]], repeats: int, label: str) -> tuple[dict, dict]:
    """tok/s of every method over every prompt and repeat (rotating order), and the first repeat's outputs."""
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
    names = list(methods)
    with tqdm(total=repeats * len(prompts) * len(names), desc=label) as bar:
        for rep in range(repeats):
            for i, prompt in enumerate(prompts):
                shift = (rep + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    start = time.perf_counter()
                    out = methods[name](prompt, 1000 * rep + i)
                    seconds[name] += time.perf_counter() - start
                    tokens[name] += len(out)
                    if rep == 0:
                        outputs[name].append(out)
                    bar.update(1)
    return {m: tokens[m] / seconds[m] for m in methods}, outputs


def run_temperature(temperature: float, args, prompts, engines: dict[str, LLM], hf: dict) -> dict:
    methods = {name: engine_runner(llm, args.new_tokens, temperature) for name, llm in engines.items()}
    for name, (model, extra) in hf.items():
        methods[name] = hf_runner(model, args.new_tokens, temperature, args.eos, **extra)
    for run in methods.values():  # warm-up: first-call allocations, lazy imports, first-seen shapes
        run(prompts[0], 0)
    for llm in engines.values():
        llm.engine.stats.__init__()
    tok_s, outputs = measure(methods, prompts, args.repeats, f"T={temperature:g}")
    plain = tok_s["plain"]
    rows = {}
    for name in methods:
        row = {"tok_s": round(tok_s[name], 2), "vs_plain": round(tok_s[name] / plain, 3)}
        if name in engines:
            row |= drafting(engines[name])
        if temperature == 0:
            same = sum(a == b for a, b in zip(outputs[name], outputs["plain"]))
            row["greedy_identical_to_plain"] = f"{same}/{len(prompts)}"
        rows[name] = row
    noise = abs(tok_s["plain_repeat"] / plain - 1)
    return {"temperature": temperature, "methods": rows, "noise_band": round(noise, 3)}


def markdown(result: dict) -> str:
    lines = [
        "# Single-stream decoding speed, every method side by side",
        "",
        f"`{result['command']}` — {result['model']['parameters'] / 1e6:.1f}M-parameter target, "
        f"{result['workload']['prompts']} held-out code prompts of {result['workload']['prompt_tokens']} "
        f"tokens, {result['workload']['new_tokens']} new tokens each (ignore_eos), "
        f"{result['workload']['repeats']} repeats in rotating order, block {GAMMA}, batch 1, "
        f"{result['machine']['cpu_threads']} CPU threads, 1-min load {result['machine']['loadavg_start']} "
        f"at start and {result['machine']['loadavg_end']} at end.",
        "",
        "- **vs plain**: tok/s over our plain decoding in the same run. `plain_repeat` is a second, "
        "identical plain engine: its distance from 1.00 is the **noise band** of the run, stated under "
        "each table; a ratio inside the band is no result.",
        "- **tau**: tokens gained per verify round; **verified/round**: drafted tokens put to the target "
        "per round; **accepted**: share of them kept; **gated**: rounds whose drafting the engine's gate "
        "switched off; **draft %**: share of step time spent in the drafter.",
        "- The peers report no drafting figures (transformers does not expose them).",
        "",
    ]
    for run in result["runs"]:
        lines += [
            f"## T = {run['temperature']:g}",
            "",
            "| method | tok/s | vs plain | tau | verified/round | accepted | gated | draft % "
            "| greedy = plain |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in run["methods"].items():
            spec = (
                f"{row['tau']:.2f} | {row['verified_drafts_per_round']:.2f} | "
                f"{100 * row['draft_acceptance']:.0f}% | {row['gated_rounds']} | "
                f"{100 * row['drafter_share']:.0f}"
                if "tau" in row
                else "— | — | — | — | —"
            )
            lines.append(
                f"| {name} | {row['tok_s']:.1f} | {row['vs_plain']:.2f}x | {spec} | "
                f"{row.get('greedy_identical_to_plain', '—')} |"
            )
        lines += ["", f"Noise band (plain_repeat vs plain): ±{100 * run['noise_band']:.1f}%.", ""]
    s = result["summary"]
    lines += [
        "## Summary",
        "",
        f"- DSpark (default scheduler) vs plain on code: {s['dspark_vs_plain_code_t0']:.2f}x at T=0, "
        f"{s['dspark_vs_plain_code_t1']:.2f}x at T=1, with {s['dspark_verified_drafts_per_round_t0']:.2f} / "
        f"{s['dspark_verified_drafts_per_round_t1']:.2f} drafted tokens verified per round.",
        f"- DSpark with a fixed block of {GAMMA}: {s['dspark_fixed_vs_plain_code_t0']:.2f}x at T=0, "
        f"{s['dspark_fixed_vs_plain_code_t1']:.2f}x at T=1.",
        f"- Drafter share of a DSpark round at concurrency 1 (fixed block, every round drafts): "
        f"{100 * s['drafter_share_c1']:.0f}%.",
        f"- Noise band: ±{100 * s['noise_band']:.1f}% (the larger of the two runs).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="models/target")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="2 prompts, 32 tokens, 1 repeat; writes speed_quick.*"
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.new_tokens, args.repeats = 2, 32, 1
    transformers.logging.set_verbosity_error()
    target = Path(args.model)
    load_start = os.getloadavg()[0]

    tokenizer = AutoTokenizer.from_pretrained(target)
    args.eos = tokenizer.eos_token_id or 0
    prompts = [
        tokenizer.encode(p, add_special_tokens=False)
        for p in heldout_prompts("code", args.prompts, args.prompt_tokens, tokenizer)
    ]
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assistant_dir = target.parent / "hf_assistant"
    if args.quick and not (assistant_dir / MARKER).exists():
        assistant_dir = target.parent / "hf_assistant_quick"  # never cache a quick one as the real peer
    ensure_assistant(assistant_dir, tokenizer, args.quick)
    assistant = AutoModelForCausalLM.from_pretrained(assistant_dir, dtype=torch.float32).eval()
    hf = {
        "hf_generate": (model, {}),
        "hf_prompt_lookup": (model, {"prompt_lookup_num_tokens": GAMMA}),
        "hf_assisted": (model, {"assistant_model": assistant}),
    }
    engines = {name: LLM(str(target), kv_cache_memory_mb=64, **opts) for name, opts in ENGINES.items()}

    runs = [run_temperature(t, args, prompts, engines, hf) for t in (0.0, 1.0)]
    t0, t1 = (r["methods"] for r in runs)
    result = {
        "command": "python bench/speed.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "loadavg_start": round(load_start, 2),
            "loadavg_end": round(os.getloadavg()[0], 2),
        },
        "model": {"path": str(target), "parameters": sum(p.numel() for p in model.parameters())},
        "assistant": {
            "path": str(assistant_dir),
            "parameters": sum(p.numel() for p in assistant.parameters()),
        },
        "workload": {
            "domain": "code (held-out stdlib files)",
            "prompts": len(prompts),
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "block": GAMMA,
            "batch": 1,
        },
        "runs": runs,
        "summary": {
            "dspark_vs_plain_code_t0": t0["dspark"]["vs_plain"],
            "dspark_vs_plain_code_t1": t1["dspark"]["vs_plain"],
            "dspark_verified_drafts_per_round_t0": t0["dspark"]["verified_drafts_per_round"],
            "dspark_verified_drafts_per_round_t1": t1["dspark"]["verified_drafts_per_round"],
            "dspark_fixed_vs_plain_code_t0": t0["dspark_fixed"]["vs_plain"],
            "dspark_fixed_vs_plain_code_t1": t1["dspark_fixed"]["vs_plain"],
            "drafter_share_c1": t0["dspark_fixed"]["drafter_share"],
            "noise_band": max(r["noise_band"] for r in runs),
        },
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "speed_quick" if args.quick else "speed"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
