"""Request and response models of the HTTP API: OpenAI's fields plus ``priority``,
``speculative`` and ``top_k``.

Requests are strict (no "5" for 5, no 1 for true) and reject unknown fields, as OpenAI
does. OpenAI fields we do not implement are accepted only at their neutral value
(``n=1``, ``logprobs=false``, penalties 0, ...) so a client never silently gets less
than it asked for. Limits that need the tokenizer or the engine (prompt length, context)
are checked in ``prompts.py``. Responses are built in ``streaming.py``; their models
here document the schema (``/openapi.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from speclane.request import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, SpecStats

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_USER_CHARS = 256
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's; chat's default is the rest of the context


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _stop_as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
Stop = Annotated[
    Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None,
    BeforeValidator(_stop_as_list),
    WithJsonSchema({"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS},
        {"type": "array", "maxItems": MAX_STOP_STRINGS,
         "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}},
        {"type": "null"}]}),
]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


def content_text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class StreamOptions(_Strict):
    include_usage: bool = False


class Prediction(_Strict):
    """OpenAI Predicted Outputs: text the answer is expected to repeat; drafts come from it."""

    type: Literal["content"]
    content: Content


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Content
    name: str | None = None  # accepted for compatibility; the chat template does not use it


# Fields OpenAI defines that we accept only at their neutral value. The schema states the
# neutral value; this check (run before it) says why, rather than "should be <= 1".
_NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v in (None, 1), "only n=1 is supported: send n separate requests"),
    "best_of": (lambda v: v in (None, 1), "only best_of=1 is supported: omit the field"),
    "frequency_penalty": (lambda v: v in (None, 0), "not supported: omit it or send 0"),
    "presence_penalty": (lambda v: v in (None, 0), "not supported: omit it or send 0"),
    "logprobs": (lambda v: v is None or v is False or (type(v) is int and v == 0),
                 "not supported: omit the field"),
    "top_logprobs": (lambda v: v in (None, 0), "not supported: omit the field"),
    "logit_bias": (lambda v: v is None or v == {}, "not supported: omit the field"),
    "tools": (lambda v: v is None or v == [], "not supported by this server: omit the field"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "not supported (no tools): omit the field"),
    "response_format": (lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
                        'only {"type": "text"} is supported'),
    "echo": (lambda v: v is None or v is False, "not supported: omit the field"),
    "suffix": (lambda v: v is None or v == "", "not supported: omit the field"),
}


class ResponseFormat(_Strict):
    type: Literal["text"]


class _GenerationRequest(_Strict):
    """The fields both endpoints share."""

    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX, description="0 or -1: no top-k cut")
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    prediction: Prediction | None = None
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX, description="lower is more urgent")
    speculative: bool = Field(default=True, description="false keeps the request out of the lane")
    n: int | None = Field(default=None, ge=1, le=1)
    frequency_penalty: float | None = Field(default=None, ge=0, le=0)
    presence_penalty: float | None = Field(default=None, ge=0, le=0)
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    metadata: dict[str, str] | None = None  # accepted, not stored
    store: bool | None = None  # accepted, nothing is stored
    service_tier: str | None = None  # accepted, ignored: use priority

    @field_validator(*_NEUTRAL, mode="before", check_fields=False)
    @classmethod
    def _only_neutral(cls, value: Any, info: ValidationInfo) -> Any:
        is_neutral, message = _NEUTRAL[info.field_name or ""]
        if not is_neutral(value):
            raise ValueError(message)
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options needs stream=true")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, description="default: the rest of the context")
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: Literal[False] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    tools: Annotated[list[dict[str, Any]], Field(max_length=0)] | None = None
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


TokenIds = list[Annotated[int, Field(ge=0, le=INT32_MAX)]]


PromptText = Annotated[str, StringConstraints(min_length=1)]
PromptIds = Annotated[TokenIds, Field(min_length=1)]


class CompletionRequest(_GenerationRequest):
    prompt: (PromptText | PromptIds | Annotated[list[PromptText], Field(min_length=1, max_length=1)]
             | Annotated[list[PromptIds], Field(min_length=1, max_length=1)]) = Field(
        description="one prompt: a string or a list of token ids (a batch of one is accepted)")
    max_tokens: int | None = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=1, description="null: 16, as OpenAI")
    logprobs: int | None = Field(default=None, ge=0, le=0)
    echo: Literal[False] | None = None
    suffix: Literal[""] | None = None
    best_of: int | None = Field(default=None, ge=1, le=1)

    @model_validator(mode="before")
    @classmethod
    def _one_prompt_per_request(cls, data: Any) -> Any:
        prompt = data.get("prompt") if isinstance(data, dict) else None
        if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list):
            raise ValueError(f"prompt: send one prompt per request (got a batch of {len(prompt)})")
        return data

    @model_validator(mode="after")
    def _unbatch(self) -> CompletionRequest:
        p = self.prompt
        if isinstance(p, list) and isinstance(p[0], str | list):
            self.prompt = p[0]
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return COMPLETION_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


# -- responses ----------------------------------------------------------------------------------


# ``usage.speculative``: the fields of the engine's per-request ``SpecStats``, one source.
_SPEC_TYPES = get_type_hints(SpecStats)
SpeculativeUsage = create_model(
    "SpeculativeUsage", **{f.name: (_SPEC_TYPES[f.name], f.default) for f in dataclasses.fields(SpecStats)}
)


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails = Field(default_factory=CompletionTokensDetails)
    speculative: SpeculativeUsage = Field(default_factory=SpeculativeUsage)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "speclane"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
