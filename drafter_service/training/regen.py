"""Drafter training data: held-in prompts whose continuations the target itself regenerated.

The drafter must imitate the model it serves, so answers are sampled from the target at temperature 1
with our own engine (batched). Only token ids are kept; target states are recomputed while training.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from drafter_service.demo import corpus
from dspark import LLM, SamplingParams


@dataclass
class Regenerated:
    sequences: list[list[int]]  # prompt + regenerated answer
    answer_starts: list[int]  # index of the first answer token in each sequence
    domains: list[str]

    def save(self, path: Path) -> None:
        path.write_text(
            json.dumps(
                {"sequences": self.sequences, "answer_starts": self.answer_starts, "domains": self.domains}
            )
        )

    @classmethod
    def load(cls, path: Path) -> Regenerated:
        raw = json.loads(path.read_text())
        return cls(raw["sequences"], raw["answer_starts"], raw["domains"])

    def batch(self, indices: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens [B, L] right-padded, lengths [B], answer_starts [B])."""
        seqs = [self.sequences[i] for i in indices]
        tokens = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
        for row, s in enumerate(seqs):
            tokens[row, : len(s)] = torch.tensor(s)
        return (
            tokens,
            torch.tensor([len(s) for s in seqs]),
            torch.tensor([self.answer_starts[i] for i in indices]),
        )


def prompt_windows(
    texts: list[str], tokenizer, count: int, length: int, rng: random.Random
) -> list[list[int]]:
    """`count` prompts of `length` tokens, each from a random place in a random document."""
    docs = [d for d in texts if len(d) > length * 8]
    prompts = []
    while len(prompts) < count:
        doc = rng.choice(docs)
        start = rng.randrange(0, max(1, len(doc) - length * 8))
        line = doc.rfind("\n", 0, start) + 1  # begin at a line start, as a user's prompt would
        ids = tokenizer.encode(doc[line : line + length * 16], add_special_tokens=False)[:length]
        if len(ids) == length:
            prompts.append(ids)
    return prompts


def regenerate(
    target_dir: str,
    split: str,
    per_domain: int,
    prompt_tokens: int,
    answer_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> Regenerated:
    """Prompts from `split` of both domains, answered by the target itself."""
    llm = LLM(target_dir, max_num_seqs=32, kv_cache_memory_mb=256)
    rng = random.Random(seed)
    prompts, domains = [], []
    for domain in corpus.DOMAINS:
        windows = prompt_windows(
            corpus.documents(domain, split), llm.engine.tokenizer, per_domain, prompt_tokens, rng
        )
        prompts += windows
        domains += [domain] * len(windows)
    return answer_prompts(llm, prompts, domains, answer_tokens, temperature, seed)


def answer_prompts(
    llm: LLM,
    prompts: list[list[int]],
    domains: list[str],
    answer_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> Regenerated:
    """Each prompt continued by the target itself (seeded per prompt, so reruns agree)."""
    params = [
        SamplingParams(temperature=temperature, max_tokens=answer_tokens, seed=seed * 100003 + i)
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    sequences = [p + o.token_ids for p, o in zip(prompts, outputs)]
    return Regenerated(sequences, [len(p) for p in prompts], domains)
