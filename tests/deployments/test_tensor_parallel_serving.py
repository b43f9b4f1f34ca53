"""TP=2 on Ray Serve: two shard actors in one STRICT_PACK placement group serve what TP=1 serves."""

from __future__ import annotations

import openai
import pytest
from ray import serve
from serving import app_args

from deployments.app import build_app

PROMPTS = ["def wrap(text, width):", "import bisect\n"]


@pytest.mark.slow
def test_tp2_greedy_equals_tp1(serve_stack):
    serve.run(
        build_app(app_args(serve_stack.model_dir, tensor_parallel_size=2, num_replicas=1)),
        name="tp",
        route_prefix="/tp",
    )
    try:
        tp1 = openai.OpenAI(base_url=serve_stack.http_url + "/v1", api_key="x", max_retries=0, timeout=60)
        tp2 = openai.OpenAI(base_url=serve_stack.http_url + "/tp/v1", api_key="x", max_retries=0, timeout=60)
        kwargs = dict(
            model=serve_stack.model_name, max_tokens=32, temperature=0, extra_body={"ignore_eos": True}
        )
        for prompt in PROMPTS:
            one = tp1.completions.create(prompt=prompt, **kwargs).choices[0].text
            two = tp2.completions.create(prompt=prompt, **kwargs).choices[0].text
            assert two == one, prompt
        streamed = "".join(
            c.choices[0].text for c in tp2.completions.create(prompt=PROMPTS[0], stream=True, **kwargs)
        )
        assert streamed == tp1.completions.create(prompt=PROMPTS[0], **kwargs).choices[0].text
    finally:
        serve.delete("tp")
