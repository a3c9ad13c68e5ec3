"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's endpoints, the same fields): a prompt's
or a chat's token ids exactly as the generation endpoints would send them to the engine,
and token ids back to text, without generating.

Clients count a conversation's tokens before sending it (to trim it to the context, or to
bill it) and check what a chat template renders; the count must be the server's own, not
an estimate from another tokenizer. A ``prompt`` is encoded as ``/v1/completions`` encodes
it (with BOS where the model asks for one), ``messages`` (with ``tools`` and
``chat_template_kwargs``) as ``/v1/chat/completions`` renders them; ``add_special_tokens``
true or false encodes the text with or without the tokenizer's special tokens instead.
Like the prompt functions, these run in a worker thread (``app.py``): tokenizing is CPU
work proportional to the body.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from speclane.server.errors import APIError, validation_message
from speclane.server.prompts import Vocabulary, render_chat
from speclane.server.protocol import (
    INT32_MAX,
    MAX_TOOLS,
    ChatCompletionRequest,
    ChatMessage,
    StrictModel,
    Tool,
)

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class TokenizeRequest(StrictModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # default true (with messages)
    continue_final_message: bool = False
    add_special_tokens: bool | None = Field(
        default=None, description="default: as the generation endpoints encode; true or false: with or without "
                                  "the tokenizer's special tokens")
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt (text) or messages (a chat), not both and not neither")
        if self.prompt is not None and (self.tools or self.chat_template_kwargs or self.continue_final_message
                                        or self.add_generation_prompt is not None):
            raise ValueError("tools, chat_template_kwargs, add_generation_prompt and continue_final_message go with "
                             "messages, not with prompt")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(StrictModel):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize(request: TokenizeRequest, vocab: Vocabulary) -> TokenizeResponse:
    tokenizer = vocab.tokenizer
    if request.messages is not None:
        try:  # the chat endpoint's rules (unique tool names, tool results that answer a call, ...)
            chat = ChatCompletionRequest(model=request.model or "", messages=request.messages, tools=request.tools,
                                         chat_template_kwargs=request.chat_template_kwargs,
                                         add_generation_prompt=request.add_generation_prompt is not False,
                                         continue_final_message=request.continue_final_message)
        except ValidationError as exc:
            message, param = validation_message(exc.errors())
            raise APIError(400, message, param=param) from None
        text = render_chat(chat, tokenizer)
        ids = tokenizer.encode(text, add_special_tokens=bool(request.add_special_tokens))
    else:
        assert request.prompt is not None  # _one_input
        ids = (tokenizer.encode_prompt(request.prompt) if request.add_special_tokens is None
               else tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
    strs = [tokenizer.id_to_token(token) or "" for token in ids] if request.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=vocab.max_model_len, tokens=ids, token_strs=strs)


def detokenize(request: DetokenizeRequest, vocab: Vocabulary) -> DetokenizeResponse:
    vocab.check_ids(request.tokens, "tokens", indexed=True)
    return DetokenizeResponse(prompt=vocab.tokenizer.decode(request.tokens, skip_special_tokens=False))
