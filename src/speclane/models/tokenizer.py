"""Text <-> token ids for the served model, and its chat template.

`Tokenizer` wraps a `tokenizers.Tokenizer` (the Rust library transformers uses) built either
from a GGUF file's metadata or from a Hugging Face folder's tokenizer.json, so ids match what
the model was trained on and what transformers / llama.cpp produce. It also renders chat
messages into a prompt with the model's jinja chat template, the way transformers does.

It holds no per-request state: streaming decode (holding back split characters and stop
strings) lives in `speclane.engine.detokenizer`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import numpy as np
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import (
    AddedToken,
    Regex,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

# llama.cpp's token types (tokenizer.ggml.token_type).
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# GPT-2's pre-tokenizer regex, which `pre_tokenizers.ByteLevel(use_regex=True)` applies.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre values (llama.cpp's names) grouped by how they pre-tokenize.
# GPT-2's regex alone.
_PRE_GPT2 = frozenset({"default", "gpt2", "gpt-2", "mpt", "olmo", "jais"})
# Every digit its own piece, then GPT-2's regex: llama.cpp runs "\p{N}" before the GPT-2
# regex for these, and SmolLM's own tokenizer.json has Digits(individual_digits=True)
# before ByteLevel, which splits the same way.
_PRE_DIGITS_THEN_GPT2 = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)
_PRE_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
SUPPORTED_GGUF_PRE_TOKENIZERS = tuple(sorted(_PRE_GPT2 | _PRE_DIGITS_THEN_GPT2 | set(_PRE_SPLITS)))

# Used when a model ships no chat template: plain ChatML, which most small chat models use.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# general.architecture values whose SentencePiece tokenizer is laid out like Gemma's.
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})
# Special tokens that end a chat turn or a text in the served families (Gemma, ChatML /
# Qwen, Llama 3, Phi-3): generation stops on them as on EOS, as llama.cpp's end-of-generation
# tokens do, whether or not the model's files list them among its end tokens (a GGUF without
# eot_token_id, a Hugging Face folder whose generation_config.json names only <eos>; a Llama
# 3.1 GGUF whose eos is <|eot_id|> also ends at <|end_of_text|> and <|eom_id|>, a Qwen2.5
# GGUF whose eos is <|im_end|> at <|endoftext|>).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>", "<|eom_id|>",
                      "<|endoftext|>")
# Byte-level pre-tokenizers whose words that are whole vocabulary entries are one token,
# whatever the merges would build (Llama 3's tokenizer.json, llama.cpp's "ignore_merges").
_IGNORE_MERGES_PRE = frozenset({"llama3", "llama-v3", "llama-bpe"})

# Gemma's instruction-tuned chat template (as in google/gemma-3-*-it), for Gemma GGUF files
# that carry no tokenizer.chat_template: a system message is prepended to the first user turn,
# the assistant's role is "model".
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set role = 'model' -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception('Invalid content type') }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)


class Tokenizer:
    """A model's tokenizer: encode, decode, special ids and chat template.

    Build it with `from_gguf_metadata` or `from_hf_folder`; the constructor takes an already
    configured `tokenizers.Tokenizer`.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int,
        extra_eos_token_ids: Iterable[int] = (),
        chat_template: str | None = None,
    ) -> None:
        """`backend` must be fully configured, including a post-processor that adds BOS
        when the model wants it; `eos_token_id` is the model's main end token and
        `extra_eos_token_ids` others that also end generation. The backend's special tokens
        of `END_OF_TURN_TOKENS` end generation too."""
        self._backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset({eos_token_id, *extra_eos_token_ids, *_end_of_turn_ids(backend)})
        self.chat_template = chat_template
        # Whether the backend's post-processor puts BOS first (the files ask for it).
        self.adds_bos = bos_token_id is not None and backend.encode("a", add_special_tokens=True).ids[:1] == [bos_token_id]
        # Templates see the special tokens by name, as transformers passes them.
        self._template_tokens = {
            "bos_token": self.id_to_token(bos_token_id) if bos_token_id is not None else None,
            "eos_token": self.id_to_token(eos_token_id),
        }

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, fields: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (key -> plain Python value, see `read_gguf_metadata`).

        Supports byte-level BPE (`tokenizer.ggml.model` 'gpt2': SmolLM, Llama 3, Qwen 2) and
        SentencePiece BPE ('llama': Llama 2, Mistral, Gemma), built the way transformers'
        GGUF loader builds them so ids match token for token.
        """
        model = fields.get("tokenizer.ggml.model")
        if model == "gpt2":
            backend = _byte_level_backend(fields)
        elif model == "llama":
            backend = _sentencepiece_backend(fields)
        else:
            raise ValueError(
                f"GGUF tokenizer model {model!r} is not supported: only byte-level BPE "
                "('gpt2', used by SmolLM, Llama 3, Qwen 2) and SentencePiece BPE ('llama', used "
                "by Llama 2, Mistral, Gemma) are. Serve this model from a Hugging Face folder "
                "with a tokenizer.json instead."
            )
        tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
        bos = fields.get("tokenizer.ggml.bos_token_id")
        eos = fields.get("tokenizer.ggml.eos_token_id")
        if eos is None:
            raise ValueError("GGUF metadata has no tokenizer.ggml.eos_token_id")
        # SentencePiece files without the flag get BOS, as llama.cpp and transformers do.
        add_bos = fields.get("tokenizer.ggml.add_bos_token", model == "llama")
        _set_post_processor(
            backend,
            bos=(tokens[bos], bos) if bos is not None and add_bos else None,
            eos=(tokens[eos], eos) if fields.get("tokenizer.ggml.add_eos_token", False) else None,
        )
        # A separate end-of-turn or end-of-message token (Llama 3's) ends a reply too.
        extra_eos = [fields[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in fields]
        chat_template = fields.get("tokenizer.chat_template")
        if chat_template is None and str(fields.get("general.architecture", "")) in _GEMMA_ARCHS:
            chat_template = GEMMA_TEMPLATE
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            extra_eos_token_ids=extra_eos,
            chat_template=chat_template,
        )

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Build from a .gguf file's metadata (reads only the metadata, not the weights)."""
        return cls.from_gguf_metadata(read_gguf_metadata(path))

    @classmethod
    def from_hf_folder(cls, path: str | Path) -> Tokenizer:
        """Build from a Hugging Face model folder: tokenizer.json, tokenizer_config.json,
        and generation_config.json's eos ids when present. A Gemma folder without a chat
        template gets Gemma's (as a Gemma GGUF without one does), others ChatML."""
        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            raise ValueError(f"{folder} has no tokenizer.json (only fast tokenizers are supported)")
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")

        def token_id(entry: Any) -> int | None:
            # tokenizer_config stores a special token as a string or as an AddedToken dict.
            content = entry.get("content") if isinstance(entry, dict) else entry
            return backend.token_to_id(content) if isinstance(content, str) else None

        bos_id = token_id(config.get("bos_token"))
        if bos_id is None and isinstance(generation.get("bos_token_id"), int):
            bos_id = generation["bos_token_id"]
        gen_eos = generation.get("eos_token_id")
        gen_eos_ids = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        eos_id = token_id(config.get("eos_token"))
        if eos_id is None and gen_eos_ids:
            eos_id = gen_eos_ids[0]
        if eos_id is None:
            raise ValueError(
                f"{folder}: no eos_token in tokenizer_config.json and no eos_token_id in "
                "generation_config.json"
            )
        chat_template = _hf_chat_template(folder, config)
        model_type = str(_read_json(folder / "config.json").get("model_type", ""))
        if chat_template is None and model_type.removesuffix("_text") in _GEMMA_ARCHS:
            chat_template = GEMMA_TEMPLATE
        return cls(
            backend,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            extra_eos_token_ids=gen_eos_ids,
            chat_template=chat_template,
        )

    # ---- encode / decode ----------------------------------------------------------------

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a raw (not chat-templated) prompt as the model was trained to see
        one: with BOS where its files ask for it (Gemma's, a Llama 2's), none otherwise; never
        the EOS a file with ``add_eos_token`` appends (a prompt is not a finished text)."""
        ids = self.encode(text)
        return [self.bos_token_id, *ids] if self.adds_bos and self.bos_token_id is not None else ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text (`<|im_start|>`) become their
        single id. `add_special_tokens` adds BOS/EOS where the model asks for them; leave it
        off for a rendered chat prompt, whose template writes its own (as transformers does)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; bytes that do not form a whole UTF-8 character decode to U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (byte-level spelling, e.g. 'Ġworld') of `token_id`."""
        return self._backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (for batch encoding, offsets)."""
        return self._backend

    # ---- chat ---------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) into the prompt text.

        Uses the model's template, or plain ChatML when it has none. Extra keyword arguments
        reach the template as variables (e.g. `tools`). A template's `raise_exception` raises
        `jinja2.TemplateError`.
        """
        template = _compile_template(self.chat_template or CHATML_TEMPLATE)
        return template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **{**self._template_tokens, **template_kwargs},
        )


