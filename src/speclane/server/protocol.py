"""Request and response models of the HTTP API: OpenAI's fields plus ``priority``,
``speculative`` and ``top_k``, and vLLM's structured-output fields (``structured_outputs``
and the older ``guided_*``).

Requests are strict (no "5" for 5, no 1 for true) and reject unknown fields, as OpenAI
does. OpenAI fields we do not implement are accepted only at their neutral value
(``best_of=1``, penalties 0, ...) so a client never silently gets less than it asked
for. Limits that need the tokenizer or the engine (prompt length, context, token ids,
grammars) are checked in ``prompts.py``. Responses are built in ``streaming.py``; their
models here document the schema (``/openapi.json``).
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

from speclane.request import (
    MAX_LOGIT_BIAS,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    SpecStats,
)
from speclane.server.schema_shape import shape_error

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_USER_CHARS = 256
MAX_N = 8  # choices per request
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's cap on the legacy completions' logprobs
MAX_TOOLS = 128  # OpenAI's cap on tools
MAX_STOP_TOKEN_IDS = 64
# The chat template's variables and functions the server sets itself; chat_template_kwargs may not.
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                "raise_exception", "strftime_now"})
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's; chat's default is the rest of the context


class StrictModel(BaseModel):
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


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


def check_parts(role: str, content: object) -> None:
    """A message's list of parts holds one at least (an assistant's tool calls may come with
    none; chat's and Responses' messages alike)."""
    if content == [] and role != "assistant":
        raise ValueError(f"content: a {role} message's list of parts needs at least one part")


def content_text(content: Content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class StreamOptions(StrictModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk's usage is the usage so far (prompt and
    # completion tokens), not null; the last chunk's is the whole request's as ever.
    continuous_usage_stats: bool = False


class Prediction(StrictModel):
    """OpenAI Predicted Outputs: text the answer is expected to repeat; drafts come from it."""

    type: Literal["content"]
    content: Content


class FunctionCall(StrictModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(StrictModel):
    """One message. ``tool_calls`` (and a missing or null ``content``) only on assistant
    messages; ``tool_call_id`` only, and always, on tool messages."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = None  # accepted for compatibility; the chat template does not use it
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # accepted on assistant messages (an earlier refusal)
    # An earlier reply's thinking, as this server returned it; a template that renders it
    # (Qwen3's) gets it, others never see it.
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _fields_of_the_role(self) -> ChatMessage:
        if self.role == "assistant":
            if self.content is None and not self.tool_calls and self.refusal is None:
                raise ValueError("an assistant message needs content or tool_calls")
        elif self.content is None:
            raise ValueError(f"content is required in a {self.role} message")
        else:
            check_parts(self.role, self.content)
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages only")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id belongs to tool messages only")
        if self.refusal is not None and self.role != "assistant":
            raise ValueError("refusal belongs to assistant messages only")
        if self.reasoning_content is not None and self.role != "assistant":
            raise ValueError("reasoning_content belongs to assistant messages only")
        return self

    @property
    def text(self) -> str:
        return "" if self.content is None else content_text(self.content)


