"""A validated request -> what the engine needs: prompt token ids, sampling, options.

Everything here may reject the request with a 400 that says what to fix: a prompt that
does not fit the context, a ``max_tokens`` past it, a token id outside the vocabulary,
a chat the template refuses, a ``logit_bias`` id outside the vocabulary, a grammar the
engine cannot compile (``constraints.py``). After this step the engine must not be able to fail on
the request: whatever reaches ``add_request`` is in range.

Tokenizing is CPU work proportional to the request (up to the body limit, a few MB), so
``app.py`` runs these functions in a worker thread, off the event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jinja2

from speclane.request import SamplingParams
from speclane.server.constraints import request_grammar
from speclane.server.errors import APIError
from speclane.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    content_text,
)
from speclane.server.reasoning import prompt_opens_thinking
from speclane.server.tool_grammar import Thinking, writes_tagged_calls
from speclane.server.tools import ToolParsing, chat_messages

if TYPE_CHECKING:
    from speclane.grammar.compiler import CompiledGrammar
    from speclane.grammar.spec import GrammarSpec
    from speclane.models.tokenizer import Tokenizer

# OpenAI's default temperature is 1; below this, treat it as greedy (0) — dividing logits
# by a denormal-small temperature overflows to inf and the distribution to NaN.
DEFAULT_TEMPERATURE = 1.0
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class EngineInput:
    """The arguments of ``AsyncEngine.generate`` for one request (the tenant comes from auth)."""

    prompt_token_ids: list[int]
    sampling: SamplingParams  # of choice 0
    priority: int
    speculative: bool
    prediction_token_ids: list[int]
    grammar: CompiledGrammar | None = None
    num_choices: int = 1
    tool_parsing: ToolParsing = "none"  # how replies are read (tools.py)
    tool_names: tuple[str, ...] = ()
    single_call: bool = False  # parallel_tool_calls false: at most one call is read
    top_logprobs: int | None = None  # alternatives to report per token; None: no logprobs
    echo_text: str | None = None  # completions' echo: the prompt's text, sent before the answer
    echo_only: bool = False  # completions' echo with max_tokens 0: the prompt alone, the answer left out
    opens_thinking: bool = False  # the rendered chat prompt ends inside <think> (reasoning.py)

    def sampling_for(self, choice: int) -> SamplingParams:
        """Choice i samples with seed + i (vLLM's convention), so it equals a single request with that seed."""
        if choice == 0:
            return self.sampling
        # Choices past the first read the first's prompt KV: its prompt logprobs serve all.
        seed = None if self.sampling.seed is None else self.sampling.seed + choice
        return dataclasses.replace(self.sampling, seed=seed, prompt_logprobs=None)


@dataclass(frozen=True)
class Vocabulary:
    """What the tokenizer and model accept: the tokenizer, the context and the id range."""

    tokenizer: Tokenizer
    max_model_len: int
    vocab_size: int  # ids must be < this (the smaller of the tokenizer's and the model's)
    compile_grammar: Callable[[GrammarSpec], CompiledGrammar] | None = None  # the engine's
    reasoning: bool = False  # replies' thinking blocks are read apart (--reasoning-parser)

    def check_ids(self, ids: Iterable[int], param: str, *, indexed: bool = False) -> None:
        """A 400 naming the first of ``ids`` outside the vocabulary: as ``param[i]`` where
        ``indexed`` (a list the client sent), else as ``param``."""
        for index, token in enumerate(ids):
            if not 0 <= token < self.vocab_size:
                where = f"{param}[{index}]" if indexed else param
                raise APIError(400, f"{where}: token id {token} is outside the vocabulary (0 to {self.vocab_size - 1})",
                               param=param)


def chat_input(request: ChatCompletionRequest, vocab: Vocabulary) -> EngineInput:
    prompt = render_chat(request, vocab.tokenizer)
    prompt_ids = vocab.tokenizer.encode(prompt, add_special_tokens=False)
    opens_thinking = prompt_opens_thinking(prompt)
    thinking: Thinking = "none" if not vocab.reasoning else "open" if opens_thinking else "may"
    tagged = thinking if writes_tagged_calls(vocab.tokenizer.chat_template) else None
    engine_input = _engine_input(request, prompt_ids, vocab, tagged_calls=tagged, opens_thinking=opens_thinking)
    mode = request.tool_mode
    if mode == "none":
        return engine_input
    # Under "auto" a grammar (strict tools' calls, or calls or a JSON answer) holds the
    # <tool_call> blocks: they are the calls, and bare JSON is never read as one (it was
    # not held to a tool's schema; beside a JSON answer, it is the answer).
    parsing: ToolParsing = "forced" if mode != "auto" else "auto" if engine_input.grammar is None else "tagged"
    if parsing == "forced" and engine_input.sampling.stop:
        # A forced reply is its calls, markup and arguments: a stop string found in them (an
        # agent's "\n") would cut the call and leave an empty answer that says it stopped.
        engine_input = dataclasses.replace(engine_input, sampling=dataclasses.replace(engine_input.sampling, stop=()))
    return dataclasses.replace(engine_input, tool_parsing=parsing, single_call=request.parallel_tool_calls is False,
                               tool_names=tuple(t.function.name for t in request.tools or ()))


def completion_input(request: CompletionRequest, vocab: Vocabulary) -> EngineInput:
    prompt = request.prompt
    if isinstance(prompt, str):
        prompt_ids = vocab.tokenizer.encode_prompt(prompt)
    else:
        prompt_ids = list(prompt)  # type: ignore[arg-type]  # one prompt after validation
        vocab.check_ids(prompt_ids, "prompt", indexed=True)  # type: ignore[arg-type]
    engine_input = _engine_input(request, prompt_ids, vocab)  # type: ignore[arg-type]
    if not request.echo:
        return engine_input
    if request.logprobs is not None and request.num_choices > 1:
        raise APIError(400, "echo with logprobs takes one choice: send n=1 (the prompt's logprobs are the same in "
                            "every choice)", param="n")
    text = prompt if isinstance(prompt, str) else vocab.tokenizer.decode(prompt_ids, skip_special_tokens=False)
    sampling = dataclasses.replace(engine_input.sampling, prompt_logprobs=engine_input.top_logprobs)
    return dataclasses.replace(engine_input, echo_text=text, echo_only=request.echo_only, sampling=sampling)


def render_chat(request: ChatCompletionRequest, tokenizer: Tokenizer) -> str:
    """The chat prompt the model's template renders from the request's messages, tools and
    ``chat_template_kwargs``; a template that refuses them is a 400."""
    rendered = _apply_template(request, tokenizer)
    _check_instructions_kept(request, tokenizer)
    return _continuing(rendered) if request.continue_final_message else rendered


def _apply_template(request: ChatCompletionRequest, tokenizer: Tokenizer) -> str:
    offered = request.tools or () if request.tool_mode != "none" else ()
    messages, variables = chat_messages(request.messages, offered, tokenizer)
    if request.continue_final_message:
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + CONTINUE_HERE}
    extra = request.chat_template_kwargs or {}
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=request.add_generation_prompt,
                                             **{**extra, **variables})
    except jinja2.TemplateError as exc:
        raise APIError(400, f"the model's chat template rejected the messages: {exc}", param="messages") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        if not extra:
            raise  # the template's own fault with the request's messages alone: a server error
        # A variable of a type the template does not expect (a number where it adds text).
        raise APIError(400, f"the model's chat template failed with chat_template_kwargs: {type(exc).__name__}: "
                            f"{exc}", param="chat_template_kwargs") from None


