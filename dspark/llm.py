"""LLM: the offline entry point, `LLM(model=...).generate(prompts, params)` as in vLLM."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq

from tqdm import tqdm

from dspark.config import EngineConfig
from dspark.engine import Engine
from dspark.outputs import RequestOutput
from dspark.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **engine_options) -> None:
        self.engine = Engine(EngineConfig(model=model, **engine_options))

    def generate(
        self,
        prompts: str | Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt; requests join as KV space frees up and results keep input order.

        A request the engine had to stop comes back with finish_reason "error" and its `error`; the
        others are unaffected."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, Seq) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("params: need one SamplingParams per prompt")
        engine = self.engine
        # Validate everything before running anything, so a bad prompt fails the call up front.
        token_lists = [engine.tokenize(p) for p in prompts]
        pending = deque(range(len(prompts)))
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(prompts), disable=not use_tqdm, desc="generate")
        while pending or engine.has_unfinished():
            while pending and engine.can_admit(
                len(token_lists[pending[0]]) + params_list[pending[0]].max_tokens
            ):
                i = pending.popleft()
                engine.add_request(prompts[i], params_list[i], request_id=f"offline-{id(self)}-{i}")
            if not engine.has_unfinished():
                # Nothing runs and the head still does not fit: add_request raises the precise reason.
                engine.add_request(prompts[pending[0]], params_list[pending[0]])
            for out in engine.step():
                if out.finished:
                    results[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [results[f"offline-{id(self)}-{i}"] for i in range(len(prompts))]
