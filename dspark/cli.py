"""The `dspark` command line."""

from __future__ import annotations

import argparse
import json
import sys

from dspark.drafter import available_drafters
from dspark.errors import DSparkError


def _generate(args: argparse.Namespace) -> int:
    from dspark.llm import LLM
    from dspark.sampling_params import SamplingParams

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        stop=tuple(args.stop or ()),
    )
    options = {"drafter": args.drafter, "num_speculative_tokens": args.num_speculative_tokens}
    if args.drafter_model:
        options["drafter_model"] = args.drafter_model
    llm = LLM(args.model, **options)
    out = llm.generate([args.prompt], params)[0]
    if out.error is not None:  # the engine stopped it: say why rather than print a partial text
        raise out.error
    if args.json:
        stats = llm.engine.stats.to_dict()
        stats.update(out.speculation.to_dict())
        print(
            json.dumps(
                {
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "finish_reason": out.finish_reason,
                    "prompt_tokens": len(out.prompt_token_ids),
                    "stats": stats,
                }
            )
        )
    else:
        print(out.text)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from dspark.config import EngineConfig
    from dspark.engine import Engine

    options = {
        "drafter": args.drafter,
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "dtype": args.dtype,
        "device": args.device,
        "cost_table_dir": args.cache_dir,
        "cost_table_profile": "coarse" if args.coarse else "full",
    }
    if args.drafter_model:
        options["drafter_model"] = args.drafter_model
    # A fixed-length engine loads no table on start, so the one below is profiled at most once.
    engine = Engine(EngineConfig(model=args.model, scheduler="fixed", num_kv_pages=64, **options))
    table = engine.load_cost_table(force=args.force)
    print(json.dumps({"path": str(table.path), **table.to_dict()}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspark", description="DSpark speculative decoding kit")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a continuation of one prompt")
    gen.add_argument("--model", required=True, help="local Hugging Face checkpoint directory (safetensors)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--drafter", default="none", help=f"one of {available_drafters()}")
    gen.add_argument("--drafter-model", default=None, help="checkpoint directory of a learned drafter")
    gen.add_argument("--num-speculative-tokens", type=int, default=5, help="block size gamma")
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    gen.set_defaults(func=_generate)
    prof = sub.add_parser(
        "profile",
        help="profile the verify step rate SPS(B) into the cost-table cache (serve with the same options)",
    )
    prof.add_argument("--model", required=True, help="local Hugging Face checkpoint directory (safetensors)")
    prof.add_argument("--force", action="store_true", help="profile again even if a cached table matches")
    prof.add_argument("--coarse", action="store_true", help="fewer points and repetitions (tiny models)")
    prof.add_argument("--cache-dir", default=None, help="default $DSPARK_CACHE_DIR or ~/.cache/dspark")
    prof.add_argument("--drafter", default="none", help=f"one of {available_drafters()}")
    prof.add_argument("--drafter-model", default=None, help="checkpoint directory of a learned drafter")
    prof.add_argument("--num-speculative-tokens", type=int, default=5, help="block size gamma")
    prof.add_argument("--max-num-seqs", type=int, default=64)
    prof.add_argument("--max-num-batched-tokens", type=int, default=1024)
    prof.add_argument("--dtype", default="float32")
    prof.add_argument("--device", default="cpu")
    prof.set_defaults(func=_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DSparkError as exc:
        print(f"dspark: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
