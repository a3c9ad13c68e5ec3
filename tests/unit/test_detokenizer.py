"""IncrementalDetokenizer on a tiny byte-level fake tokenizer: split characters, stop strings,
flush, and the invariant that streamed pieces add up to the full decode cut at the first stop."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speclane.engine.detokenizer import IncrementalDetokenizer

EOS = 0  # the fake's one special token


class ByteTokenizer:
    """Each id stands for a byte string, like a byte-level BPE vocabulary; id 0 is special.

    `decode` counts how many ids it is asked to decode, to check the detokenizer decodes
    small windows rather than the whole output.
    """

    def __init__(self) -> None:
        self._pieces: list[bytes] = [b"<eos>"]
        self._ids: dict[bytes, int] = {}
        self.max_decoded_ids = 0

    def id_of(self, piece: bytes) -> int:
        if piece not in self._ids:
            self._ids[piece] = len(self._pieces)
            self._pieces.append(piece)
        return self._ids[piece]

    def ids(self, *pieces: str | bytes) -> list[int]:
        return [self.id_of(p.encode() if isinstance(p, str) else p) for p in pieces]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.max_decoded_ids = max(self.max_decoded_ids, len(ids))
        data = b"".join(self._pieces[i] for i in ids if not (skip_special_tokens and i == EOS))
        return data.decode("utf-8", errors="replace")


def stream(
    tok: ByteTokenizer,
    ids: Sequence[int],
    stop: Sequence[str] = (),
    prompt: Sequence[int] = (),
    flush: bool = True,
) -> tuple[list[str], IncrementalDetokenizer]:
    """Feed `ids` one by one (until a stop), then flush; return every piece returned."""
    detok = IncrementalDetokenizer(tok, prompt, tuple(stop))
    pieces = []
    for token_id in ids:
        step = detok.add(token_id)
        pieces.append(step.text)
        if step.stopped:
            break
    if flush:
        pieces.append(detok.flush().text)
    return pieces, detok


def test_ascii_tokens_stream_as_they_come() -> None:
    tok = ByteTokenizer()
    pieces, detok = stream(tok, tok.ids("Hello", ",", " world"), flush=False)
    assert pieces == ["Hello", ",", " world"]
    assert detok.output_text == "Hello, world"


def test_emoji_split_over_four_tokens_is_held_until_whole() -> None:
    tok = ByteTokenizer()
    emoji = "😀".encode()  # 4 bytes, one per token
    ids = tok.ids("hi ", emoji[:1], emoji[1:2], emoji[2:3], emoji[3:], "!")
    pieces, _ = stream(tok, ids)
    assert pieces == ["hi ", "", "", "", "😀", "!", ""]


def test_cjk_split_across_tokens() -> None:
    tok = ByteTokenizer()
    a, b = "中".encode(), "文".encode()  # 3 bytes each
    ids = tok.ids(a[:2], a[2:] + b[:1], b[1:])
    pieces, _ = stream(tok, ids)
    # A token that ends one character and starts the next is held whole, like vLLM.
    assert pieces == ["", "", "中文", ""]


def test_flush_releases_an_unfinished_character_as_replacement() -> None:
    tok = ByteTokenizer()
    pieces, detok = stream(tok, tok.ids("ok", "é".encode()[:1]))
    assert pieces == ["ok", "", "\ufffd"]
    assert detok.output_text == tok.decode(tok.ids("ok", "é".encode()[:1]))


def test_invalid_byte_followed_by_text_is_released_with_the_text() -> None:
    tok = ByteTokenizer()
    pieces, _ = stream(tok, tok.ids(b"\xff", "a"), flush=False)
    assert pieces == ["", "\ufffda"]


def test_special_tokens_skipped_or_kept() -> None:
    tok = ByteTokenizer()
    ids = [*tok.ids("a"), EOS, *tok.ids("b")]
    assert "".join(stream(tok, ids)[0]) == "ab"
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=False)
    assert "".join(detok.add(i).text for i in ids) + detok.flush().text == "a<eos>b"


def test_prompt_context_is_not_repeated() -> None:
    tok = ByteTokenizer()
    prompt = [*tok.ids("system", " user"), EOS, *tok.ids(" assistant:")]
    pieces, _ = stream(tok, tok.ids(" Sure", "."), prompt=prompt)
    assert "".join(pieces) == " Sure."


def test_prompt_ending_mid_character_does_not_leak_into_output() -> None:
    tok = ByteTokenizer()
    euro = "€".encode()
    prompt = tok.ids("price ", euro[:2])
    pieces, _ = stream(tok, tok.ids(euro[2:], "5"), prompt=prompt)
    # The output alone decodes to a stray continuation byte, then "5".
    assert "".join(pieces) == tok.decode(tok.ids(euro[2:], "5")) == "\ufffd5"


def test_stop_string_spanning_tokens() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, [], ("END",))
    steps = [detok.add(i) for i in tok.ids("foo E", "N", "D bar")]
    assert [s.text for s in steps] == ["foo ", "", ""]
    assert [s.stopped for s in steps] == [False, False, True]
    assert steps[-1].stop_string == "END" and detok.stop_string == "END"
    assert detok.output_text == "foo "
    assert detok.finished and detok.flush().text == ""


def test_held_text_is_released_when_it_is_not_a_stop() -> None:
    tok = ByteTokenizer()
    pieces, detok = stream(tok, tok.ids("E", "N", "x"), stop=["END"], flush=False)
    assert pieces == ["", "", "ENx"]
    assert not detok.stopped


def test_flush_releases_a_held_stop_prefix() -> None:
    tok = ByteTokenizer()
    pieces, detok = stream(tok, tok.ids("abc E"), stop=["END"])
    assert pieces == ["abc ", "E"]
    assert detok.output_text == "abc E" and not detok.stopped


def test_stop_inside_one_token_cuts_it() -> None:
    tok = ByteTokenizer()
    pieces, detok = stream(tok, tok.ids("hello STOP world", "more"), stop=["STOP"])
    assert pieces == ["hello ", ""]
    assert detok.num_output_tokens == 1


def test_first_stop_to_complete_wins() -> None:
    tok = ByteTokenizer()
    # "bc" completes (at "c") before "abcd" could; the longer one starting earlier loses.
    pieces, detok = stream(tok, tok.ids("xa", "b", "c", "d"), stop=["abcd", "bc"])
    assert "".join(pieces) == "xa" and detok.stop_string == "bc"
    # Same end: the one starting first (the longer) wins.
    pieces, detok = stream(tok, tok.ids("x", "ab"), stop=["b", "ab"])
    assert "".join(pieces) == "x" and detok.stop_string == "ab"


def test_stop_string_with_a_multibyte_character() -> None:
    tok = ByteTokenizer()
    smile = "😀".encode()
    ids = tok.ids("ok ", smile[:2], smile[2:], "!")
    pieces, detok = stream(tok, ids, stop=["😀!"])
    assert "".join(pieces) == "ok " and detok.stopped


def test_extend_stops_at_the_stopping_token() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, [], ("<|end|>",))
    step = detok.extend(tok.ids("a", "b<|", "end|>", "c", "d"))
    assert step.text == "ab" and step.stopped and step.num_tokens == 3
    assert detok.num_output_tokens == 3
    with pytest.raises(RuntimeError):
        detok.add(tok.id_of(b"c"))


def test_extend_without_stop_consumes_all() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, [])
    step = detok.extend(tok.ids("a", "b", "c"))
    assert (step.text, step.stopped, step.num_tokens) == ("abc", False, 3)


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(ByteTokenizer(), [], ("",))


def test_decodes_small_windows_not_the_whole_output() -> None:
    tok = ByteTokenizer()
    ids = tok.ids(*(["word ", "é".encode()[:1], "é".encode()[1:]] * 400))
    pieces, _ = stream(tok, ids, stop=["never"], prompt=tok.ids(*["p"] * 50))
    assert tok.max_decoded_ids <= 8
    assert "".join(pieces) == tok.decode(ids)


# ---- property: streamed pieces == full decode cut at the first stop ---------------------

_CHARS = ["a", "b", " ", "\n", "é", "中", "😀", "<", "|", ">"]


def _reference(text: str, stops: Sequence[str]) -> str:
    """`text` cut before the stop string that completes first (then the one starting first)."""
    best: tuple[int, int] | None = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < best):
            best = (start + len(stop), start)
    return text if best is None else text[: best[1]]


@st.composite
def _generation(draw: st.DrawFn) -> tuple[list[bytes], list[str]]:
    text = "".join(draw(st.lists(st.sampled_from(_CHARS), max_size=30)))
    data = text.encode()
    # Cut the bytes anywhere, so tokens split characters; sometimes add an invalid byte.
    cuts = sorted(draw(st.sets(st.integers(1, max(len(data) - 1, 1)), max_size=len(data))))
    bounds = [0, *(c for c in cuts if c < len(data)), len(data)]
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    if draw(st.booleans()) and pieces:
        pieces.insert(draw(st.integers(0, len(pieces))), b"\xff")
    stops = draw(
        st.lists(
            st.lists(st.sampled_from(_CHARS), min_size=1, max_size=4).map("".join),
            max_size=3,
        )
    )
    return pieces, stops


@settings(max_examples=300, deadline=None)
@given(_generation(), st.booleans())
def test_streamed_pieces_add_up_to_the_decode_cut_at_the_first_stop(
    generation: tuple[list[bytes], list[str]], with_eos: bool
) -> None:
    byte_pieces, stops = generation
    tok = ByteTokenizer()
    ids = tok.ids(*byte_pieces)
    if with_eos:
        ids.append(EOS)
    pieces, detok = stream(tok, ids, stop=stops, prompt=tok.ids("prompt ", "😀".encode()[:3]))
    full = tok.decode(ids)
    expected = _reference(full, stops)
    assert "".join(pieces) == expected == detok.output_text
    assert detok.stopped == any(s in full for s in stops)
    # No piece ever holds a broken character unless the full decode has one there.
    if "\ufffd" not in full:
        assert all("\ufffd" not in p for p in pieces)


def test_min_tokens_stop_strings_count_from_the_token_after_the_first_min_tokens() -> None:
    tok = ByteTokenizer()
    ids = tok.ids("a", "END", "b", "END", "c")
    early = IncrementalDetokenizer(tok, [], ("END",))
    assert early.extend(ids).text == "a" and early.stopped
    held = IncrementalDetokenizer(tok, [], ("END",), min_tokens=2)
    step = held.extend(ids)
    assert (step.text, step.stopped, step.num_tokens) == ("aENDb", True, 4)
    assert held.output_text == "aENDb"
    whole = IncrementalDetokenizer(tok, [], ("END",), min_tokens=5)
    assert whole.extend(ids).text == "aENDbENDc" and not whole.stopped
    straddling = IncrementalDetokenizer(tok, [], ("END",), min_tokens=1)
    step = straddling.extend(tok.ids("aEN", "D", "x"))
    assert (step.text, step.stopped, step.num_tokens) == ("a", True, 2), "begun within min_tokens, ended after"
