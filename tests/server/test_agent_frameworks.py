"""Agent frameworks against the real server and model: ``langchain-openai`` (tools bound
with ``tool_choice="required"``, structured output by JSON schema) and ``openai-agents``
(an agent that calls a Python tool, then answers in text)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field
from server_helpers import MODEL, LiveServer

from speclane.engine.async_engine import AsyncEngine

pytestmark = pytest.mark.slow


class Capital(BaseModel):
    country: str = Field(max_length=24)
    capital: str = Field(max_length=24)


def test_langchain_tools_and_structured_output(live: LiveServer, idle_after: AsyncEngine) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    chat = ChatOpenAI(base_url=live.url + "/v1", api_key="unused", model=MODEL, temperature=0,  # type: ignore[arg-type]
                      max_tokens=64, max_retries=0, timeout=120)  # type: ignore[call-arg]
    reply = chat.bind_tools([add], tool_choice="required").invoke("What is 2 plus 3?")
    assert reply.tool_calls, reply  # type: ignore[attr-defined]
    call = reply.tool_calls[0]  # type: ignore[attr-defined]
    assert call["name"] == "add" and isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)
    assert add.invoke(call["args"]) == call["args"]["a"] + call["args"]["b"]
    structured = chat.with_structured_output(Capital, method="json_schema").invoke("What is the capital of France?")
    assert isinstance(structured, Capital)


def test_openai_agents_runner_calls_the_tool_then_answers(live: LiveServer, idle_after: AsyncEngine) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((a, b))
        return a + b

    async def main() -> object:
        client = AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        try:
            agent = Agent(name="calculator", instructions="Use the add tool to add numbers.", tools=[add],
                          model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                          model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48))
            result = await Runner.run(agent, "What is 2 plus 3?", max_turns=4)
            return result.final_output
        finally:
            await client.close()

    output = asyncio.run(main())
    assert seen and all(isinstance(a, int) and isinstance(b, int) for a, b in seen), seen
    assert isinstance(output, str) and output
