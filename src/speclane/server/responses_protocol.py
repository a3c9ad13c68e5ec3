"""The Responses API's request and response models (``POST /v1/responses``).

Requests are strict, as the chat endpoint's are: unknown fields, non-function tools and
the stateful fields (``previous_response_id``, ``store: true``) are 400s that say why.
The response models document the schema in ``/openapi.json``; the bodies themselves are
built as dicts in ``responses_output.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from speclane.server.protocol import (
    INT32_MAX,
    INT32_MIN,
    MAX_USER_CHARS,
    StrictModel,
    check_parts,
    neutral_values,
)

STATELESS = ("this server is stateless and stores no responses: send the whole conversation "
             "(earlier messages, function calls and their outputs) in 'input'")
MAX_NAME_CHARS = 64  # of a tool type named in an error message




class _Strict(StrictModel):
    model_config = ConfigDict(populate_by_name=True)  # with the base's strict fields, no unknown ones


# -- request ---------------------------------------------------------------------------------


class InputText(_Strict):
    """A text part of an input message; ``output_text`` parts (an earlier answer sent back)
    may carry the ``annotations`` and ``logprobs`` they came with, which are ignored."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None  # an earlier output item sent back: accepted, not used
    status: ItemStatus | None = None

    @model_validator(mode="after")
    def _parts_if_a_list(self) -> InputMessage:
        check_parts(self.role, self.content)
        return self


class FunctionCallItem(_Strict):
    """A function call the model made earlier (an output item sent back as input)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Strict):
    """The result of a function call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: ItemStatus | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    """A reasoning model's earlier thinking (an output item sent back): it becomes the
    ``reasoning_content`` of the assistant turn that follows it."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None  # another server's: this one cannot read it
    status: ItemStatus | None = None

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content or self.summary)


_ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")


def _item_kind(value: Any) -> str | None:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _ITEM_KINDS else None


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind, custom_error_type="input_item_type",
                  custom_error_message="an input item is a message ({\"role\", \"content\"}), a "
                                       "'function_call', a 'function_call_output' or a 'reasoning' item"),
]


def _input_kind(value: Any) -> str | None:
    return "str" if isinstance(value, str) else "list" if isinstance(value, list) else None


Input = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("str")]
    | Annotated[Annotated[list[InputItem], Field(min_length=1)], Tag("list")],
    Discriminator(_input_kind, custom_error_type="input_type",
                  custom_error_message="input is a string or a list of items"),
]


class FunctionTool(_Strict):
    """Responses' flat function tool; chat nests the same fields under ``function``."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str


class FormatText(_Strict):
    type: Literal["text"]


class FormatJSONObject(_Strict):
    type: Literal["json_object"]


class FormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[FormatText | FormatJSONObject | FormatJSONSchema, Field(discriminator="type")]


class TextConfig(_Strict):
    format: TextFormat | None = None


# Fields OpenAI defines that only their neutral value fits here: (is it neutral, why not).
_NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "previous_response_id": (lambda v: v is None, STATELESS),
    "store": (lambda v: v is None or v is False, STATELESS + "; omit 'store' or send false"),
    "background": (lambda v: v is None or v is False, "not supported: omit the field"),
    "truncation": (lambda v: v in (None, "disabled"), "only 'disabled' is supported: shorten the input instead"),
    "include": (lambda v: v is None or v == [], "not supported: omit the field"),
    "reasoning": (lambda v: v is None, "not supported by this model: omit the field"),
    "top_logprobs": (lambda v: v in (None, 0), "not supported: omit the field"),
}


class ResponsesRequest(_Strict):
    model: str
    input: Input
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, description="default: the rest of the context")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX, description="0 or -1: no top-k cut")
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = Field(default=None, max_length=MAX_USER_CHARS)
    safety_identifier: str | None = Field(default=None, max_length=MAX_USER_CHARS)  # the tenant where user is absent
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_USER_CHARS)  # accepted, not needed
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None  # accepted, not needed
    metadata: dict[str, str] | None = None  # echoed, not stored
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX, description="lower is more urgent")
    speculative: bool = Field(default=True, description="false keeps the request out of the lane")
    cache_scope: Literal["tenant", "global"] = Field(
        default="tenant", description="'global': read and write the prefix cache shared by every tenant (API keys "
                                      "with may_share_prefix_cache only)")
    service_tier: str | None = None  # accepted, ignored: use priority
    previous_response_id: None = Field(default=None, description="stateless: must be null")
    store: Literal[False] | None = Field(default=None, description="stateless: false or absent")
    background: Literal[False] | None = None
    truncation: Literal["disabled"] | None = None
    include: Annotated[list[str], Field(max_length=0)] | None = None
    reasoning: None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=0)

    _only_neutral = neutral_values(_NEUTRAL)

    @field_validator("tools", mode="before")
    @classmethod
    def _only_function_tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            for index, tool in enumerate(value):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind != "function":
                    raise ValueError(f"tools[{index}] has type '{kind[:MAX_NAME_CHARS]}', which this server "
                                     "does not support: only {\"type\": \"function\"} tools are")
        return value

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _only_function_choice(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError('only "none", "auto", "required" or {"type": "function", "name"} are supported')
        return value


# -- response models (the schema in /openapi.json) -------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputRefusal(BaseModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[Annotated[OutputText | OutputRefusal, Field(discriminator="type")]]


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    status: ItemStatus
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    speculative: dict[str, Any] | None = None


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: float
    completed_at: float | None
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[Annotated[OutputReasoning | OutputMessage | OutputFunctionCall, Field(discriminator="type")]]
    usage: ResponseUsage | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]
    metadata: dict[str, str]
    user: str | None
    previous_response_id: None
    store: bool
    background: bool
    truncation: str
    reasoning: None
    service_tier: str
    top_logprobs: int