class FunctionDefinition(StrictModel):
    name: Annotated[str, StringConstraints(pattern=FUNCTION_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    # true: under "auto" too, calls' arguments are held to ``parameters`` where the model's
    # calls are <tool_call> blocks (tool_grammar.py)
    strict: bool | None = None

    @field_validator("parameters", mode="after")
    @classmethod
    def _a_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and (error := shape_error(value)) is not None:
            raise ValueError(f"not a JSON schema: {error}")
        return value


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(StrictModel):
    name: Annotated[str, StringConstraints(pattern=FUNCTION_NAME)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # none: any JSON object
    strict: bool | None = None  # accepted: the output always matches the schema

    model_config = ConfigDict(populate_by_name=True)  # with StrictModel's strict fields, no unknown ones


class TextFormat(StrictModel):
    type: Literal["text"]


class JSONObjectFormat(StrictModel):
    type: Literal["json_object"]


class JSONSchemaResponseFormat(StrictModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[TextFormat | JSONObjectFormat | JSONSchemaResponseFormat, Field(discriminator="type")]


class StructuredOutputs(StrictModel):
    """vLLM's ``structured_outputs``: exactly one constraint."""

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")  # a schema, or its JSON text
    regex: str | None = None
    choice: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(min_length=1)] | None = None
    grammar: str | None = None  # llguidance's Lark dialect
    json_object: bool | None = None

    model_config = ConfigDict(populate_by_name=True)  # with StrictModel's strict fields, no unknown ones

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, "json_" if name == "json" else name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar or json_object"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("json", "regex", "choice", "grammar", "json_object")
                    if getattr(self, "json_" if name == "json" else name) not in (None, False))


# Fields OpenAI defines that we accept only at their neutral value. The schema states the
# neutral value; this check (run before it) says why, rather than "should be <= 1".
def neutral_values(table: dict[str, tuple[Callable[[Any], bool], str]]) -> Any:
    """A before-validator for the fields of ``table``: each accepts only its neutral value
    and otherwise fails with the table's message (which says why, rather than "should be <= 1")."""

    def check(cls: type, value: Any, info: ValidationInfo) -> Any:
        is_neutral, message = table[info.field_name or ""]
        if not is_neutral(value):
            raise ValueError(message)
        return value

    return field_validator(*table, mode="before", check_fields=False)(check)


_NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "best_of": (lambda v: v in (None, 1), "only best_of=1 is supported: omit the field"),
    "suffix": (lambda v: v is None or v == "", "not supported: omit the field"),
}


class _GenerationRequest(StrictModel):
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
    safety_identifier: str | None = Field(default=None, max_length=MAX_USER_CHARS,
                                          description="OpenAI's end-user id: the tenant where user is absent")
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_USER_CHARS,
                                         description="accepted, not needed: the prefix cache finds shared prefixes")
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None  # accepted, see prompt_cache_key
    prediction: Prediction | None = None
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX, description="lower is more urgent")
    speculative: bool = Field(default=True, description="false keeps the request out of the lane")
    cache_scope: Literal["tenant", "global"] = Field(
        default="tenant", description="'global': read and write the prefix cache shared by every tenant (API keys "
                                      "with may_share_prefix_cache only)")
    n: int | None = Field(default=None, ge=1, le=MAX_N, description=f"1 to {MAX_N} choices")
    frequency_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY,
                                            description="taken off a token's logit per time the output holds it")
    presence_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY,
                                           description="taken off a token's logit once the output holds it")
    repetition_penalty: float | None = Field(
        default=None, gt=0, le=MAX_REPETITION_PENALTY,
        description="vLLM's: the logits of tokens in the prompt or output divided by it (multiplied where negative)")
    min_p: float | None = Field(default=None, ge=0, le=1,
                                description="vLLM's: tokens less likely than min_p times the likeliest are not sampled")
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(max_length=MAX_STOP_TOKEN_IDS)] \
        | None = Field(default=None, description="vLLM's: token ids that end the answer (kept in it)")
    ignore_eos: bool = Field(default=False, description="vLLM's: generate past end-of-sequence tokens, up to "
                                                        "max_tokens (a benchmark's fixed-length answers)")
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX,
                                   description="vLLM's: no stop token or stop string ends the answer before it "
                                               "holds this many tokens")
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = Field(
        default=None, description="token id (as a string) -> bias from -100 to 100, added to the logits")
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = Field(default=None, description="vLLM's: one constraint")
    guided_json: dict[str, Any] | bool | str | None = None  # vLLM's older spellings of structured_outputs
    guided_regex: str | None = None
    guided_choice: Annotated[list[Annotated[str, StringConstraints(min_length=1)]], Field(min_length=1)] | None = None
    guided_grammar: str | None = None
    metadata: dict[str, str] | None = None  # accepted, not stored
    store: bool | None = None  # accepted, nothing is stored
    service_tier: str | None = None  # accepted, ignored: use priority

    _only_neutral = neutral_values(_NEUTRAL)

    @property
    def end_user(self) -> str | None:
        """Who the client says the request is for (``user``, or OpenAI's newer ``safety_identifier``)."""
        return self.user or self.safety_identifier

    @field_validator("n", mode="before")
    @classmethod
    def _n_in_range(cls, value: Any) -> Any:
        if type(value) is int and value > MAX_N:
            raise ValueError(f"at most {MAX_N} choices per request (n={value}): send several requests")
        return value

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"keys are token ids written as decimal strings (got '{key[:20]}')")
            if len(key) > 10:  # past any vocabulary (and int32): no need to read it
                raise ValueError(f"token id '{key[:20]}...' is outside the vocabulary")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: needs stream=true")
        if self.seed is not None and self.seed + self.num_choices - 1 >= 2**63:
            raise ValueError(f"seed: choice i uses seed + i, so with n={self.num_choices} the seed must be "
                             f"below 2**63 - {self.num_choices - 1}")
        given = self.constraint_fields
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give at most one output constraint (got {' and '.join(given)})")
        return self

    @property
    def constraint_fields(self) -> list[str]:
        """The fields that constrain the output, as given (at most one is valid)."""
        fields = [name for name in ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
                                    "guided_grammar") if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type != "text":
            fields.insert(0, "response_format")
        return fields

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, description="default: the rest of the context")
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="extra variables for the model's chat template, e.g. Qwen3's "
                                  "{\"enable_thinking\": false} (vLLM's and llama.cpp's field)")
    add_generation_prompt: bool = Field(default=True, description="vLLM's: the template opens the assistant's turn")
    continue_final_message: bool = Field(
        default=False, description="vLLM's: the reply continues the last message, an assistant message with text "
                                   "(a prefilled start); needs add_generation_prompt false")

    @model_validator(mode="after")
    def _chat_rules(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_completion_tokens: max_tokens asks for another length; send one of the two "
                             "(max_tokens is its older name)")
        names = [tool.function.name for tool in self.tools or ()]
        duplicate = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if duplicate is not None:
            raise ValueError(f"tools: two tools are named '{duplicate}': tool names must be unique")
        reserved = sorted(set(self.chat_template_kwargs or ()) & TEMPLATE_VARIABLES)
        if reserved:
            raise ValueError(f"chat_template_kwargs: '{reserved[0]}' is set by the server: send it in its own field")
        if self.continue_final_message:
            last = self.messages[-1]
            if self.add_generation_prompt:
                raise ValueError("continue_final_message: set add_generation_prompt to false with it (the reply "
                                 "continues the last message instead of opening a turn)")
            if last.role != "assistant" or not last.text.strip() or last.tool_calls:
                raise ValueError("continue_final_message: the last message must be an assistant message with text "
                                 "content (and no tool_calls), the start the reply continues")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: no tool named '{choice.function.name[:64]}' in tools")
        if choice == "required" and not names:
            raise ValueError("tool_choice: 'required' needs at least one tool in tools")
        if (choice == "required" or isinstance(choice, NamedToolChoice)) and self.constraint_fields:
            raise ValueError(f"{self.constraint_fields[0]}: an output constraint cannot be combined with "
                             "tool_choice 'required' or a named function (the output is the tool call)")
        seen: set[str] = set()
        for index, message in enumerate(self.messages):
            ids = [call.id for call in message.tool_calls or ()]
            for at, call_id in enumerate(ids):
                # Within one message a tool result could answer either call; across turns
                # the order says which (some servers number each round's calls from 0).
                if call_id in ids[:at]:
                    raise ValueError(f"messages[{index}]: two tool calls have the id '{call_id[:64]}': each call "
                                     "of a message needs its own id")
            seen.update(ids)
            if message.role == "tool" and message.tool_call_id not in seen:
                raise ValueError(f"messages[{index}]: tool_call_id '{(message.tool_call_id or '')[:64]}' matches no "
                                 "tool call of an earlier assistant message")
        return self

    @property
    def tool_mode(self) -> str:
        """``none`` (no tools offered), ``auto``, ``required``, or ``named``."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

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
    max_tokens: int | None = Field(default=COMPLETION_DEFAULT_MAX_TOKENS, ge=0,
                                   description="null: 16, as OpenAI; 0 with echo: the prompt alone, nothing generated")
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS,
                                 description="the chosen token's logprob and this many alternatives")
    echo: bool | None = Field(default=None, description="the prompt before the answer (with logprobs: the prompt "
                                                         "tokens' logprobs first, the first token's null)")
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

    @model_validator(mode="after")
    def _nothing_generated_only_with_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 asks for the prompt alone, which only echo sends back: send echo: true "
                             "(with logprobs: the prompt's token logprobs), or ask for at least 1 token")
        if self.max_tokens == 0 and self.min_tokens:
            raise ValueError("min_tokens: max_tokens 0 asks for no answer, so min_tokens must be 0")
        return self

    @property
    def echo_only(self) -> bool:
        """``max_tokens`` 0 with ``echo`` (scoring clients' request): the prompt alone."""
        return self.max_tokens == 0 and bool(self.echo)

    @property
    def requested_max_tokens(self) -> int | None:
        # An echo alone still has the engine choose one token (the prompt's last position
        # is computed by a step that samples), which the answer then leaves out.
        if self.echo_only:
            return 1
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
    reasoning_tokens: int | None = None  # where counted (server/reasoning.py)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens read from the prefix cache (their prefill skipped)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(default_factory=CompletionTokensDetails)
    speculative: SpeculativeUsage = Field(default_factory=SpeculativeUsage)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the reply is only tool calls
    reasoning_content: str | None = None  # a reasoning model's thinking (``--reasoning-parser``)
    tool_calls: list[ToolCall] | None = None  # present when the reply calls tools


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobItem(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobItem]
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None = Field(description="stop, length or tool_calls")
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


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
