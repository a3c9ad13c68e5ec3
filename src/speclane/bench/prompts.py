"""Prompt sets for the benchmarks (committed, so every run uses the same text)."""

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He polished the great lens, "
    "trimmed the wick, and watched the ships pass the rocky point until morning. In winter the storms came "
    "from the north and the spray reached the gallery, but the light never failed."
)
CODE = (
    "def summarize(orders):\n"
    "    total = 0\n"
    "    count = 0\n"
    "    for order in orders:\n"
    "        total = total + order.price * order.quantity\n"
    "        count = count + 1\n"
    "    average = total / count\n"
    "    return total, count, average\n"
)
CODE_EDITED = CODE.replace("orders", "purchases").replace("order.", "item.").replace("for order in", "for item in")

SPEEDUP_TASKS = {
    "copy-heavy": (f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}", None),
    "code-edit+prediction": (
        f"Rename the parameter orders to purchases and the loop variable order to item. Print the whole function.\n\n{CODE}",
        CODE_EDITED,
    ),
    "chat": ("What are three good habits for staying healthy? Answer in a few sentences.", None),
}

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain recursion in one short paragraph.",
    "Write a haiku about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle for a ten-year-old.",
    "Suggest a name for a small bakery.",
    "Why is the sky blue?",
    "How do I boil an egg?",
    "What does a compiler do?",
    "List four planets of the solar system.",
    "Summarize the story of Cinderella in two sentences.",
    "What is photosynthesis?",
    "Give an example of a metaphor.",
    "How many minutes are in a day?",
    "What is a prime number?",
]

LONG_DOCUMENT = " ".join([PARAGRAPH] * 40)
