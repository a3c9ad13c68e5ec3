"""Rendering a chat through the model's template: a chat of instructions alone that the
template would leave out is a 400, not a prompt empty of them."""

from __future__ import annotations

import pytest
import tokenizers
from tokenizers import models

from speclane.models.tokenizer import Tokenizer
from speclane.server.errors import APIError
from speclane.server.prompts import render_chat
from speclane.server.protocol import ChatCompletionRequest

# Gemma's way: the system text is written into the first user turn, and nowhere without one.
FOLDING_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}<{{ m.role }}>{% if loop.first %}{{ first }}{% endif %}{{ m.content }}\n{% endfor %}<model>"
)
CHATML_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


def tokenizer(template: str) -> Tokenizer:
    backend = tokenizers.Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    return Tokenizer(backend, bos_token_id=1, eos_token_id=2, chat_template=template)


def chat(*messages: tuple[str, str]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": role, "content": text} for role, text in messages]})


@pytest.mark.parametrize("role", ["system", "developer"])
def test_instructions_a_template_leaves_out_are_a_400(role: str) -> None:
    with pytest.raises(APIError) as refused:
        render_chat(chat((role, "You are a pirate. Say ahoy.")), tokenizer(FOLDING_TEMPLATE))
    assert refused.value.status == 400 and refused.value.param == "messages[0]" and "user message" in str(refused.value)


def test_instructions_are_kept_with_a_user_message_or_by_a_template_that_writes_them() -> None:
    folded = render_chat(chat(("system", "Be brief."), ("user", "Hi")), tokenizer(FOLDING_TEMPLATE))
    assert "Be brief.\n\nHi" in folded
    alone = render_chat(chat(("system", "Be brief.")), tokenizer(CHATML_TEMPLATE))
    assert "<|system|>Be brief." in alone


# A template that writes each message as JSON (escaping quotes and newlines) or trims it.
ESCAPING_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content | tojson }}|{{ m.content | trim }}\n{% endfor %}"


def test_a_template_that_escapes_or_trims_the_instructions_keeps_them() -> None:
    text = render_chat(chat(("system", '  Say "ahoy"\nthen stop. ')), tokenizer(ESCAPING_TEMPLATE))
    assert '\\"ahoy\\"' in text