_PROBE = "speclane-instructions-probe-"  # plain ASCII: a template's escaping or trimming leaves it whole


def _check_instructions_kept(request: ChatCompletionRequest, tokenizer: Tokenizer) -> None:
    """A 400 where a chat of instructions alone lost them: some templates (Gemma's) write a
    system message only into the first user turn, so with none the prompt is empty of it.
    Rendered once more with each message's text a probe, so a template that escapes or
    trims the text is not taken for one that leaves it out."""
    if any(m.role not in ("system", "developer") for m in request.messages):
        return
    probes = [m.model_copy(update={"content": f"{_PROBE}{i}"}) for i, m in enumerate(request.messages)]
    rendered = _apply_template(request.model_copy(update={"messages": probes}), tokenizer)
    for index, message in enumerate(request.messages):
        if message.text.strip() and f"{_PROBE}{index}" not in rendered:
            raise APIError(400, f"the model's chat template leaves out a {message.role} message when no user message "
                                "follows it: send the request as a user message, or add one",
                           param=f"messages[{index}]")


# Written after the last message's text for continue_final_message: the rendered chat is
# cut where it is, so what the template writes after the text (the end of the turn) goes,
# wherever that text also occurs (a message "end" is inside ChatML's "<|im_end|>").
CONTINUE_HERE = "\u2063<speclane:continue-here>\u2063"


