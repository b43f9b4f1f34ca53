"""Smoke check of every drafter on a device and in a dtype (scripts/gpu_smoke.sh runs it on CUDA).

Builds the tests' tiny stack (a byte-level tokenizer, a random Qwen3 target, every learned drafter
trained on its text for a few seconds; nothing downloaded) unless --stack names one, then for each
dtype: greedy runs of the target alone and with each drafter, all on --device, judged by the rule of
tests/greedy_match.py (identical up to the first near-tie of the target's top two, rarely); every
learned drafter's weights must sit on the device in that dtype. With --tp on (auto: two GPUs or
more) it also runs one drafter over a 2-way tensor-parallel target (NCCL on CUDA, gloo on the CPU).
Prints one line per check and a summary; exits 1 if any check failed.

    python scripts/gpu_smoke.py --device cpu --dtypes bfloat16    # the CPU dry run CI does
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The repository first (tests/dspark must not shadow the package), then the tests' builders.
sys.path[:0] = [str(ROOT)]
sys.path += [str(ROOT / "tests"), str(ROOT / "tests" / "drafter_service")]

import torch  # noqa: E402

from dspark import LLM, EngineConfig, SamplingParams, tp  # noqa: E402
from dspark.config import DTYPES  # noqa: E402
from dspark.engine import Engine  # noqa: E402

LEARNED = ("dspark", "dflash", "eagle3", "mtp1")
DRAFTERS = (*LEARNED, "ngram")
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
NUM_PROMPTS = 8
MAX_DIVERGING = NUM_PROMPTS // 4
TP_DRAFTER = "dspark"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name:<32} {self.detail}"


def build_stack(directory: Path) -> Path:
    """The tests' tiny stack under directory/target (reused when already complete)."""
    from conftest import build_checkpoint, train_tokenizer
    from drafter_fixtures import tiny_configs, train_tiny_stack

    target = directory / "target"
    if all((directory / "drafters" / d / "model.safetensors").is_file() for d in LEARNED):
        return target
    shutil.rmtree(directory, ignore_errors=True)
    target.mkdir(parents=True)
    tokenizer = train_tokenizer()
    build_checkpoint(target, "qwen3", tokenizer)
    configs = tiny_configs(target, tokenizer.convert_tokens_to_ids("<|mask|>"))
    train_tiny_stack(target, configs, len(tokenizer), tokenizer.eos_token_id)
    return target


def prompts_for(target: Path) -> list[list[int]]:
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 30, (NUM_PROMPTS,), generator=gen).tolist()
    return [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in lengths]


def engine_options(dtype: str, device: str) -> dict:
    return dict(dtype=dtype, device=device, num_kv_pages=128, max_num_seqs=4)


# Every round drafts 4 tokens and verifies them all: the drafter works in every step (the load-aware
# schedulers may rightly skip drafting for a tiny target, which would leave little to check).
SPECULATION = dict(num_speculative_tokens=4, scheduler="fixed")


@dataclass(frozen=True)
class Reference:
    """The target alone in one dtype on the device: prompts, greedy outputs, and logits on demand."""

    prompts: list[list[int]]
    expected: list[list[int]]
    plain: object  # greedy_match.PlainTarget

    @classmethod
    def of(cls, target: Path, device: str, dtype: str) -> Reference:
        from greedy_match import PlainTarget

        prompts = prompts_for(target)
        alone = LLM(str(target), **engine_options(dtype, device))
        expected = [o.token_ids for o in alone.generate(prompts, GREEDY)]
        return cls(prompts, expected, PlainTarget(str(target), DTYPES[dtype], device))

    def judge(self, name: str, got: list[list[int]], extra: str = "") -> Check:
        from greedy_match import check, divergences

        found = divergences(self.plain, self.prompts, self.expected, got)
        problem = check(found, len(self.prompts), MAX_DIVERGING)
        ties = ", ".join(f"prompt {d.prompt} @{d.position} gap {d.gap:.3g}" for d in found)
        summary = f"{len(found)}/{len(self.prompts)} prompts end at near-ties" + (ties and f" ({ties})")
        return Check(name, problem is None, (problem or summary) + extra)


def placement_problem(llm: LLM, dtype: torch.dtype, device: str) -> str | None:
    """Where a learned drafter's weights are not on the engine's device in its dtype."""
    model = getattr(llm.engine.drafter, "model", None)
    if model is None:
        return None
    wanted = torch.device(device).type
    stray = {(str(w.dtype), w.device.type) for w in model.parameters()} - {(str(dtype), wanted)}
    return f"drafter weights found as {sorted(stray)}" if stray else None


def engine_problem(engine: Engine) -> str | None:
    stats = engine.stats
    if stats.drafter_failures or stats.failed_requests:
        return f"{stats.drafter_failures} drafter faults, {stats.failed_requests} failed requests"
    return None if stats.drafted_tokens else "nothing was drafted"


