"""Byte-level BPE tokenizer for the demo stack, saved in Hugging Face format.

Byte-level BPE (GPT-2 / Qwen style) encodes any string, so every text round-trips exactly and no
``<unk>`` exists. The vocabulary is 8192 entries: the target's tied embedding/LM head costs
``vocab x hidden`` parameters *and* one ``hidden x vocab`` matmul per token, which for a ~10M-parameter
model on a CPU budget would dominate at 32k+ (Qwen's 151k is out of the question); below ~4k the stdlib's
identifiers and indentation runs split into many more tokens, so each training step sees less text and
drafters must guess more tokens per word. 8192 keeps the head at ~30 % of the model and still merges
common keywords, identifiers and indentation into single tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 8192
EOS_TOKEN = "<|endoftext|>"  # End of document; also bos and pad, as in GPT-2/Qwen.
MASK_TOKEN = "<|mask|>"  # Reserved for DSpark/DFlash drafters' block slots; never in training text.
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Order fixes the ids: eos is 0 and mask 1 on every build.
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN, IM_START, IM_END)

# ChatML, as Qwen uses, so chat requests render the way users of Qwen-family targets expect.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = VOCAB_SIZE, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a Hugging Face fast tokenizer."""
    tok = Tokenizer(models.BPE())
    # No prefix space: a leading space would change the text, and exact round-trips are required.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes up front, so text unseen in training (any script, any emoji) still encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Hugging Face wrapper with the kit's special tokens and chat template."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        # Cleaning up spaces around punctuation would break exact round-trips of code.
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (with the chat template) and friends to ``out_dir``."""
    tokenizer.save_pretrained(str(out_dir))
