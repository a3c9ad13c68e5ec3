"""The tokens that end a chat turn, and the chat template, of a family's files.

A Hugging Face folder may name only ``<eos>`` (Gemma) or ``<|endoftext|>`` (a Qwen base
model) as its end token while its chat template closes every turn with ``<end_of_turn>``
or ``<|im_end|>``. Generation stops on those special tokens all the same
(``tokenizer.END_OF_TURN_TOKENS``; a GGUF without ``eot_token_id``: ``test_tokenizer.py``),
and a Gemma folder without a template gets Gemma's, as a Gemma GGUF does.
"""

from __future__ import annotations

import json

import pytest

from family_models import CHAT_FORMATS, save_chat_tokenizer
from speclane.models.tokenizer import GEMMA_TEMPLATE, Tokenizer

tokenizers = pytest.importorskip("tokenizers")


@pytest.mark.parametrize("name", list(CHAT_FORMATS))
def test_the_end_of_turn_token_ends_generation(tmp_path, name):
    chat = save_chat_tokenizer(tmp_path, name)
    tok = Tokenizer.from_hf_folder(tmp_path)
    eos, end_of_turn = tok.token_to_id(chat.eos), tok.token_to_id(chat.end_of_turn)
    assert tok.eos_token_id == eos and tok.eos_token_ids == {eos, end_of_turn}
    prompt = tok.apply_chat_template([{"role": "user", "content": "t10 t11"}])
    ids = tok.encode(prompt)
    assert ids.count(end_of_turn) == 1 and {10, 11} <= set(ids) and 0 not in ids  # every word known


def test_a_plain_word_spelt_like_an_end_token_ends_nothing(tmp_path):
    vocab = {"<eos>": 0, "<end_of_turn>": 1, "<|im_end|>": 2, "t3": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t3"))
    backend.add_special_tokens([tokenizers.AddedToken("<eos>", special=True)])
    backend.add_tokens([tokenizers.AddedToken("<|im_end|>", special=False)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    assert Tokenizer.from_hf_folder(tmp_path).eos_token_ids == {0}


@pytest.mark.parametrize(("name", "model_type", "expected"), [
    ("gemma3", "gemma3_text", GEMMA_TEMPLATE), ("gemma3", "gemma2", GEMMA_TEMPLATE), ("qwen3", "qwen3", None)])
def test_a_folder_without_a_chat_template(tmp_path, name, model_type, expected):
    """Gemma's template for a Gemma folder; None (ChatML when rendering) for the others."""
    save_chat_tokenizer(tmp_path, name, template=False)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    assert tok.chat_template == expected
    prompt = tok.apply_chat_template([{"role": "user", "content": "t10"}])
    assert prompt.endswith("<start_of_turn>model\n" if expected else "<|im_start|>assistant\n")
