"""A STAND-IN for SGLang's engine: SGLang's GPU engine cannot run on these CPU machines, so the SGLang
replica's Serve plumbing is tested against this class, which implements the contract of SGLang 0.5.23's
`sglang.Engine` that the replica relies on (sglang/srt/entrypoints/engine.py, managers/tokenizer_manager.py,
managers/scheduler_components/internal_state.py), as /work/notes/sglang.md and SGLang's source state it:

- constructed with ServerArgs keyword arguments, checked by SGLang's real `ServerArgs` (an unknown one
  raises TypeError as the real Engine does);
- `await async_generate(input_ids=..., sampling_params=..., stream=True, rid=...)` returns an async
  generator of CUMULATIVE chunks {"text", "output_ids", "meta_info"}; output_ids is one live list that
  keeps growing (not a copy); a verify round commits several tokens at once; a consumer that falls behind
  gets the latest state only; finish_reason is None until the last chunk; the spec_* counters come on the
  last chunk only;
- `tokenizer_manager.abort_request(rid)` aborts every running request whose rid STARTS WITH rid (as the
  scheduler matches), ending its stream with finish_reason {"type": "abort"}; closing a stream aborts it;
- `tokenizer_manager.set_internal_state(SetInternalStateReq)` (SGLang's real request type) accepts
  `dspark_force_budget_frac` in (0, 1] or None under DSPARK, and reports it applied (True) where it
  changes nothing too: static mode, and compact mode without a profiled SPS table (judged by SGLang's
  own loader and is_uninitialized_sps_table), where SGLang verifies all (the replica must not be fooled);
- `get_loads()` answers SGLang's real `LoadSnapshot`s, `get_internal_state()` the resolved-arguments dict.

What it generates is made up (`expected_tokens`), deterministic, and decoded with the target's tokenizer.
Each verify round takes STEP_S seconds, standing in for GPU time, so that streams are in flight long
enough to be aborted. It records what it saw (`seen`) for in-process tests.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from tests.sglang_cpu import install_torchvision_stand_in

STEP_S = 0.02
ACCEPT_PATTERN = (3, 1, 4, 0, 2)  # drafts accepted in successive rounds, capped by the verify window


def expected_tokens(input_ids: list[int], n: int, vocab_size: int) -> list[int]:
    """What the stand-in generates after `input_ids` (greedy or not: it has no model)."""
    start = sum(input_ids)
    return [(start + 7 * i + 3) % vocab_size for i in range(n)]


@dataclass
class Seen:
    requests: list[dict] = field(default_factory=list)  # async_generate's arguments
    aborts: list[str] = field(default_factory=list)  # rids passed to abort_request
    aborted: list[str] = field(default_factory=list)  # rids that ended aborted
    internal_state_requests: list = field(default_factory=list)


class _ModelConfig:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size


class StandInTokenizerManager:
    def __init__(self, engine: StandInEngine) -> None:
        self.engine = engine
        self.context_len = engine.context_len
        self.model_config = _ModelConfig(engine.vocab_size)
        self.gracefully_exit = False

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        if not abort_all and not rid:
            return  # SGLang ignores an empty rid: it would match every request
        self.engine.seen.aborts.append(rid)
        for running, state in self.engine.running.items():
            if abort_all or running.startswith(rid):
                state["abort"] = True

    async def get_loads(self, include=None, dp_rank=None) -> list:
        from sglang.srt.managers.load_snapshot import LoadSnapshot

        running = self.engine.running.values()
        used = sum(len(s["input_ids"]) + len(s["output_ids"]) for s in running)
        return [
            LoadSnapshot(
                num_running_reqs=len(running),
                num_used_tokens=used,
                max_total_num_tokens=self.engine.kv_tokens,
                max_running_requests=self.engine.max_running,
                token_usage=used / self.engine.kv_tokens,
            )
        ]

    async def get_internal_state(self) -> list[dict]:
        engine = self.engine
        state = {
            "speculative_algorithm": engine.algorithm,
            "speculative_num_draft_tokens": engine.gamma + 1 if engine.algorithm else None,
            "max_running_requests": engine.max_running,
            "last_gen_throughput": 0.0,
            "effective_max_running_requests_per_dp": engine.max_running,
        }
        if engine.verify_ct:
            state["avg_spec_accept_length"] = engine.committed / engine.verify_ct
        return [state]

    async def set_internal_state(self, obj) -> list[bool]:
        from sglang.srt.managers.io_struct import SetInternalStateReq

        assert isinstance(obj, SetInternalStateReq), f"SGLang takes a SetInternalStateReq, got {obj!r}"
        self.engine.seen.internal_state_requests.append(dict(obj.server_args))
        for key, value in obj.server_args.items():
            if key != "dspark_force_budget_frac" or self.engine.algorithm != "DSPARK":
                return [False]  # "Updating X is not supported." / "requires a DSpark draft worker."
            if value is not None and not 0.0 < float(value) <= 1.0:
                return [False]
        self.engine.forced_frac = obj.server_args["dspark_force_budget_frac"]
        return [True]


class StandInEngine:
    """Stand-in for sglang.Engine (see the module docstring)."""

    def __init__(self, **kwargs) -> None:
        install_torchvision_stand_in()
        from sglang.srt.server_args import ServerArgs
        from transformers import AutoTokenizer

        ServerArgs(**kwargs)  # the real Engine builds one first: unknown arguments fail the same way
        self.kwargs = kwargs
        self.verify_mode = os.environ.get("SGLANG_RAGGED_VERIFY_MODE", "static")
        self.schedules_budget = self.verify_mode == "compact" and _profiled(
            kwargs.get("speculative_dspark_sps_table_path")
        )
        self.algorithm = kwargs.get("speculative_algorithm")
        self.gamma = kwargs.get("speculative_dspark_block_size") or 7
        self.max_running = kwargs["max_running_requests"]
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs["model_path"])
        self.vocab_size = len(self.tokenizer)
        self.context_len = kwargs.get("context_length") or 512
        self.kv_tokens = 4096
        self.running: dict[str, dict] = {}
        self.forced_frac: float | None = None
        self.verify_ct = self.committed = 0
        self.seen = Seen()
        self.tokenizer_manager = StandInTokenizerManager(self)
        self.shut_down = False
        self.step_s = STEP_S

    async def async_generate(
        self, prompt=None, sampling_params=None, input_ids=None, *, stream=False, rid=None,
        external_trace_header=None, **unused,
    ):  # fmt: skip
        assert stream and input_ids is not None and rid is not None, "the replica streams token ids with rids"
        self.seen.requests.append(
            {
                "input_ids": list(input_ids),
                "sampling_params": dict(sampling_params),
                "rid": rid,
                "external_trace_header": external_trace_header,
            }  # fmt: skip
        )
        state = {"input_ids": list(input_ids), "output_ids": [], "text": "", "abort": False,
                 "updated": asyncio.Event()}  # fmt: skip
        self.running[rid] = state
        asyncio.get_running_loop().create_task(self._decode(rid, state, dict(sampling_params)))
        return self._stream(rid, state)

    def _window(self) -> int:
        if self.schedules_budget and self.forced_frac is not None:
            return max(0, int(self.forced_frac * self.gamma))
        return self.gamma

    async def _decode(self, rid: str, state: dict, params: dict) -> None:
        """The scheduler's side: verify rounds committing accepted drafts plus one token each."""
        target = expected_tokens(state["input_ids"], params["max_new_tokens"], self.vocab_size)
        out, rounds, correct, cap = state["output_ids"], 0, 0, 0
        while len(out) < len(target) and not state["abort"]:
            await asyncio.sleep(self.step_s)
            window = self._window() if self.algorithm else 0
            accepted = min(window, ACCEPT_PATTERN[rounds % len(ACCEPT_PATTERN)])
            out.extend(target[len(out) : len(out) + accepted + 1])  # the same list, growing
            rounds, correct, cap = rounds + 1, correct + accepted, cap + window + 1
            state["updated"].set()
        if self.algorithm:
            self.verify_ct += rounds
            self.committed += len(out)
        state["finish"] = {"type": "abort", "message": "Abort in waiting queue"} if state["abort"] else {
            "type": "length", "length": len(out)}  # fmt: skip
        state["spec"] = (rounds, correct, cap)
        state["updated"].set()

    async def _stream(self, rid: str, state: dict):
        try:
            while True:
                await state["updated"].wait()
                state["updated"].clear()
                finish = state.get("finish")
                meta = {
                    "id": rid,
                    "finish_reason": finish,
                    "prompt_tokens": len(state["input_ids"]),
                    "completion_tokens": len(state["output_ids"]),
                    "cached_tokens": 0,
                }
                if finish is not None:
                    meta["e2e_latency"] = 0.0
                    meta |= self._spec_meta(*state["spec"], len(state["output_ids"]))
                self._detokenize(state, final=finish is not None)
                if finish is not None and finish["type"] == "abort":
                    self.seen.aborted.append(rid)
                yield {"text": state["text"], "output_ids": state["output_ids"], "meta_info": meta}
                if finish is not None:
                    return
        finally:
            if "finish" not in state:  # the consumer left: SGLang aborts the request
                self.tokenizer_manager.abort_request(rid)
            self.running.pop(rid, None)

    def _detokenize(self, state: dict, final: bool) -> None:
        """Append-only text, as SGLang's detokenizer sends it: an incomplete UTF-8 tail waits."""
        text = self.tokenizer.decode(state["output_ids"])
        if not final:
            text = text.rstrip("\ufffd")
        if text.startswith(state["text"]):
            state["text"] = text

    def _spec_meta(self, rounds: int, correct: int, cap: int, completion: int) -> dict:
        if not self.algorithm or rounds == 0:
            return {}
        proposed = rounds * self.gamma
        meta = {
            "spec_verify_ct": rounds,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_accept_rate": correct / proposed,
            "spec_accept_length": completion / rounds,
        }
        if self.verify_mode != "static":
            meta["spec_cap_length"] = cap / rounds
        return meta

    def shutdown(self) -> None:
        self.shut_down = True


def _profiled(path: str | None) -> bool:
    """SGLang's planner (dspark_planner.py): no table or a flat one means verify-all, no budget."""
    if not path:
        return False
    from sglang.srt.speculative.dspark_components.dspark_sps import (
        SpsCostTable,
        is_uninitialized_sps_table,
        load_sps_table_from_path,
    )

    table = load_sps_table_from_path(path)
    return not (isinstance(table, SpsCostTable) and is_uninitialized_sps_table(table))
