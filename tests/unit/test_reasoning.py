"""``server/reasoning.py``: a reply's ``<think>`` block apart from its answer, streamed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import tokenizers
from pydantic import ValidationError
from tokenizers import models

from speclane.engine.engine import RequestOutput
from speclane.models.tokenizer import Tokenizer
from speclane.server.errors import APIError
from speclane.server.prompts import Vocabulary, chat_input
from speclane.server.protocol import ChatCompletionRequest
from speclane.server.reasoning import ReasoningSplitter, prompt_opens_thinking, reads_reasoning
from speclane.server.streaming import ChoiceState, Reading, choices_usage


def split(text: str, pieces: int | None = None, *, thinking: bool = False) -> tuple[str, str]:
    """The whole reply's (reasoning, content), fed in ``pieces``-character pieces (None: whole)."""
    splitter = ReasoningSplitter(thinking=thinking)
    size = pieces or max(1, len(text))
    reasoning = content = ""
    for start in range(0, len(text), size):
        r, c = splitter.feed(text[start:start + size])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return reasoning + r, content + c


CASES = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "The user greets me.\n", "Hello!"),
    ("\n<think>a < b, and </thin is not a tag</think>answer", False, "a < b, and </thin is not a tag", "answer"),
    ("Hello, no thinking here.", False, "", "Hello, no thinking here."),
    ("  Hello <think>later tags are content</think>", False, "", "  Hello <think>later tags are content</think>"),
    ("I reason from the start.\n</think>\n\nThe answer.", True, "I reason from the start.\n", "The answer."),
    ("<think>cut short while thinking", False, "cut short while thinking", ""),
    ("<think>\n\n</think>\n\nAn empty thought.", False, "", "An empty thought."),
    ("<thi", False, "", "<thi"),
    ("   ", False, "", ""),
    ("<think>x</think>a</think>b", False, "x", "a</think>b"),
]


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), CASES)
@pytest.mark.parametrize("pieces", [None, 1, 2, 3, 7])
def test_pieces_of_any_size_split_as_the_whole_reply(text: str, thinking: bool, reasoning: str, content: str,
                                                     pieces: int | None) -> None:
    assert split(text, pieces, thinking=thinking) == (reasoning, content)


def test_a_piece_is_sent_as_soon_as_it_cannot_be_a_tag() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>Let me") == ("Let me", "")
    assert splitter.feed(" see </") == (" see ", "")  # "</" may open "</think>": held back
    assert splitter.feed("b>") == ("</b>", "")
    assert splitter.feed("</think>Yes") == ("", "Yes")


def test_a_prompt_that_opens_thinking_and_the_parser_choice() -> None:
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert reads_reasoning("auto", "{{ '<think>' }}") and not reads_reasoning("auto", "{{ messages }}")
    assert reads_reasoning("think", None) and not reads_reasoning("none", "<think>")
    with pytest.raises(ValueError, match="reasoning-parser"):
        reads_reasoning("deepseek", None)


# -- a chat choice: thinking first, then tool calls in the answer --------------------------------

def outputs(pieces: list[str]) -> list[RequestOutput]:
    last = len(pieces) - 1
    return [RequestOutput("r", text, [], i == last, "stop" if i == last else None, 5, i + 1)
            for i, text in enumerate(pieces)]


def test_a_choice_sends_reasoning_then_content_and_reads_calls_in_the_answer_only() -> None:
    reply = ['<think>I could call <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', " but no.</th",
             'ink>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>']
    state = ChoiceState(0, Reading(tool_parsing="auto", tool_names=("add",), reasoning=True))
    chunks = [state.chunk_choices(state.feed(out), chat=True) for out in outputs(reply)]
    streamed = [d["delta"] for c in chunks for d in c]
    reasoning = "".join(d.get("reasoning_content", "") for d in streamed)
    assert reasoning.startswith("I could call <tool_call>") and reasoning.endswith(" but no.")
    assert not any("content" in d for d in streamed), "the answer is the call alone"
    message = state.answer(chat=True)["message"]
    assert message["reasoning_content"] == reasoning
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"a": 2}']
    assert state.finish_reason == "tool_calls"


def test_without_the_parser_the_tags_stay_in_content() -> None:
    state = ChoiceState(0, Reading())
    for out in outputs(["<think>hm</think>", "Hi"]):
        state.feed(out)
    message = state.answer(chat=True)["message"]
    assert message["content"] == "<think>hm</think>Hi" and "reasoning_content" not in message


def test_a_prompt_that_opens_thinking_starts_the_reply_in_it() -> None:
    state = ChoiceState(0, Reading(reasoning=True, opens_thinking=True))
    for out in outputs(["\nSo 2 + 2 is 4.\n</think>", "\n\n4"]):
        state.feed(out)
    assert state.answer(chat=True)["message"] | {} == {"role": "assistant", "content": "4",
                                                       "reasoning_content": "So 2 + 2 is 4.\n"}


THINK_END = 99  # the id of "</think>" in these outputs


def token_outputs(pieces: list[tuple[str, list[int]]]) -> list[RequestOutput]:
    last = len(pieces) - 1
    return [RequestOutput("r", text, ids, i == last, "stop" if i == last else None, 5, 0)
            for i, (text, ids) in enumerate(pieces)]


