from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from drafter_service.demo import tokenizer as tk

SAMPLES = [
    "def f(x):\n    return x  +  1\t\n\n",
    "  leading and trailing spaces  ",
    "Unicode: héllo wörld — 你好 🙂\r\n",
    "",
    "a <|mask|> b<|endoftext|>",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_exact(small_tokenizer, text: str) -> None:
    ids = small_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert small_tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids(small_tokenizer) -> None:
    for token in tk.SPECIAL_TOKENS:
        assert small_tokenizer(token, add_special_tokens=False)["input_ids"] == [
            small_tokenizer.convert_tokens_to_ids(token)
        ]
    assert small_tokenizer.eos_token_id == 0 and small_tokenizer.mask_token_id == 1
    assert small_tokenizer.pad_token_id == small_tokenizer.bos_token_id == 0
    assert len(small_tokenizer) == 512


def test_training_is_deterministic(small_texts, small_tokenizer) -> None:
    again = tk.train_tokenizer(small_texts, vocab_size=512)
    assert again.get_vocab() == small_tokenizer.get_vocab()


def test_saved_tokenizer_loads_with_auto_and_chat_template(small_tokenizer, tmp_path: Path) -> None:
    tk.save_tokenizer(small_tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = SAMPLES[0] + SAMPLES[2]
    assert loaded(text)["input_ids"] == small_tokenizer(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert loaded.mask_token == tk.MASK_TOKEN and loaded.eos_token == tk.EOS_TOKEN
    chat = [{"role": "user", "content": "hi"}]
    rendered = loaded.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = loaded.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == loaded.convert_tokens_to_ids(tk.IM_START)
