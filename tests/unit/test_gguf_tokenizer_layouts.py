"""Tokenizers built from GGUF metadata follow llama.cpp's rules on tiny vocabularies (no
model file): SentencePiece prefixes every piece of text with "▁", at the start and after a
special token, even one that starts with a space; Llama 3's byte-level BPE takes a word
that is a whole vocabulary entry as one token whatever the merges say; the end tokens a
GGUF names or spells end generation. ``tests/integration/test_llama_cpp_vocabs.py`` checks
the same against llama.cpp's own vocabulary test files where they are present."""

from __future__ import annotations

from speclane.models.tokenizer import Tokenizer

CONTROL, NORMAL = 3, 1


def spm(tokens: list[str], **flags: bool) -> Tokenizer:
    """A Llama-2-style SentencePiece vocabulary: <unk> <s> </s>, then ``tokens``; each
    piece scores by its length, so the longest merges win. ``flags``: add_bos_token and
    add_eos_token (both off by default)."""
    vocab = ["<unk>", "<s>", "</s>", *tokens]
    return Tokenizer.from_gguf_metadata({
        "general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": vocab,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, *[float(len(t)) for t in tokens]],
        "tokenizer.ggml.token_type": [2, CONTROL, CONTROL, *[NORMAL] * len(tokens)],
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": flags.get("add_bos_token", False),
        "tokenizer.ggml.add_eos_token": flags.get("add_eos_token", False)})


def test_sentencepiece_prefixes_every_piece_even_one_that_starts_with_a_space() -> None:
    pieces = ["▁", "H", "i", "[", "▁H", "▁[", "▁Hi"]
    tok = spm(pieces)
    ids = {t: 3 + pieces.index(t) for t in pieces}
    assert tok.encode("Hi") == [ids["▁Hi"]]
    assert tok.encode(" Hi") == [ids["▁"], ids["▁Hi"]]  # llama.cpp and sentencepiece: "▁" "▁Hi"
    assert tok.encode("<s>[") == [1, ids["▁["]]  # after a special token, a new piece: "▁["
    assert tok.decode(tok.encode(" Hi")) == " Hi" and tok.decode(tok.encode("Hi")) == "Hi"


def byte_level(words: list[str], merges: list[str], pre: str, extra: list[tuple[str, int]] = ()) -> Tokenizer:
    """A byte-level BPE vocabulary: the ASCII letters, then ``words``, then ``extra``
    (spelling, token type) and an <eos>."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = [*letters, *words, *(t for t, _ in extra), "<eos>"]
    types = [NORMAL] * (len(letters) + len(words)) + [kind for _, kind in extra] + [CONTROL]
    return Tokenizer.from_gguf_metadata({
        "general.architecture": "llama", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1})


def test_llama3s_bpe_takes_a_whole_vocabulary_word_as_one_token() -> None:
    merges = ["a b"]  # "abc" is in the vocabulary, but no merge builds it from "ab" + "c"
    llama3 = byte_level(["ab", "abc"], merges, "llama-bpe")
    assert llama3.encode("abc") == [llama3.encode("abc")[0]] and len(llama3.encode("abc")) == 1
    gpt2 = byte_level(["ab", "abc"], merges, "gpt2")  # other byte-level tokenizers follow the merges
    assert [gpt2.decode([i]) for i in gpt2.encode("abc")] == ["ab", "c"]


def test_the_end_tokens_a_gguf_spells_or_names_end_generation() -> None:
    tok = byte_level(["ab"], ["a b"], "llama-bpe", extra=[("<|end_of_text|>", CONTROL), ("<|eom_id|>", CONTROL),
                                                 ("<|endoftext|>", CONTROL), ("<|endoftext|>x", NORMAL)])
    by_text = {tok.decode([i], skip_special_tokens=False): i for i in range(tok.vocab_size)}
    assert {by_text["<|end_of_text|>"], by_text["<|eom_id|>"], by_text["<|endoftext|>"]} < tok.eos_token_ids
    assert by_text["<|endoftext|>x"] not in tok.eos_token_ids


def test_a_raw_prompt_starts_with_bos_where_the_model_asks_and_never_ends_with_eos() -> None:
    pieces = ["▁", "H", "i", "▁H", "▁Hi"]
    hi = 3 + pieces.index("▁Hi")
    assert spm(pieces, add_bos_token=True, add_eos_token=True).encode_prompt("Hi") == [1, hi]
    assert spm(pieces).encode_prompt("Hi") == [hi]  # the file asks for no BOS
    assert spm(pieces, add_bos_token=True).encode("Hi") == [hi]  # plain encode: a chat template's text
