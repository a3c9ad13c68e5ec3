"""Tiny random models of every family speclane serves, made by the installed transformers.

``FAMILIES`` maps a family's test name to a factory of its transformers model (float32,
a few layers of width 64, 256 tokens); ``save_family`` builds one, draws its weights wide
(``widen``) and saves it with ``save_pretrained`` and a word-level tokenizer, so speclane
reads it as it reads a Hub folder. Every family's heads are 32 wide: the smallest shape
our bfloat16 attention kernel takes, so bfloat16 tests run the kernel on every layer.

The weights are drawn wider than transformers' initializer (std 0.02 gives near-tied
logits a float32 reordering could flip), so the logits spread over several units and a
wrong norm, rope base, window or scale moves them by order 1.

Shared by the tests that compare a family with transformers (``test_families.py``,
``test_family_gguf.py``) and the ones that run speculation, MTP training and the server
on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
              max_position_embeddings=128)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

FAMILIES = {
    "llama3-tied": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **COMMON, num_hidden_layers=2, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=True)),
    "llama3-untied": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **COMMON, num_hidden_layers=2, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=False)),
    "llama-attention-bias": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(  # q, k, v and o biases
        **COMMON, num_hidden_layers=2, attention_bias=True)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **COMMON, num_hidden_layers=2, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **COMMON, num_hidden_layers=2, sliding_window=6)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **{**COMMON, "max_position_embeddings": 256}, num_hidden_layers=2, original_max_position_embeddings=64,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0 + 0.1 * i for i in range(16)],
                         "long_factor": [2.0 + 0.5 * i for i in range(16)]},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **COMMON, num_hidden_layers=4, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **COMMON, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=16, sliding_window=8,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
}


def architecture(name: str) -> str:
    """The architecture speclane reads from family ``name``'s files."""
    return "llama" if name.startswith("llama") else name


def widen(model: torch.nn.Module) -> None:
    """Weights drawn wider than transformers' initializer; norm weights around their neutral value."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer over the model's ids ("t0" .. "t255"); t2 ends a sequence."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t2", "bos_token": "t1"}))


@dataclass(frozen=True)
class ChatFormat:
    """A family's chat layout as its Hub folders have it: special tokens (the first ids),
    the words its template writes, the end tokens, the template (tokenizer_config.json's)."""

    specials: tuple[str, ...]
    words: tuple[str, ...]
    eos: str
    end_of_turn: str
    template: str
    bos: str | None = None


CHAT_FORMATS = {
    # gemma-3-*-it: eos_token <eos>; a turn ends with <end_of_turn> (its generation_config
    # lists both; the folder here keeps save_pretrained's, which names <eos> only).
    "gemma3": ChatFormat(
        specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"), words=("user", "model"),
        eos="<eos>", bos="<bos>", end_of_turn="<end_of_turn>",
        template="{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
                 "else m['role']) + '\n' + m['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
    # A Qwen base folder (Qwen2.5-*, Qwen3-*-Base): eos_token <|endoftext|>, ChatML turns
    # ending with <|im_end|>.
    "qwen3": ChatFormat(
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), words=("system", "user", "assistant"),
        eos="<|endoftext|>", end_of_turn="<|im_end|>",
        template="{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
}


def save_chat_tokenizer(path: Path, name: str, *, template: bool = True) -> ChatFormat:
    """A word-level tokenizer with the chat layout of ``CHAT_FORMATS[name]``: its special
    tokens and template words first, then "t{id}" words up to ``VOCAB``; its chat template
    in tokenizer_config.json unless ``template`` is false."""
    chat = CHAT_FORMATS[name]
    named = chat.specials + chat.words
    vocab = {token: i for i, token in enumerate(named)} | {f"t{i}": i for i in range(len(named), VOCAB)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=named[0]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in chat.specials])
    tok.save(str(path / "tokenizer.json"))
    config = {"eos_token": chat.eos, "bos_token": chat.bos} | ({"chat_template": chat.template} if template else {})
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return chat


def make_family(name: str) -> torch.nn.Module:
    """The family's transformers model, float32, weights drawn by ``widen``."""
    torch.manual_seed(0)
    hf = FAMILIES[name]().float().eval()
    widen(hf)
    return hf


def save_family(name: str, path: Path) -> torch.nn.Module:
    """``make_family`` saved in ``path`` with ``save_tokenizer``'s tokenizer; returns the model."""
    hf = make_family(name)
    hf.save_pretrained(path)
    save_tokenizer(path)
    return hf
