"""Training prompts built only from text already on the machine.

Three sources, all deterministic:
- a committed list of ~2,400 short everyday chat questions (``chat_questions.txt``), of many
  subjects and phrasings: what users ask, and what the held-out chat benchmark looks like;
- a committed instruction list: templates crossed with topics (below), chat-like;
- the Python standard library's own docstrings, asked about as questions.

The benchmark's held-out chat prompts (``speclane.bench.prompts.CHAT_PROMPTS``) are
never produced here; a test checks the two sets are disjoint.
"""

from __future__ import annotations

import importlib
import inspect
import random
from pathlib import Path

CHAT_QUESTIONS = Path(__file__).with_name("chat_questions.txt")

TEMPLATES = (
    "Explain {topic} in simple terms.",
    "What is {topic}? Answer in a short paragraph.",
    "Give me three facts about {topic}.",
    "Write a short poem about {topic}.",
    "What are the advantages and disadvantages of {topic}?",
    "How would you teach {topic} to a child?",
    "Write a short story that involves {topic}.",
    "List five questions someone might ask about {topic}.",
    "Summarize the history of {topic} in a few sentences.",
    "What are common misconceptions about {topic}?",
    "Write a tweet about {topic}.",
    "Compare {topic} with something similar and explain the difference.",
    "Give a step-by-step guide related to {topic}.",
    "Why does {topic} matter today?",
)

TOPICS = (
    "volcanoes", "the moon", "bicycles", "coffee", "the internet", "honey bees", "rainbows",
    "gravity", "the Roman Empire", "chess", "electric cars", "vaccines", "the ocean tides",
    "black holes", "democracy", "photosynthesis in plants", "the human heart", "music theory",
    "climate change", "recycling", "the printing press", "machine learning", "sorting algorithms",
    "hash tables", "the stock market", "inflation", "meditation", "running a marathon",
    "learning a new language", "gardening", "bread baking", "time zones", "the pyramids of Egypt",
    "earthquakes", "solar panels", "the immune system", "dinosaurs", "friendship", "public speaking",
    "saving money", "cloud computing", "databases", "the Python programming language", "unit testing",
    "version control with git", "recipes for pasta", "the Olympic Games", "football", "jazz",
    "painting with watercolors", "the solar system", "deserts", "rain forests", "penguins",
    "the French Revolution", "Shakespeare", "smartphones", "sleep", "healthy breakfasts", "traffic",
    "airplanes", "submarines", "the periodic table", "magnetism", "electricity", "weather forecasts",
    "libraries", "museums", "city parks", "robots", "space travel", "the Great Wall of China",
    "mountains", "rivers", "chocolate", "tea", "cats", "dogs", "elephants", "email etiquette",
    "job interviews", "writing a resume", "remote work", "video games", "photography",
)

DOCSTRING_MODULES = (
    "json", "os.path", "string", "textwrap", "itertools", "functools", "collections", "random",
    "statistics", "math", "datetime", "pathlib", "re", "shutil", "heapq", "bisect", "csv",
    "fractions", "decimal", "calendar", "difflib", "base64", "hashlib", "urllib.parse", "zipfile",
    "argparse", "logging", "unittest", "copy", "pprint", "enum", "dataclasses", "typing", "secrets",
)

DOCSTRING_TEMPLATES = (
    "Explain what this Python function does and give a usage example:\n\n{name}{signature}\n{doc}",
    "Rewrite this documentation in plain English:\n\n{doc}",
    "Write a short Python snippet that uses {name}. Its documentation says:\n{doc}",
)


# A second user turn after the target's own answer (``torch_job``): answers that restate,
# reformat or build on an earlier turn. The drafts benchmark's multi-turn follow-ups are
# not among them (a test checks).
FOLLOW_UPS = (
    "Can you summarize that in two sentences?",
    "Give me a concrete example of that.",
    "Rewrite your answer as a bulleted list.",
    "Tell me more about the first point you made.",
    "Explain that again, more simply.",
    "Write your answer again in a more formal tone.",
    "What is the most important part of your answer?",
    "Put the main points into a short table.",
    "Go on.",
    "Make your answer shorter, keeping its key sentences.",
    "Restate the main idea in one paragraph.",
    "List the key terms you used and define each one.",
    "Thanks. Could you give me three tips based on that?",
    "Write out your answer again with headings for each part.",
    "What would someone who disagrees say?",
    "Turn your answer into a few questions and answers.",
)


def instruction_prompts() -> list[str]:
    return [t.format(topic=topic) for topic in TOPICS for t in TEMPLATES]


def docstring_prompts(max_doc_chars: int = 600) -> list[str]:
    """Questions about public functions of standard-library modules, from their docstrings."""
    prompts = []
    for module_name in DOCSTRING_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 40:
                continue
            try:
                signature = str(inspect.signature(obj))
            except (TypeError, ValueError):
                signature = "(...)"
            template = DOCSTRING_TEMPLATES[len(prompts) % len(DOCSTRING_TEMPLATES)]
            prompts.append(template.format(name=f"{module_name}.{name}", signature=signature, doc=doc[:max_doc_chars]))
    return prompts


def chat_questions() -> list[str]:
    return [line.strip() for line in CHAT_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]


def training_prompts(limit: int | None = None, seed: int = 0) -> list[str]:
    """The three sources, each shuffled deterministically, interleaved so that any prefix
    is half chat questions and a quarter each of the other two (while they last)."""
    rng = random.Random(seed)
    sources = [chat_questions(), instruction_prompts(), docstring_prompts()]
    for source in sources:
        rng.shuffle(source)
    pattern = (0, 1, 0, 2)  # chat, instruction, chat, docstring
    prompts: list[str] = []
    taken = [0, 0, 0]
    while any(taken[i] < len(sources[i]) for i in range(3)):
        for i in pattern:
            if taken[i] < len(sources[i]):
                prompts.append(sources[i][taken[i]])
                taken[i] += 1
    return prompts[:limit] if limit else prompts
