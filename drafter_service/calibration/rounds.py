"""Running a drafter inside the engine and recording every verify round: the raw material of
acceptance metrics (tau, per-position acceptance, prefix survival) and of confidence calibration."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark import LLM, SamplingParams


@dataclass
class RoundLog:
    gamma: int
    verified: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    confidence_logits: list[list[float]] = field(default_factory=list)  # padded with 0 to gamma

    def observe(self, seq, proposal, num_verified: int, verdict) -> None:
        if num_verified == 0:
            return  # nothing drafted (e.g. one token left): not a speculation round
        self.verified.append(num_verified)
        self.accepted.append(verdict.num_accepted)
        raw = proposal.confidence_logits
        row = raw[:num_verified].tolist() if raw is not None else []
        self.confidence_logits.append(row + [0.0] * (self.gamma - len(row)))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.tensor(self.confidence_logits),
            torch.tensor(self.accepted),
            torch.tensor(self.verified),
        )

    def acceptance(self) -> dict:
        """tau over full-length rounds, conditional acceptance and prefix survival by position."""
        verified, accepted = torch.tensor(self.verified), torch.tensor(self.accepted)
        by_position, survival = [], []
        for k in range(1, self.gamma + 1):
            reached = (verified >= k) & (accepted >= k - 1)  # slot k was verified and its prefix accepted
            by_position.append(
                float((accepted[reached] >= k).float().mean()) if reached.any() else float("nan")
            )
            full = verified >= k
            survival.append(float((accepted[full] >= k).float().mean()) if full.any() else float("nan"))
        full_rounds = verified == self.gamma  # rounds cut short by max_tokens would understate tau
        return {
            "tau": float((accepted[full_rounds] + 1).float().mean()) if full_rounds.any() else 0.0,
            "rounds": len(accepted),
            "accept_by_position": by_position,
            "prefix_survival": survival,
        }


def run_rounds(
    target_dir: str,
    drafter: str,
    prompts: list[str],
    params: SamplingParams,
    gamma: int,
    drafter_model: str | None = None,
    llm: LLM | None = None,
) -> RoundLog:
    """Generate for every prompt with a fixed verify length gamma, logging every round."""
    options = {"drafter_model": drafter_model} if drafter_model else {}
    llm = llm or LLM(
        target_dir,
        drafter=drafter,
        num_speculative_tokens=gamma,
        scheduler="fixed",  # acceptance is measured on full blocks
        max_num_seqs=16,
        kv_cache_memory_mb=256,
        **options,
    )
    log = RoundLog(gamma)
    llm.engine.round_observers.append(log.observe)
    try:
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.round_observers.remove(log.observe)
    return log
