"""vLLM's ``continue_final_message`` and ``add_generation_prompt`` on a real server: the
reply continues a prefilled assistant message exactly as a completion of the rendered
prompt would, the prompt ends with that text (no end of turn), and misuse is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import tokenizers
from server_helpers import MODEL, LiveServer
from tokenizers import models

from speclane.models.tokenizer import Tokenizer
from speclane.server.errors import APIError
from speclane.server.prompts import render_chat
from speclane.server.protocol import ChatCompletionRequest

PREFILLED = [{"role": "user", "content": "List three colours as a JSON array."},
             {"role": "assistant", "content": '["red", "'}]


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def rendered_ids(http: httpx.Client, **fields: Any) -> list[int]:
    response = http.post("/tokenize", json={"model": MODEL, **fields})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_the_reply_continues_the_prefilled_message(http: httpx.Client) -> None:
    ids = rendered_ids(http, messages=PREFILLED, add_generation_prompt=False, continue_final_message=True)
    prompt = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert prompt.endswith('<|im_start|>assistant\n["red", "'), "cut right after the prefilled text"
    chat = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": PREFILLED, "add_generation_prompt": False, "continue_final_message": True,
        "max_tokens": 16, "temperature": 0}).json()
    completion = http.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 16,
                                                    "temperature": 0}).json()
    assert chat["usage"]["prompt_tokens"] == len(ids)
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
    assert not chat["choices"][0]["message"]["content"].startswith("["), "the reply does not start over"


def test_add_generation_prompt_false_leaves_the_assistant_turn_unopened(http: httpx.Client) -> None:
    question = PREFILLED[:1]
    opened = rendered_ids(http, messages=question)
    unopened = rendered_ids(http, messages=question, add_generation_prompt=False)
    assert opened[: len(unopened)] == unopened and len(opened) > len(unopened)
    closed = rendered_ids(http, messages=PREFILLED, add_generation_prompt=False)
    text = http.post("/detokenize", json={"tokens": closed}).json()["prompt"]
    assert text.rstrip().endswith("<|im_end|>"), "without continue_final_message the last turn is closed"


@pytest.mark.parametrize(("fields", "words"), [
    ({"messages": PREFILLED, "continue_final_message": True}, "add_generation_prompt to false"),
    ({"messages": PREFILLED[:1], "continue_final_message": True, "add_generation_prompt": False},
     "must be an assistant message"),
    ({"messages": [*PREFILLED[:1], {"role": "assistant", "content": "  "}], "continue_final_message": True,
      "add_generation_prompt": False}, "must be an assistant message"),
])
def test_misuse_is_a_400(http: httpx.Client, fields: dict[str, Any], words: str) -> None:
    for path in ("/v1/chat/completions", "/tokenize"):
        response = http.post(path, json={"model": MODEL, "max_tokens": 4, **fields} if path != "/tokenize"
                             else {"model": MODEL, **fields})
        assert response.status_code == 400, response.text
        assert words in response.json()["error"]["message"]


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA_LIKE = ("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
TWICE = "{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}"


def rendered(template: str, final: str) -> str:
    backend = tokenizers.Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    request = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": final}],
        "add_generation_prompt": False, "continue_final_message": True})
    return render_chat(request, Tokenizer(backend, bos_token_id=None, eos_token_id=0, chat_template=template))


def test_the_prompt_is_cut_right_after_the_last_messages_text() -> None:
    assert rendered(CHATML, "The end") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe end", \
        "not inside <|im_end|>, where 'end' occurs last"
    assert rendered(GEMMA_LIKE, " Sure, ").endswith("<start_of_turn>assistant\nSure, "), \
        "a trimming template keeps the text's end: the reply continues after its space"
    with pytest.raises(APIError, match="does not write the last message's text as it is"):
        rendered(TWICE, "Sure")