def greedy_check(target: Path, device: str, dtype: str, drafter: str, reference: Reference) -> Check:
    name = f"{drafter} {device} {dtype}"
    try:
        llm = LLM(str(target), drafter=drafter, **SPECULATION, **engine_options(dtype, device))
        got = [o.token_ids for o in llm.generate(reference.prompts, GREEDY)]
    except Exception as exc:  # report and go on: the summary names every broken drafter
        return Check(name, False, f"{type(exc).__name__}: {exc}")
    stats = llm.engine.stats
    # The engine survives a faulty drafter by decoding plainly (dspark/drafter_guard.py): that would
    # pass the identity check, so any fault or a drafter that never drafted fails here.
    problem = placement_problem(llm, DTYPES[dtype], device) or engine_problem(llm.engine)
    if problem:
        return Check(name, False, problem)
    return reference.judge(name, got, f"; accepted {stats.accepted_tokens}/{stats.drafted_tokens} drafted")


def run_engine(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of an engine driven directly (rank 0 of a TP group is an Engine, not an LLM)."""
    waiting, ids, done = list(enumerate(prompts)), {}, {}
    while waiting or engine.has_unfinished():
        while waiting and len(engine.seqs) < engine.config.max_num_seqs:
            i, prompt = waiting.pop(0)
            ids[engine.add_request(prompt, GREEDY)] = i
        done.update({ids[o.request_id]: o.token_ids for o in engine.step() if o.finished})
    return [done[i] for i in range(len(prompts))]


def _tp_rank(rank: int, world: int, rendezvous: str, target: str, device: str, dtype: str, out: str) -> None:
    import torch.distributed as dist

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=rendezvous, rank=rank, world_size=world)
    options = engine_options(dtype, f"cuda:{rank}" if cuda else device)
    config = EngineConfig(model=target, drafter=TP_DRAFTER, **SPECULATION, **options)
    if rank == 0:
        engine = Engine(config, tp=tp.TPContext(0, world))  # the drafter sits beside rank 0's shard
        tokens = run_engine(engine, prompts_for(Path(target)))
        Path(out).write_text(json.dumps({"tokens": tokens, "problem": engine_problem(engine)}))
        engine.runner.stop()
    else:
        tp.follow(tp.follower_runner(config, tp.TPContext(rank, world)))
    tp.leave_rank(past_barrier(Path(out), rank))  # a gloo peer once aborted at teardown, after its work


def past_barrier(out: Path, rank: int) -> Path:
    """The marker a TP rank leaves once past the final barrier: all its work is done by then."""
    return out.with_suffix(f".rank{rank}.done")


def tp_check(target: Path, device: str, dtype: str, work: Path, reference: Reference) -> Check:
    import torch.multiprocessing as mp

    name = f"tp=2 {TP_DRAFTER} {device} {dtype}"
    out = work / f"tp-{dtype}.json"
    rendezvous = f"file://{work}/rendezvous-{dtype}-{time.monotonic_ns()}"
    for stale in (out, past_barrier(out, 0), past_barrier(out, 1)):  # a reused --work-dir's last run
        stale.unlink(missing_ok=True)
    try:
        mp.spawn(_tp_rank, args=(2, rendezvous, str(target), device, dtype, str(out)), nprocs=2, join=True)
    except Exception as exc:
        # A rank that got past the final barrier had done all its work: a crash after it is teardown's.
        if not all(past_barrier(out, rank).exists() for rank in range(2)):
            return Check(name, False, f"{type(exc).__name__}: {exc}")
        print(f"note: {name}: a rank exited abnormally after the final barrier ({exc}); judged on its output")
    result = json.loads(out.read_text())
    if result["problem"]:
        return Check(name, False, result["problem"])
    return reference.judge(name, result["tokens"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], choices=sorted(DTYPES))
    parser.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    parser.add_argument("--tp", choices=("auto", "on", "off"), default="auto", help="auto: on with 2+ GPUs")
    parser.add_argument("--stack", type=Path, help="a directory built by an earlier run (else built)")
    parser.add_argument("--work-dir", type=Path, help="where the stack is built (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_smoke: --device {args.device} but torch {torch.__version__} sees no CUDA device")
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="dspark-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    started = time.perf_counter()
    target = (args.stack / "target") if args.stack else build_stack(work / "stack")
    print(f"gpu_smoke: stack {target.parent} ready after {time.perf_counter() - started:.0f}s", flush=True)
    gpus = torch.cuda.device_count() if args.device.startswith("cuda") else 0
    run_tp = args.tp == "on" or (args.tp == "auto" and gpus >= 2)
    checks: list[Check] = []
    for dtype in args.dtypes:
        reference = Reference.of(target, args.device, dtype)
        for drafter in args.drafters:
            checks.append(greedy_check(target, args.device, dtype, drafter, reference))
            print(checks[-1].line(), flush=True)
        if run_tp:
            checks.append(tp_check(target, args.device, dtype, work, reference))
            print(checks[-1].line(), flush=True)
    if not run_tp:
        print(f"SKIP  tp=2 (--tp {args.tp}, {gpus} GPU(s) visible)")
    failed = [c for c in checks if not c.ok]
    print(
        f"gpu_smoke: {len(checks) - len(failed)} passed, {len(failed)} failed on {args.device} "
        f"({', '.join(args.dtypes)}) in {time.perf_counter() - started:.0f}s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