def _continuing(rendered: str) -> str:
    """The chat rendered with ``CONTINUE_HERE`` after its last message, cut there."""
    if rendered.count(CONTINUE_HERE) != 1:
        raise APIError(400, "continue_final_message: the model's chat template does not write the last message's "
                            "text as it is, so the reply cannot continue it", param="messages")
    return rendered[: rendered.index(CONTINUE_HERE)]


def _engine_input(request: ChatCompletionRequest | CompletionRequest, prompt_ids: list[int],
                  vocab: Vocabulary, *, tagged_calls: Thinking | None = None, opens_thinking: bool = False) -> (
        EngineInput):
    """The request's engine input; ``opens_thinking``: the rendered prompt ends inside
    ``<think>``, kept where the reply's start is free (no grammar decides it)."""
    num_prompt = len(prompt_ids)
    if num_prompt == 0:
        raise APIError(400, "the prompt is empty: send at least one token of text", param="prompt")
    room = vocab.max_model_len - num_prompt
    if room < 1:
        raise APIError(400, f"the prompt has {num_prompt} tokens but the context is {vocab.max_model_len} "
                            "tokens: shorten the prompt (at least one token must be left for the answer)",
                       param="messages" if isinstance(request, ChatCompletionRequest) else "prompt",
                       code="context_length_exceeded")
    requested = request.requested_max_tokens
    if (isinstance(request, CompletionRequest) and requested is not None
            and ("max_tokens" not in request.model_fields_set or request.max_tokens is None)):
        requested = min(requested, room)  # the default (16) shrinks to fit, as vLLM's does: the client asked for none
    if requested is not None and requested > room:
        field = ("max_completion_tokens" if isinstance(request, ChatCompletionRequest)
                 and request.max_completion_tokens is not None else "max_tokens")
        raise APIError(400, f"{field} is {requested} but the prompt has {num_prompt} tokens and the context is "
                            f"{vocab.max_model_len}: ask for at most {room}", param=field,
                       code="context_length_exceeded")
    prediction_ids: list[int] = []
    if request.prediction is not None:
        prediction_ids = vocab.tokenizer.encode(content_text(request.prediction.content))
        if len(prediction_ids) > vocab.max_model_len:
            raise APIError(400, f"the prediction has {len(prediction_ids)} tokens, more than the context "
                                f"({vocab.max_model_len}): send at most the text you expect back",
                           param="prediction")
    vocab.check_ids((int(key) for key in request.logit_bias or {}), "logit_bias")
    vocab.check_ids(request.stop_token_ids or (), "stop_token_ids")
    output = None
    if request.constraint_fields or (isinstance(request, ChatCompletionRequest) and request.tool_mode != "none"):
        if vocab.compile_grammar is None:
            raise APIError(400, "this server has no grammar engine: omit the output constraint")
        output = request_grammar(request, vocab.compile_grammar, tagged_calls=tagged_calls)
    top = _top_logprobs(request)
    return EngineInput(
        prompt_token_ids=prompt_ids,
        sampling=sampling_params(request, max_tokens=requested if requested is not None else room, logprobs=top),
        priority=request.priority,
        speculative=request.speculative,
        prediction_token_ids=prediction_ids,
        grammar=output.compiled if output is not None else None,
        num_choices=request.num_choices,
        top_logprobs=top,
        # A grammar decides the reply from its first token: it is the answer even where the
        # template opened <think> (it cannot close a block it never let the model write).
        opens_thinking=opens_thinking and (output is None or output.free_text_first),
    )


def _top_logprobs(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    if isinstance(request, ChatCompletionRequest):
        return (request.top_logprobs or 0) if request.logprobs else None
    return request.logprobs


def sampling_params(request: ChatCompletionRequest | CompletionRequest, *, max_tokens: int,
                    logprobs: int | None = None) -> SamplingParams:
    temperature = DEFAULT_TEMPERATURE if request.temperature is None else request.temperature
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    top_k = request.top_k or 0
    if (request.min_tokens or 0) > max_tokens:
        raise APIError(400, f"min_tokens ({request.min_tokens}) is more than the answer may hold ({max_tokens} tokens: "
                            "max_tokens, or what the context leaves after the prompt)", param="min_tokens")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=max(top_k, 0),
            seed=request.seed,
            stop=tuple(request.stop or ()),
            logprobs=logprobs,
            logit_bias=tuple((int(key), bias) for key, bias in (request.logit_bias or {}).items()),
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
            min_p=request.min_p or 0.0,
            stop_token_ids=tuple(request.stop_token_ids or ()),
            ignore_eos=request.ignore_eos,
            min_tokens=request.min_tokens or 0,
        )
    except ValueError as exc:  # the protocol's bounds should already have caught it
        raise APIError(400, str(exc)) from None
