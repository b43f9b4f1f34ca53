"""A drafter's configuration: config.json exactly as DeepSpec writes it, read strictly.

DeepSpec (github.com/deepseek-ai/DeepSpec at afdfa7c9382a3341a3e6f17756dd816da79f132c) builds a
drafter's config by copying the target's Qwen3 config and setting the drafter's own fields
(`build_draft_config`), then writes it with transformers' `save_pretrained`. A config.json therefore
holds three kinds of field, and every field is one of them:
- the drafter's shape and math, which are read (`_SHAPE`, `_BLOCK`, `_CHAIN`);
- fields inherited from the target that change nothing at inference (`INERT`): kept, never used;
- fields whose other values would change the math in ways not implemented here (`ONLY`): checked.
Any other field, an unknown `architectures` entry or `markov_head_type`, is refused by name: a field
we do not know may change the math. Nothing is defaulted: what DeepSpec writes must be there.

What is ours and not DeepSpec's (the drafter's kind among ours, STS temperatures, training
provenance) lives in files beside config.json (extras.py); DeepSpec and SGLang never read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dspark.errors import ModelLoadError

BLOCK_ARCHITECTURE = "Qwen3DSparkModel"  # DSpark, and DFlash (no Markov head, no confidence head)
CHAIN_ARCHITECTURE = "Qwen3Eagle3Model"  # EAGLE-3, and MTP-1 (one chain step from the last layer)
KINDS = {"dspark": BLOCK_ARCHITECTURE, "dflash": BLOCK_ARCHITECTURE, "eagle3": CHAIN_ARCHITECTURE,
         "mtp1": CHAIN_ARCHITECTURE}  # fmt: skip
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")

_SHAPE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "intermediate_size", "rms_norm_eps", "rope_parameters", "max_position_embeddings",
          "num_target_layers", "target_layer_ids")  # fmt: skip
_BLOCK = ("block_size", "mask_token_id", "num_anchors", "enable_confidence_head", "markov_rank")
_CHAIN = ("ttt_length", "step_loss_decay")
# Copied from the target by DeepSpec and written back by us; no effect on inference.
INHERITED = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "attention_dropout",
             "max_window_layers", "sliding_window", "use_cache")  # fmt: skip
INERT = set(INHERITED) | {"model_type", "architectures", "transformers_version", "dtype", "torch_dtype",
    "tie_word_embeddings", "layer_types", "_name_or_path", "output_attentions", "output_hidden_states",
    "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id",
    "problem_type"}  # fmt: skip
# Fields that would change the math: only these values are implemented.
ONLY = {"model_type": ("qwen3",), "attention_bias": (False,), "mlp_bias": (False,),
        "hidden_act": ("silu",), "use_sliding_window": (False,)}  # fmt: skip
_TYPES = {name: int for name in _SHAPE + _BLOCK + _CHAIN} | {
    "rms_norm_eps": (int, float), "step_loss_decay": (int, float), "rope_parameters": dict,
    "target_layer_ids": list, "enable_confidence_head": bool}  # fmt: skip


@dataclass
class DrafterConfig:
    """The drafter's shape and math under DeepSpec's field names (config.json), plus our extras."""

    kind: str  # dspark | dflash | eagle3 | mtp1: which of our drafters (not a config.json field)
    vocab_size: int
    hidden_size: int  # the target's: embeddings and LM head are the target's own
    num_hidden_layers: int  # draft layers
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_parameters: dict  # transformers' RoPE parameters, as the target's (rope_type, rope_theta, ...)
    max_position_embeddings: int
    num_target_layers: int
    target_layer_ids: list[int]  # fused target layers; -1 is the embedding output
    # Block drafters (Qwen3DSparkModel).
    block_size: int = 7  # gamma: slots per block
    mask_token_id: int | None = None
    num_anchors: int = 0  # training only: blocks sampled per sequence
    markov_rank: int = 0  # 0: no Markov head
    markov_head_type: str | None = None  # vanilla | gated | rnn when markov_rank > 0
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False  # the confidence head also reads W1[previous token]
    # Chain drafters (Qwen3Eagle3Model): chain length = training-time-test steps, as DeepSpec drafts.
    ttt_length: int = 1
    step_loss_decay: float = 0.8
    # The target's inert fields, copied through as DeepSpec's copy keeps them (no part of equality).
    inherited: dict = field(default_factory=dict, compare=False)
    # Ours, from files beside config.json (extras.py): serving temperature -> gamma STS temperatures.
    sts_temperatures: dict[float, list[float]] = field(default_factory=dict)
    training: dict = field(default_factory=dict)  # provenance: steps, wall time, data, losses

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ModelLoadError(f"unknown drafter kind {self.kind!r}; known: {sorted(KINDS)}")
        ids = self.target_layer_ids
        if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
            raise ModelLoadError(f"target_layer_ids {ids} must be integers")
        if not ids or any(not (i == -1 or 0 <= i < self.num_target_layers) for i in ids):
            raise ModelLoadError(
                f"target_layer_ids {ids} must be non-empty, each -1 (the embedding output) or a layer "
                f"in [0, {self.num_target_layers - 1}] (num_target_layers {self.num_target_layers})"
            )
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise ModelLoadError(f"target_layer_ids {ids} must be strictly increasing")
        if self.is_block:
            self._check_block()
        else:
            self._check_chain()

    def _check_block(self) -> None:
        if self.mask_token_id is None or not 0 <= self.mask_token_id < self.vocab_size:
            raise ModelLoadError(
                f"mask_token_id {self.mask_token_id} must be a token id below {self.vocab_size}"
            )
        if self.block_size < 1 or self.markov_rank < 0:
            raise ModelLoadError(
                f"block_size {self.block_size} / markov_rank {self.markov_rank} out of range"
            )
        if self.markov_rank > 0 and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ModelLoadError(
                f"markov_head_type {self.markov_head_type!r} is not supported; "
                f"supported: {list(MARKOV_HEAD_TYPES)}"
            )
        if self.confidence_head_with_markov and not (self.enable_confidence_head and self.markov_rank > 0):
            raise ModelLoadError(
                "confidence_head_with_markov needs enable_confidence_head and markov_rank > 0"
            )
        plain = self.markov_rank == 0 and not self.enable_confidence_head
        if plain != (self.kind == "dflash"):
            raise ModelLoadError(
                f"a {self.kind!r} drafter has markov_rank {self.markov_rank} and enable_confidence_head "
                f"{self.enable_confidence_head}: DFlash is exactly the one with neither"
            )

    def _check_chain(self) -> None:
        if self.num_hidden_layers != 1:
            raise ModelLoadError(f"num_hidden_layers {self.num_hidden_layers}: chain drafters have one layer")
        if self.ttt_length < 1 or (self.kind == "mtp1" and self.ttt_length != 1):
            raise ModelLoadError(f"ttt_length {self.ttt_length} out of range for a {self.kind!r} drafter")

    @classmethod
    def for_target(cls, target, kind: str, **fields) -> DrafterConfig:
        """As DeepSpec's `build_draft_config`: the target's shape, RoPE and token ids (`target`: its
        transformers config), then the drafter's own fields, which may override the shape."""
        shape = dict(
            vocab_size=target.vocab_size,
            hidden_size=target.hidden_size,
            num_hidden_layers=1,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=getattr(target, "head_dim", None) or target.hidden_size // target.num_attention_heads,
            intermediate_size=target.intermediate_size,
            rms_norm_eps=target.rms_norm_eps,
            rope_parameters=dict(target.rope_parameters),
            max_position_embeddings=target.max_position_embeddings,
            num_target_layers=target.num_hidden_layers,
        )
        inherited = {k: getattr(target, k) for k in INHERITED if getattr(target, k, None) is not None}
        return cls(kind, **{**shape, **fields}, inherited=inherited)

    @property
    def is_block(self) -> bool:
        return KINDS[self.kind] == BLOCK_ARCHITECTURE

    @property
    def draft_length(self) -> int:
        """The most tokens one proposal drafts: gamma for a block drafter, the chain length otherwise."""
        return self.block_size if self.is_block else self.ttt_length

    # ---- config.json ------------------------------------------------------------------------------

    def to_config_json(self, dtype: str) -> dict:
        """config.json as DeepSpec's `save_pretrained` writes it: a Qwen3 config with the drafter's fields."""
        from transformers import Qwen3Config

        hf = Qwen3Config(
            **{name: getattr(self, name) for name in _SHAPE[:-2]},
            **{k: v for k, v in self.inherited.items() if k in INHERITED},
            layer_types=["full_attention"] * self.num_hidden_layers,
            attention_bias=False,
            hidden_act="silu",
            tie_word_embeddings=False,
        )
        hf.architectures = [KINDS[self.kind]]
        hf.num_target_layers = self.num_target_layers
        hf.target_layer_ids = list(self.target_layer_ids)
        if self.is_block:
            for name in _BLOCK:
                setattr(hf, name, getattr(self, name))
            if self.enable_confidence_head:  # DeepSpec sets these two only when they apply
                hf.confidence_head_with_markov = self.confidence_head_with_markov
            if self.markov_rank > 0:
                hf.markov_head_type = self.markov_head_type
        else:
            hf.ttt_length, hf.step_loss_decay = self.ttt_length, self.step_loss_decay
            hf.draft_num_hidden_layers = self.num_hidden_layers
        hf.dtype = dtype
        return json.loads(hf.to_json_string(use_diff=True))

    @classmethod
    def from_config_json(cls, raw: dict, kind: str | None = None) -> DrafterConfig:
        """Read config.json; `kind` (from our extras) tells MTP-1 from EAGLE-3, else it is derived."""
        block = _check_fields(raw)
        fields_ = {name: raw[name] for name in _SHAPE + (_BLOCK if block else _CHAIN)}
        if block:
            if raw["enable_confidence_head"]:
                fields_["confidence_head_with_markov"] = raw["confidence_head_with_markov"]
            if raw["markov_rank"] > 0:
                fields_["markov_head_type"] = raw["markov_head_type"]
            plain = raw["markov_rank"] == 0 and not raw["enable_confidence_head"]
            kind = kind or ("dflash" if plain else "dspark")
        kind = kind or "eagle3"
        if KINDS.get(kind) != raw["architectures"][0]:
            raise ModelLoadError(f"a {kind!r} drafter cannot be a {raw['architectures'][0]}")
        inherited = {k: raw[k] for k in INHERITED if k in raw}
        return cls(kind, **fields_, inherited=inherited)


