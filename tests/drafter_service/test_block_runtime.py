"""The block drafter's serving runtime: a batch drafts what each of its requests drafts alone."""

from __future__ import annotations

import torch
from test_block_drafter import GAMMA, D, make

from drafter_service.runtime.block import BlockDraftRuntime
from dspark.drafter import DraftRequest
from dspark.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


def runtime_with(contexts: dict[str, int], hidden: dict[str, torch.Tensor]) -> BlockDraftRuntime:
    runtime = BlockDraftRuntime.of(make(), GAMMA)
    for seq_id, n in contexts.items():
        # Context arrives in pieces, as prefill chunks and accepted tokens do.
        cut = n // 2
        runtime.add_context(seq_id, list(range(cut)), hidden[seq_id][:cut])
        runtime.add_context(seq_id, list(range(cut, n)), hidden[seq_id][cut:])
    return runtime


def test_a_batch_of_different_lengths_drafts_as_each_request_alone():
    contexts = {"a": 5, "b": 9, "c": 3, "d": 7}
    gen = torch.Generator().manual_seed(0)
    hidden = {s: torch.randn(n, 2 * D, generator=gen) for s, n in contexts.items()}
    alone = {}
    for s, n in contexts.items():
        runtime = runtime_with({s: n}, hidden)
        alone[s] = runtime.propose([DraftRequest(s, list(range(n + 1)), GAMMA, GREEDY, None)])[0]
    runtime = runtime_with(contexts, hidden)
    runtime.release("a")  # a hole: slot 0 is free, so b, c, d are read by gathering their rows
    for order in (["d", "b", "c"], ["b", "c", "d"]):
        requests = [
            DraftRequest(s, list(range(contexts[s] + 1)), GAMMA - (s == "c"), GREEDY, None) for s in order
        ]
        for s, proposal in zip(order, runtime.propose(requests)):
            n = GAMMA - (s == "c")
            assert proposal.token_ids == alone[s].token_ids[:n]
            torch.testing.assert_close(proposal.confidence, alone[s].confidence[:n])
    runtime.add_context("a", list(range(contexts["a"])), hidden["a"])  # back in the lowest slot: consecutive
    requests = [DraftRequest(s, list(range(contexts[s] + 1)), GAMMA, GREEDY, None) for s in "abcd"]
    for s, proposal in zip("abcd", runtime.propose(requests)):
        assert proposal.token_ids == alone[s].token_ids
