"""The frozen target's states for drafter training, computed on the fly (never cached to disk).

Raw outputs of chosen decoder layers (forward hooks, so the last layer is also raw, exactly what the
engine's taps give at serving time; -1 is the embedding output) and the target's next-token
distributions at temperature 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM


@dataclass
class TargetStates:
    hidden: dict[int, torch.Tensor]  # layer -> [B, L, D] raw layer output
    probs: torch.Tensor  # [B, L, V]: row t is p_target(x_{t+1} | x_{<=t}) at temperature 1

    def taps(self, layer_ids) -> torch.Tensor:
        return torch.cat([self.hidden[i] for i in layer_ids], dim=-1).float()

    def rows(self, n: int) -> TargetStates:
        """The states of the first n sequences of the batch."""
        return TargetStates({i: h[:n] for i, h in self.hidden.items()}, self.probs[:n])


class FrozenTarget:
    def __init__(self, target_dir: str, layer_ids: set[int]) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        self.model.requires_grad_(False)
        self.layer_ids = sorted(layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        for i in self.layer_ids:
            # Layer -1 is the embedding output, as the engine's tap -1 (DeepSpec's convention).
            module = self.model.model.embed_tokens if i == -1 else self.model.model.layers[i]
            module.register_forward_hook(self._hook(i))

    def _hook(self, layer: int):
        def capture(_module, _inputs, output):
            self._captured[layer] = output[0] if isinstance(output, tuple) else output

        return capture

    @property
    def embed(self) -> torch.nn.Embedding:
        return self.model.model.embed_tokens

    @property
    def lm_head(self) -> torch.nn.Linear:
        return self.model.lm_head

    @torch.no_grad()
    def states(self, tokens: torch.Tensor, lengths: torch.Tensor) -> TargetStates:
        mask = (torch.arange(tokens.shape[1])[None] < lengths[:, None]).long()
        logits = self.model(input_ids=tokens, attention_mask=mask).logits.float()
        hidden = {i: self._captured[i].detach() for i in self.layer_ids}
        self._captured.clear()
        return TargetStates(hidden, logits.softmax(-1))