def _check_fields(raw: dict) -> bool:
    """Refuse, by name, what config.json lacks or what this loader does not implement; True for a
    block drafter (Qwen3DSparkModel), False for a chain drafter (Qwen3Eagle3Model)."""
    architectures = raw.get("architectures")
    if architectures not in ([BLOCK_ARCHITECTURE], [CHAIN_ARCHITECTURE]):
        raise ModelLoadError(
            f"architectures {architectures!r} is not supported; supported: "
            f"[{BLOCK_ARCHITECTURE!r}] (DSpark, DFlash), [{CHAIN_ARCHITECTURE!r}] (EAGLE-3) "
            "(Gemma4 drafters are not)"
        )
    block = architectures == [BLOCK_ARCHITECTURE]
    for name, allowed in ONLY.items():
        if name in raw and raw[name] not in allowed:
            raise ModelLoadError(f"{name} {raw[name]!r} is not supported (only {list(allowed)})")
    own = _BLOCK if block else _CHAIN
    # Set only when they apply (DSpark), or provenance and a checked copy (EAGLE-3).
    optional = {"confidence_head_with_markov", "markov_head_type"} if block else {
        "target_model_name_or_path", "draft_num_hidden_layers"}  # fmt: skip
    unknown = sorted(set(raw) - set(_SHAPE) - set(own) - INERT - set(ONLY) - optional)
    if unknown:
        raise ModelLoadError(
            f"config.json has fields this loader does not implement: {unknown} (refused rather than ignored)"
        )
    missing = [name for name in (*_SHAPE, *own, "model_type", "layer_types") if name not in raw]
    if missing:
        raise ModelLoadError(f"config.json lacks {missing}")
    for name in _SHAPE + own:
        value, expected = raw[name], _TYPES[name]
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ModelLoadError(f"{name} {value!r} must be of type {expected}")
    if raw["layer_types"] != ["full_attention"] * raw["num_hidden_layers"]:
        raise ModelLoadError(f"layer_types {raw['layer_types']} is not supported (full_attention only)")
    rope = raw["rope_parameters"]
    if "rope_type" not in rope or rope.get("rope_theta") is None:
        raise ModelLoadError(f"rope_parameters {rope!r} must give rope_type and rope_theta")
    if block:
        conditional = ["markov_head_type"] if raw["markov_rank"] > 0 else []
        conditional += ["confidence_head_with_markov"] if raw["enable_confidence_head"] else []
        missing = [name for name in conditional if name not in raw]
        if missing:
            raise ModelLoadError(f"config.json lacks {missing}")
        if raw["enable_confidence_head"] and not isinstance(raw["confidence_head_with_markov"], bool):
            raise ModelLoadError("confidence_head_with_markov must be true or false")
    elif raw.get("draft_num_hidden_layers", raw["num_hidden_layers"]) != raw["num_hidden_layers"]:
        raise ModelLoadError("draft_num_hidden_layers differs from num_hidden_layers")
    return block
