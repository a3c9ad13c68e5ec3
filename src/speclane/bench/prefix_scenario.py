"""``speclane bench prefix``: a 10-turn chat over HTTP with a long system prompt, time to
first token per turn with the prefix cache on and off, beside llama.cpp's server.

A chat client resends the whole history every turn: the system prompt (about 1,000
tokens), every earlier question and answer, then the new question. With the prefix cache
a turn reads the history's full KV blocks from the cache and prefills only what is new
(the previous answer and the new question); without it every turn prefills everything.
The arms: ``speclane serve`` (cache on, the default), ``speclane serve
--no-prefix-cache``, and llama.cpp's ``llama-server`` with ``--cache-reuse`` on the same
GGUF when a build is found (one slot: it keeps the slot's KV and reuses the common
prefix). Each run is a new conversation (its system prompt opens with the run's number,
so a run reads no other run's blocks beyond the chat template's first few tokens); the arms alternate, greedy, the same questions and
``max_tokens``; the table reports each turn's median time to first token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from speclane.bench.common import Table, alternate, median
from speclane.bench.driver import progress
from speclane.bench.llama_cpp import find_llama_cpp_tool, llama_server
from speclane.bench.servers import speclane_server
from speclane.config import EngineConfig

MAX_TOKENS = 24
CACHE_REUSE_CHUNK = 256  # llama-server --cache-reuse: the smallest chunk it shifts and reuses
TURN_TARGET = 0.2  # turn 2+ with the cache, as a fraction of the same turn without it

RULES = [
    "Greet the customer by name when they give one, and keep the greeting to a few words.",
    "Quote prices in euros with two decimals and say whether value-added tax is included.",
    "Never promise a delivery date; give the usual range of three to five working days instead.",
    "Refunds are possible within thirty days of delivery for unused items in their packaging.",
    "Power tools carry a two-year warranty; batteries and chargers carry one year.",
    "Recommend safety glasses and gloves whenever the question is about cutting or drilling.",
    "If a customer asks about an order, ask for the order number, which starts with the letter H.",
    "Do not discuss competitors' prices; say that the shop matches verified online prices.",
    "The shop opens at eight in the morning and closes at six in the evening, Monday to Saturday.",
    "Click-and-collect orders are ready two hours after payment at the counter near the entrance.",
    "Paint can be mixed to any colour code in the store while the customer waits.",
    "Timber is cut to size for free for the first five cuts, then fifty cents per cut.",
    "Gift cards never expire and can be used online and in the shop.",
    "For electrical work beyond replacing a fitting, advise the customer to hire a licensed electrician.",
    "Keep answers short: one or two sentences unless the customer asks for detail.",
    "Rental tools need an identity document and a deposit of one hundred euros.",
    "Garden furniture is seasonal: it is sold from March to September.",
    "Screws, nails and anchors are sold loose by weight and in boxes of one hundred.",
    "Tile cutters and wet saws can be rented by the day or by the weekend.",
    "Customers can return tool rentals to any branch of the shop in the same city.",
    "Answer in the customer's language when it is English, French, German or Spanish.",
    "If you do not know an answer, say so and offer to connect the customer with a staff member.",
    "Loyalty members get five percent off everything except gift cards and rentals.",
    "Damaged deliveries must be reported within forty-eight hours with a photograph.",
    "Heavy items over thirty kilograms are delivered to the kerb, not carried inside.",
    "The workshop runs free classes on Saturday mornings; booking is required.",
    "Keys are cut while the customer waits; security keys need the owner's card.",
    "Propane cylinders are exchanged, not refilled, at the yard behind the shop.",
    "Trade customers with an account pay by invoice within thirty days.",
    "Never ask for a full card number in chat; payments happen at checkout only.",
    "Sandpaper grits run from forty for stripping to two hundred and forty for finishing.",
    "Outdoor wood stain needs two coats and a dry forecast of at least twenty-four hours.",
    "Ladders over three metres come with a free stabiliser bar this month.",
    "Offer the paint calculator link when customers ask how much paint they need.",
    "Say thank you at the end of the conversation, once, not after every answer.",
    "Wallpaper rolls should be bought from the same batch number to avoid colour differences.",
    "Cement and plaster are sold in bags of twenty-five kilograms; pallets get a discount.",
    "Explain that cordless drill kits include two batteries unless the listing says 'bare tool'.",
    "Lawn mower servicing takes about a week in spring and two days in autumn.",
    "Water heaters are installed only by the shop's partner plumbers, booked at the counter.",
    "The car park has charging points for electric cars, free for the first hour.",
    "Plants come with a thirty-day guarantee if the care instructions were followed.",
    "Insulation rolls are priced per square metre; quote the area covered, not the roll.",
    "Kitchen fitting appointments are booked in the design studio on the first floor.",
    "Any complaint about staff goes to the store manager; give the customer service email.",
    "Bathroom tiles are stocked in the warehouse; special orders take two weeks to arrive.",
    "Extension cables sold in the shop are rated for outdoor use only when the label says so.",
    "Fence panels come in heights of ninety centimetres, one metre twenty and one metre eighty.",
]

QUESTIONS = [
    "Hi, do you sell cordless drills?",
    "How long is the warranty on one?",
    "Can I return it if I never open it?",
    "What time do you open on Saturday?",
    "Can you cut a plank to size for me?",
    "How much does it cost after five cuts?",
    "Do you rent tile cutters?",
    "What do I need to bring to rent one?",
    "Is there a discount for loyalty members?",
    "Thanks, that is all for today.",
]


def system_prompt(conversation: int) -> str:
    return f"Conversation {conversation}. You are the help desk of a hardware shop. Follow these rules.\n" + "\n".join(
        f"{i + 1}. {rule}" for i, rule in enumerate(RULES))


def first_token_s(client: Any, model: str, messages: list[dict[str, str]], extra: dict[str, Any] | None
                  ) -> tuple[float, str, int, int]:
    """One streamed greedy turn: seconds from sending to the first content token, the
    answer, its prompt tokens and cached prompt tokens (0 where the server reports none)."""
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    prompt_tokens = cached = 0
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS,
                                            stream=True, stream_options={"include_usage": True}, extra_body=extra)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - started
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
    return (first if first is not None else time.perf_counter() - started), "".join(parts), prompt_tokens, cached


def conversation(url: str, model: str, number: int, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The 10 turns of conversation ``number``: per turn its TTFT, prompt and cached tokens."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
    messages = [{"role": "system", "content": system_prompt(number)}]
    turns = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        ttft, answer, prompt_tokens, cached = first_token_s(client, model, messages, extra)
        messages.append({"role": "assistant", "content": answer})
        turns.append({"ttft_s": ttft, "prompt_tokens": prompt_tokens, "cached_tokens": cached, "answer": answer})
    return turns


def prefix(config: EngineConfig, quick: bool = False) -> list[Table]:
    from speclane.models.loader import resolve_model

    threads = config.model.num_threads or 2
    model = config.model.model
    binary = find_llama_cpp_tool("llama-server")
    repeats = 1 if quick else 3
    runs: dict[str, list[list[dict[str, Any]]]] = {}

    def arm(name: str, url: str) -> Callable[[], float]:
        def run() -> float:
            turns = conversation(url, model, len(runs.setdefault(name, [])))
            runs[name].append(turns)
            return sum(t["ttft_s"] for t in turns)
        return run

    with contextlib.ExitStack() as stack:
        cached_url = stack.enter_context(speclane_server(config)).url
        uncached_url = stack.enter_context(speclane_server(config, ["--no-prefix-cache"])).url
        arms = {"speclane, prefix cache": arm("speclane, prefix cache", cached_url),
                "speclane --no-prefix-cache": arm("speclane --no-prefix-cache", uncached_url)}
        if binary is not None:
            theirs = stack.enter_context(llama_server(binary, resolve_model(model), threads, context=4096,
                                                      extra=["--cache-reuse", str(CACHE_REUSE_CHUNK)])).url
            arms[f"llama.cpp --cache-reuse {CACHE_REUSE_CHUNK}"] = arm(f"llama.cpp --cache-reuse {CACHE_REUSE_CHUNK}",
                                                                       theirs)
        progress("prefix: " + ", ".join(arms))
        alternate(arms, repeats=repeats)
    measured = {name: conversations[1:] for name, conversations in runs.items()}  # the first is the warm-up
    return [_turn_table(measured, threads, repeats, binary is not None)]


def _turn_table(measured: dict[str, list[list[dict[str, Any]]]], threads: int, repeats: int,
                with_llama_cpp: bool) -> Table:
    names = list(measured)
    on, off = names[0], names[1]
    columns = ["turn", "prompt tokens", "cached tokens", "TTFT s, cache", "TTFT s, no cache", "cache / no cache"]
    if with_llama_cpp:
        columns += [f"TTFT s, {names[2]}", "llama.cpp / speclane cache"]
    table = Table("Prefix cache: time to first token per turn of a 10-turn chat with a ~1,000-token system prompt",
                  columns)
    ratios = []
    for turn in range(len(QUESTIONS)):
        ttft = {name: median([conv[turn]["ttft_s"] for conv in convs]) for name, convs in measured.items()}
        ratio = ttft[on] / ttft[off]
        if turn:
            ratios.append(ratio)
        row: list[Any] = [turn + 1, measured[on][0][turn]["prompt_tokens"], measured[on][0][turn]["cached_tokens"],
                          ttft[on], ttft[off], ratio]
        if with_llama_cpp:
            row += [ttft[names[2]], ttft[names[2]] / ttft[on]]
        table.add(*row)
    same = all(a["answer"] == b["answer"] for x, y in zip(measured[on], measured[off], strict=True)
               for a, b in zip(x, y, strict=True))
    table.notes.append(f"Turns 2-{len(QUESTIONS)}: cache / no cache TTFT at most {max(ratios):.2f}, median "
                       f"{median(ratios):.2f} (target: at most {TURN_TARGET}). Answers with the cache on and off "
                       f"{'are identical' if same else 'DIFFER'} in every turn.")
    table.notes.append(f"Median of {repeats} conversations per arm after a warm-up conversation, arms alternating; each "
                       f"conversation has its own system prompt (a run reads no other run's cache beyond the chat template's "
                       f"first few tokens). Greedy, max_tokens "
                       f"{MAX_TOKENS}, streamed with the openai client; TTFT is sending to the first content token. "
                       f"Both servers on {threads} threads.")
    if with_llama_cpp:
        table.notes.append(f"llama-server: one slot, -c 4096, --cache-reuse {CACHE_REUSE_CHUNK} (and its default "
                           "cache_prompt, which keeps the slot's KV for the common prefix). Its prompt tokens differ "
                           "slightly (its own chat template and answers).")
    else:
        table.notes.append("llama-server was not found (PATH or ~/.cache/speclane-anchors): the reference arm did not run.")
    return table