# ---- GGUF metadata ---------------------------------------------------------------------


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values.

    The result equals `{k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}`
    minus the GGUF.* header fields, but it stops before the tensor table and parses strings
    without numpy, so a 49k-token vocabulary reads in tens of milliseconds instead of
    GGUFReader's ~2 s.
    """
    with open(path, "rb") as f:
        return _GGUFMetadataParser(f).parse()


def gguf_reader_metadata(reader: Any) -> dict[str, Any]:
    """The same dict as `read_gguf_metadata`, from an already open `gguf.GGUFReader`."""
    return {
        key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")
    }


# GGUF value types (gguf.GGUFValueType).
_SCALAR_FORMATS = {
    0: "B",  # UINT8
    1: "b",  # INT8
    2: "H",  # UINT16
    3: "h",  # INT16
    4: "I",  # UINT32
    5: "i",  # INT32
    6: "f",  # FLOAT32
    7: "?",  # BOOL
    10: "Q",  # UINT64
    11: "q",  # INT64
    12: "d",  # FLOAT64
}
_TYPE_STRING = 8
_TYPE_ARRAY = 9


class _GGUFMetadataParser:
    """Reads a GGUF header and key/value section from a file, growing its buffer on demand."""

    _CHUNK = 1 << 22

    def __init__(self, file: Any) -> None:
        self._file = file
        self._buf = b""
        self._pos = 0
        self._order = "<"

    def _need(self, num_bytes: int) -> None:
        missing = self._pos + num_bytes - len(self._buf)
        if missing > 0:
            more = self._file.read(max(missing, self._CHUNK))
            if len(more) < missing:
                raise ValueError("GGUF file ends inside its metadata (truncated file?)")
            self._buf += more

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(self._order + fmt, self._buf, self._pos)
        self._pos += size
        return value

    def _string(self) -> str:
        length = self._unpack("Q")
        self._need(length)
        raw = self._buf[self._pos : self._pos + length]
        self._pos += length
        return raw.decode("utf-8")

    def _value(self, value_type: int) -> Any:
        if value_type == _TYPE_STRING:
            return self._string()
        if value_type == _TYPE_ARRAY:
            item_type = self._unpack("I")
            count = self._unpack("Q")
            if item_type in _SCALAR_FORMATS:
                # One numpy view for a whole numeric array (token types, scores).
                dtype = np.dtype(self._order + _SCALAR_FORMATS[item_type])
                self._need(count * dtype.itemsize)
                items = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
                self._pos += count * dtype.itemsize
                return items.tolist()
            return [self._value(item_type) for _ in range(count)]
        if value_type in _SCALAR_FORMATS:
            return self._unpack(_SCALAR_FORMATS[value_type])
        raise ValueError(f"GGUF metadata has an unknown value type {value_type}")

    def parse(self) -> dict[str, Any]:
        self._need(24)
        if self._buf[:4] != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        self._pos = 4
        version = self._unpack("I")
        if version & 0xFFFF == 0:
            # Written on a big-endian machine: every number is byte-swapped.
            self._order = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old (need 2 or newer)")
        self._unpack("Q")  # tensor count: the tensor table is the weight loader's business
        num_fields = self._unpack("Q")
        metadata: dict[str, Any] = {}
        for _ in range(num_fields):
            key = self._string()
            metadata[key] = self._value(self._unpack("I"))
        return metadata


# ---- building the backend --------------------------------------------------------------


@cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, in which byte-level vocabularies are spelled."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _byte_level_vocab(tokens: list[str], token_types: list[int]) -> dict[str, int]:
    # A few GGUF converters store a normal token in plain text instead of the byte
    # alphabet; respell those so BPE can reach them. Control and user-defined tokens stay as
    # written: they are matched whole in the text, not built by merges.
    alphabet = set(_byte_alphabet().values())
    spell = _byte_alphabet()
    vocab: dict[str, int] = {}
    for index, (token, token_type) in enumerate(zip(tokens, token_types, strict=True)):
        if (
            token_type not in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)
            and not set(token) <= alphabet
        ):
            token = "".join(spell[b] for b in token.encode("utf-8"))
        vocab[token] = index
    return vocab


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _PRE_GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _PRE_DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _PRE_SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise ValueError(
        f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
        f"{', '.join(SUPPORTED_GGUF_PRE_TOKENIZERS)}"
    )


def _add_gguf_special_tokens(
    backend: tokenizers.Tokenizer, tokens: list[str], token_types: list[int]
) -> None:
    # Control tokens (<|im_start|>) are special: matched whole in the text and dropped by
    # decode(skip_special_tokens=True). User-defined ones (<think>) are matched whole but kept.
    # Both are already in the BPE vocabulary, so they keep their GGUF ids.
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(tokens, token_types, strict=True)
        if kind == _TOKEN_TYPE_CONTROL
    ]
    user_defined = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, token_types, strict=True)
        if kind == _TOKEN_TYPE_USER_DEFINED
    ]
    if control:
        backend.add_special_tokens(control)
    if user_defined:
        backend.add_tokens(user_defined)


def _byte_level_backend(fields: Mapping[str, Any]) -> tokenizers.Tokenizer:
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    token_types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = fields.get("tokenizer.ggml.merges")
    if not merges:
        raise ValueError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    pre = fields.get("tokenizer.ggml.pre", "default")
    backend = tokenizers.Tokenizer(
        models.BPE(
            vocab=_byte_level_vocab(tokens, token_types),
            merges=[tuple(m.split(" ", 1)) for m in merges],
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre in _IGNORE_MERGES_PRE,
        )
    )
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    _add_gguf_special_tokens(backend, tokens, token_types)
    return backend


def _sentencepiece_backend(fields: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """SentencePiece BPE with byte fallback (`<0xNN>` tokens), as transformers' GGUF loader
    builds it: GemmaTokenizer's layout for the Gemma family, LlamaTokenizer's otherwise."""
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    token_types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    arch = str(fields.get("general.architecture", ""))
    gemma = arch in _GEMMA_ARCHS
    if gemma:
        # Gemma files store whitespace-only tokens of two or more spaces as real spaces; its
        # tokenizer looks them up spelled with "▁". Its scores do not follow its merge
        # order; the order of the vocabulary does.
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        ranks: Sequence[float] = range(0, -len(tokens), -1)
    else:
        ranks = list(fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = fields.get("tokenizer.ggml.merges")
    if merges:
        merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        merge_pairs = _cached_merges_from_scores(tokens, ranks)
    unk_id = fields.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else "<unk>"
    backend = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab, merges=merge_pairs, unk_token=unk, fuse_unk=True, byte_fallback=True
        )
    )
    spm_decoders = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        # No dummy prefix: spaces become "▁" and each piece keeps the spaces before it.
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        # SentencePiece's own layout (Llama 2's tokenizer.json, llama.cpp): every piece of
        # text, at the start or after a special token, gets a "▁" prefix, even one that
        # already starts with a space (" Hello" is "▁" "▁Hello"); spaces become "▁". (A
        # Metaspace pre-tokenizer prefixes only the first piece, and not one that starts
        # with a space: the first token of every Llama 2 / Mistral chat prompt would differ.)
        add_prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        spaces = normalizers.Replace(" ", "▁")
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), spaces]) if add_prefix else spaces
        if add_prefix:
            spm_decoders.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(spm_decoders)
    # Control tokens as the file spells them; a user-defined one only where the vocabulary
    # holds that spelling (Gemma's space runs are reached by merges of "\u2581" instead).
    original: list[str] = list(fields["tokenizer.ggml.tokens"])
    kept = [
        (token, kind)
        for token, kind in zip(original, token_types, strict=True)
        if kind == _TOKEN_TYPE_CONTROL or (kind == _TOKEN_TYPE_USER_DEFINED and token in vocab)
    ]
    _add_gguf_special_tokens(backend, [t for t, _ in kept], [kind for _, kind in kept])
    return backend


def _end_of_turn_ids(backend: tokenizers.Tokenizer) -> list[int]:
    """Ids of `END_OF_TURN_TOKENS` that are special tokens of `backend` (a GGUF's control
    tokens, a tokenizer.json's added tokens marked special): a plain word spelt the same
    ends nothing."""
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    return [special[t] for t in END_OF_TURN_TOKENS if t in special]


def _set_post_processor(
    backend: tokenizers.Tokenizer, *, bos: tuple[str, int] | None, eos: tuple[str, int] | None
) -> None:
    # BOS/EOS added on encode(add_special_tokens=True), as a tokenizer.json's post-processor does.
    if bos is None and eos is None:
        return
    before = [bos[0]] if bos else []
    after = [eos[0]] if eos else []
    specials = {item for item in (bos, eos) if item is not None}
    backend.post_processor = processors.TemplateProcessing(
        single=[*before, "$A", *after],
        pair=[*before, "$A", *after, *before, "$B", *after],
        special_tokens=sorted(specials, key=lambda item: item[1]),
    )


# Recent merge lists derived from scores, keyed by a digest of the vocabulary and scores:
# deriving them for a 262k vocabulary takes about a second, rebuilding the same model reuses
# it. Each is kept as two NUL-joined strings (left pieces, right pieces; no token holds a
# NUL): Gemma 3's 515k merges as Python tuples of strings held ~150 MiB for the life of the
# process, as strings ~10 MiB.
_MERGES_CACHE: dict[bytes, tuple[str, str]] = {}
_MERGES_CACHE_SIZE = 2


def _cached_merges_from_scores(
    tokens: Sequence[str], scores: Sequence[float]
) -> list[tuple[str, str]]:
    digest = hashlib.blake2b("\x00".join(tokens).encode("utf-8", "surrogatepass"))
    digest.update(np.asarray(scores, dtype=np.float64).tobytes())
    key = digest.digest()
    if key not in _MERGES_CACHE:
        while len(_MERGES_CACHE) >= _MERGES_CACHE_SIZE:
            _MERGES_CACHE.pop(next(iter(_MERGES_CACHE)))
        merges = merges_from_scores(tokens, scores)
        _MERGES_CACHE[key] = ("\x00".join(a for a, _ in merges), "\x00".join(b for _, b in merges))
        return merges
    left, right = _MERGES_CACHE[key]
    return list(zip(left.split("\x00"), right.split("\x00"), strict=True)) if left else []


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary and its scores, best first.

    Every split of a token into two vocabulary pieces is a merge ranked by the token's score
    (higher first), then by longer left and right piece; the splits of one token are ordered
    by the pieces' ids, and equal keys keep vocabulary order. This is the order of
    transformers' `generate_merges` (and `SentencePieceExtractor`), so BPE on the result
    reproduces its tokens.
    """
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab[token] = index
    # Like a dict built from (token, score) pairs: first position, last score.
    score_of = dict(zip(tokens, scores, strict=True))
    get = vocab.get
    ranked: list[tuple[float, int, int, str, str]] = []
    for piece, score in score_of.items():
        length = len(piece)
        if length < 2:
            continue
        local = []
        for cut in range(1, length):
            left = get(piece[:cut])
            if left is None:
                continue
            right = get(piece[cut:])
            if right is not None:
                local.append((left, right, cut))
        if len(local) > 1:
            local.sort()
        ranked.extend((score, cut, length - cut, piece[:cut], piece[cut:]) for _, _, cut in local)
    ranked.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(m[3], m[4]) for m in ranked]


# ---- HF folder helpers -----------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _hf_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    # Newer folders keep the template in its own file; older ones in tokenizer_config.json,
    # either as a string or as a list of named templates of which "default" is the chat one.
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# ---- chat template ---------------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def template_environment() -> jinja2.Environment:
    """The environment chat templates are parsed and rendered in: transformers' (sandboxed,
    templates come from model files; ``{% break %}`` and ``{% continue %}`` allowed), so
    prompts match token for token."""
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])


@cache
def _compile_template(source: str) -> jinja2.Template:
    env = template_environment()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