@pytest.mark.parametrize(("pieces", "opens", "expected"), [
    ([("<think>Hm, ", [1, 2, 3]), ("two.</think>", [4, THINK_END]), ("\n\nFour", [5, 6])], False, 5),
    ([("So", [1]), (" four</think>Four", [2, THINK_END, 3])], True, 3),
    ([("<think>still", [1, 2]), (" going", [3])], False, 3),
    ([("Four.", [1, 2])], False, 0),
])
def test_reasoning_tokens_run_to_the_think_end_token(pieces: list[tuple[str, list[int]]], opens: bool,
                                                     expected: int) -> None:
    states = [ChoiceState(i, Reading(reasoning=True, opens_thinking=opens, think_end_token=THINK_END)) for i in (0, 1)]
    for state in states:
        for out in token_outputs(pieces):
            state.feed(out)
    assert states[0].reasoning_tokens == expected
    usage = choices_usage(states)
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 2 * expected
    unknown = ChoiceState(0, Reading(reasoning=True))  # neither the id nor a decode: not counted
    for out in token_outputs(pieces):
        unknown.feed(out)
    assert unknown.reasoning_tokens is None
    assert "reasoning_tokens" not in choices_usage([unknown])["completion_tokens_details"]


PIECES = {1: "<think>", 2: "Hm", 3: ", two", 4: ".</", 5: "think", 6: ">", 7: "\n\nFour", 8: "."}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


@pytest.mark.parametrize("chunks", [[[1, 2, 3], [4, 5], [6, 7], [8]], [[1, 2, 3, 4, 5, 6, 7, 8]], [[i] for i in range(1, 9)],
                                    [[1, 2], [3, 4, 5, 6, 7], [8]]])
def test_reasoning_tokens_run_to_the_token_that_ends_a_several_token_think_end(chunks: list[list[int]]) -> None:
    """Where "</think>" is several tokens, the count runs to the one that completes it (the
    6th here), whichever outputs carry the tokens."""
    state = ChoiceState(0, Reading(reasoning=True, decode=decode))
    for out in token_outputs([(decode(ids), ids) for ids in chunks]):
        state.feed(out)
    assert state.reasoning_tokens == 6 and state.token_ids is None, "counted once, the ids let go"
    assert state.answer(chat=True)["message"]["reasoning_content"] == "Hm, two."
    unclosed = ChoiceState(0, Reading(reasoning=True, decode=decode))
    for out in token_outputs([(decode([1, 2, 3]), [1, 2, 3])]):
        unclosed.feed(out)
    assert unclosed.reasoning_tokens == 3, "a reply cut short while thinking: all of it"


# -- chat_template_kwargs reach the template; the prompt's open <think> is noticed ---------------

QWEN3_LIKE = ("{% for m in messages %}<|{{ m.role }}|>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
              "</think>{% endif %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
              "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
              "{% elif think_open is defined %}<think>\n{% endif %}{% endif %}")


def vocabulary(template: str) -> Vocabulary:
    backend = tokenizers.Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    return Vocabulary(Tokenizer(backend, bos_token_id=1, eos_token_id=2, chat_template=template), 4096, 3)


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def test_chat_template_kwargs_reach_the_template() -> None:
    vocab = vocabulary(QWEN3_LIKE)
    rendered: list[str] = []
    encode = vocab.tokenizer.encode
    vocab.tokenizer.encode = lambda text, **kw: rendered.append(text) or encode(text, **kw)  # type: ignore[method-assign]
    assert not chat_input(chat(), vocab).opens_thinking
    assert not chat_input(chat(chat_template_kwargs={"enable_thinking": False}), vocab).opens_thinking
    assert chat_input(chat(chat_template_kwargs={"think_open": True}), vocab).opens_thinking
    assert rendered[0].endswith("<|assistant|>") and rendered[1].endswith("<think>\n\n</think>\n\n")
    history = chat(messages=[{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
                             {"role": "user", "content": "bye"}])
    chat_input(history, vocab)
    assert "<|assistant|><think>greet back</think>Hello" in rendered[-1]


def test_a_constrained_reply_is_the_answer_even_where_the_prompt_opened_thinking() -> None:
    vocab = dataclasses.replace(vocabulary(QWEN3_LIKE), compile_grammar=lambda spec: object())
    opened = {"chat_template_kwargs": {"think_open": True}}
    assert chat_input(chat(**opened), vocab).opens_thinking
    assert not chat_input(chat(**opened, response_format={"type": "json_object"}), vocab).opens_thinking


def test_a_variable_of_the_wrong_type_is_the_clients_error() -> None:
    """Llama 3.1's template adds its date_string to text: a number there is a 400, not a 500."""
    vocab = vocabulary("{{ 'Today Date: ' + date_string }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert chat_input(chat(chat_template_kwargs={"date_string": "26 Jul 2024"}), vocab)
    with pytest.raises(APIError, match="chat_template_kwargs: TypeError") as info:
        chat_input(chat(chat_template_kwargs={"date_string": 1}), vocab)
    assert info.value.status == 400 and info.value.param == "chat_template_kwargs"


@pytest.mark.parametrize(("fields", "words"), [
    ({"chat_template_kwargs": {"messages": []}}, "set by the server"),
    ({"chat_template_kwargs": {"raise_exception": 0}}, "set by the server"),
    ({"messages": [{"role": "user", "content": "hi", "reasoning_content": "x"}]}, "assistant messages only"),
])
def test_fields_the_template_may_not_take(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        chat(**fields)
