"""Write the drafters' evaluation set: ``src/speclane/bench/data/drafts.jsonl``.

    PYTHONPATH=src python benchmarks/make_drafts_set.py          # rewrites the file
    PYTHONPATH=src python benchmarks/make_drafts_set.py --check  # exits 1 if it differs

Seven categories of 30 prompts each, built from the pools below by a seeded generator
(no network, the same file on every run): a verbatim copy; a copy with edits and
reformatting (capitalise each item, number the lines, swap a word, change the numbers);
a code edit with the edited code as ``prediction``; a code edit without it; a multi-turn
chat whose answer repeats earlier turns; an agent turn answered with a tool-call JSON; and
open chat. Each record: ``id``, ``category``, ``split``, ``messages`` (chat turns) and,
for the first code category, ``prediction``.

``split`` is ``tune`` or ``heldout``, half of each category each: the prompts of a
category sorted by the SHA-256 of their text, the first half tuning. Drafter parameters
are tuned on ``tune`` (``benchmarks/tune_drafters.py``); ``speclane bench drafters``
reports ``heldout`` only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "speclane" / "bench" / "data" / "drafts.jsonl"
PER_CATEGORY = 30
SEED = 20261202

SENTENCES = [
    "The ferry leaves the north pier at seven and returns before the evening tide.",
    "Our team moved the weekly planning meeting from Monday to Wednesday afternoon.",
    "The old mill by the river was turned into a library with a reading garden.",
    "Please bring a packed lunch, warm clothes and a refillable water bottle.",
    "The museum opens its new wing of Roman glass on the first of March.",
    "Rain is expected over the hills tonight, with clearer skies by the morning.",
    "The bakery on Elm Street sells rye bread only on Fridays and Saturdays.",
    "Every invoice must carry the order number and the date of delivery.",
    "The orchestra rehearses in the east hall while the main stage is repaired.",
    "A volunteer will meet new members at the front desk and show them around.",
    "The bridge will be closed to cars for two weeks while the deck is resurfaced.",
    "Seedlings should be watered lightly in the morning and kept out of strong wind.",
    "The quarterly report shows sales rising in the south and falling in the west.",
    "Visitors may photograph the gardens but not the paintings in the gallery.",
    "The kitchen closes at ten, though drinks are served until midnight.",
    "Our new printer needs a driver update before it can print in colour.",
    "The trail climbs steeply for a mile and then follows the ridge to the lake.",
    "Each student presents a short project on a local plant or animal.",
    "The council agreed to plant forty oak trees along the school road.",
    "Passwords must be changed every ninety days and may not repeat the last five.",
    "The lighthouse was automated in 1987 and its keeper's house is now a cafe.",
    "Fresh pasta cooks in about three minutes, much faster than the dried kind.",
    "The warehouse ships orders placed before noon on the same working day.",
    "Swimmers must shower before entering the pool and wear a cap at all times.",
    "The choir is looking for tenors and will hold auditions next Thursday.",
    "A thin layer of frost covered the fields when the hikers set out.",
    "The clinic offers flu vaccinations without an appointment on Tuesdays.",
    "The software update fixes the login error and makes search results faster.",
    "The harvest festival ends with a parade of decorated tractors through town.",
    "Library books may be renewed twice online unless another reader has reserved them.",
    "The comet will be visible low in the western sky just after sunset.",
    "Our office recycles paper, glass and batteries in the bins by the lift.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "The train to the coast was delayed by a fallen tree near the tunnel.",
    "Guests can borrow bicycles from the hotel for a small daily fee.",
    "The gallery's winter exhibition features prints by young local artists.",
    "Staff should report any broken equipment to the facilities desk at once.",
    "The marathon route passes the cathedral, the market and the old harbour.",
    "The heating in the sports hall will be switched on from the first of November.",
    "Children under twelve enter the zoo for free on the first Sunday of each month.",
    "The farm sells honey, apple juice and goat cheese at the Saturday market.",
    "A new cycle lane now links the station with the university campus.",
    "The power will be off between nine and eleven for scheduled maintenance.",
    "The committee will announce the winners of the poetry prize in June.",
    "The cafe roasts its own coffee beans every morning before opening.",
    "Hikers are asked to stay on marked paths to protect nesting birds.",
    "The school's science fair attracted more than two hundred visitors.",
    "Returned items must be unused and in their original packaging.",
]

ITEMS = [
    "apples", "brown rice", "olive oil", "fresh basil", "cheddar cheese", "oat milk", "black beans", "green tea",
    "paper towels", "dish soap", "whole wheat bread", "frozen peas", "greek yogurt", "peanut butter", "red onions",
    "call the plumber", "renew the passport", "book the dentist", "pay the electricity bill", "water the plants",
    "back up the laptop", "return the library books", "buy a birthday card", "clean the gutters", "fix the bike chain",
    "Lisbon", "Oslo", "Nairobi", "Toronto", "Kyoto", "Santiago", "Vienna", "Auckland", "Marrakesh", "Reykjavik",
    "hammer", "tape measure", "spirit level", "cordless drill", "wood glue", "sandpaper", "safety goggles",
    "update the roadmap", "review pull requests", "write release notes", "prepare the demo", "send the survey",
    "tomatoes", "sweet potatoes", "lemons", "garlic", "spinach", "mushrooms", "chickpeas", "almonds",
    "sleeping bag", "head torch", "first aid kit", "rain jacket", "water filter", "trail map", "spare socks",
    "blue folder", "stapler", "sticky notes", "printer paper", "whiteboard markers", "desk lamp",
]
NAMES = ["Alice", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ivan", "Jamal", "Keiko", "Lars",
         "Maya", "Nikos", "Olga", "Pavel", "Rosa", "Sami", "Tariq", "Uma", "Vera", "Wen", "Yusuf", "Zoe"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Toronto", "Kyoto", "Santiago", "Vienna", "Auckland", "Dublin", "Seoul",
          "Lima", "Prague", "Cairo", "Helsinki", "Perth", "Porto", "Quito", "Riga"]

FUNCTIONS = [
    ("total_price", "items", "item", "def total_price(items):\n    total = 0\n    for item in items:\n        total += item.price * item.quantity\n    return total\n"),
    ("average_score", "scores", "score", "def average_score(scores):\n    if not scores:\n        return 0\n    total = 0\n    for score in scores:\n        total += score\n    return total / len(scores)\n"),
    ("count_words", "lines", "line", "def count_words(lines):\n    counts = {}\n    for line in lines:\n        for word in line.split():\n            counts[word] = counts.get(word, 0) + 1\n    return counts\n"),
    ("find_user", "users", "user", "def find_user(users, name):\n    for user in users:\n        if user.name == name:\n            return user\n    return None\n"),
    ("longest_name", "names", "name", "def longest_name(names):\n    best = ''\n    for name in names:\n        if len(name) > len(best):\n            best = name\n    return best\n"),
    ("filter_even", "numbers", "number", "def filter_even(numbers):\n    result = []\n    for number in numbers:\n        if number % 2 == 0:\n            result.append(number)\n    return result\n"),
    ("merge_settings", "defaults", "key", "def merge_settings(defaults, overrides):\n    merged = dict(defaults)\n    for key in overrides:\n        merged[key] = overrides[key]\n    return merged\n"),
    ("read_rows", "path", "line", "def read_rows(path):\n    rows = []\n    with open(path) as handle:\n        for line in handle:\n            rows.append(line.strip().split(','))\n    return rows\n"),
    ("max_temperature", "readings", "reading", "def max_temperature(readings):\n    highest = None\n    for reading in readings:\n        if highest is None or reading.value > highest:\n            highest = reading.value\n    return highest\n"),
    ("group_by_city", "people", "person", "def group_by_city(people):\n    groups = {}\n    for person in people:\n        groups.setdefault(person.city, []).append(person)\n    return groups\n"),
    ("unique_tags", "posts", "post", "def unique_tags(posts):\n    tags = set()\n    for post in posts:\n        for tag in post.tags:\n            tags.add(tag)\n    return sorted(tags)\n"),
    ("overdue_books", "loans", "loan", "def overdue_books(loans, today):\n    late = []\n    for loan in loans:\n        if loan.due < today:\n            late.append(loan.book)\n    return late\n"),
    ("sum_column", "table", "row", "def sum_column(table, column):\n    total = 0\n    for row in table:\n        total += row[column]\n    return total\n"),
    ("first_error", "events", "event", "def first_error(events):\n    for event in events:\n        if event.level == 'error':\n            return event.message\n    return ''\n"),
    ("scale_points", "points", "point", "def scale_points(points, factor):\n    scaled = []\n    for point in points:\n        scaled.append((point.x * factor, point.y * factor))\n    return scaled\n"),
]
RENAMES = {"items": "products", "scores": "grades", "lines": "sentences", "users": "accounts", "names": "labels",
           "numbers": "values", "defaults": "base", "path": "filename", "readings": "samples", "people": "members",
           "posts": "articles", "loans": "borrowings", "table": "records", "events": "entries", "points": "coords",
           "item": "product", "score": "grade", "line": "sentence", "user": "account", "name": "label",
           "number": "value", "key": "field", "reading": "sample", "person": "member", "post": "article",
           "loan": "borrowing", "row": "record", "event": "entry", "point": "coord"}

TOOLS = {
    "get_weather": ({"city": "string", "unit": "string"}, "What is the weather like in {city} today, in celsius?",
                    lambda r: {"city": r.choice(CITIES), "unit": "celsius"}),
    "book_table": ({"restaurant": "string", "date": "string", "people": "integer"},
                   "Book a table at {restaurant} on {date} for {people} people.",
                   lambda r: {"restaurant": r.choice(["Luna", "The Olive Tree", "Sakura", "Casa Verde", "Blue Door"]),
                              "date": f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}", "people": r.randint(2, 8)}),
    "send_email": ({"to": "string", "subject": "string", "body": "string"},
                   "Email {to} with the subject \"{subject}\" and say: {body}",
                   lambda r: {"to": f"{r.choice(NAMES).lower()}@example.com",
                              "subject": r.choice(["Meeting notes", "Invoice", "Trip plan", "Welcome"]),
                              "body": r.choice(SENTENCES)}),
    "search_files": ({"query": "string", "folder": "string"}, "Find files about {query} in the {folder} folder.",
                     lambda r: {"query": r.choice(["budget", "holiday photos", "contracts", "release notes"]),
                                "folder": r.choice(["documents", "projects", "shared", "archive"])}),
    "create_event": ({"title": "string", "date": "string", "time": "string"},
                     "Put \"{title}\" in my calendar on {date} at {time}.",
                     lambda r: {"title": r.choice(["Dentist", "Team lunch", "Yoga class", "Call with " + r.choice(NAMES)]),
                                "date": f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                                "time": f"{r.randint(8, 18):02d}:{r.choice(['00', '15', '30', '45'])}"}),
    "convert_currency": ({"amount": "number", "from": "string", "to": "string"}, "Convert {amount} {from} to {to}.",
                         lambda r: {"amount": r.choice([12.5, 40, 99.99, 250, 1200]), "from": r.choice(["EUR", "USD", "GBP"]),
                                    "to": r.choice(["JPY", "CHF", "CAD", "NOK"])}),
}

OPEN_CHAT = [
    "What is a good way to start learning to play the guitar as an adult?",
    "Why do leaves change colour in the autumn?",
    "Can you explain what inflation is in simple terms?",
    "What should I pack for a weekend camping trip in the mountains?",
    "How does a bicycle stay upright when it is moving?",
    "Give me a few ideas for a rainy afternoon with two young children.",
    "What is the difference between a virus and a bacterium?",
    "How can I make my small apartment feel more spacious?",
    "Explain how a bill becomes a law, briefly.",
    "What are some tips for writing a clear email to a busy manager?",
    "Why is it important to stretch before exercise?",
    "How do you fly a kite on a day with little wind?",
    "Suggest a simple weekly routine for keeping a house tidy.",
    "What is machine learning, explained for a high school student?",
    "How do I politely decline an invitation to a party?",
    "What is the proper way to use chopsticks?",
    "Recommend a few classic novels for someone who enjoys adventure stories.",
    "What are the benefits of learning a second language?",
    "How should I prepare for a job interview at a small startup?",
    "Why does bread go stale?",
    "Describe how a rainbow forms.",
    "What are good habits for keeping a houseplant healthy?",
    "How can I save money on groceries each month?",
    "What is the role of the heart in the human body?",
    "Write a short encouraging note to a friend who is starting a new job.",
    "Explain the rules of chess in a few sentences.",
    "What is the best way to memorise a short speech?",
    "Why do we have time zones?",
    "How does composting work, and what can go in a compost bin?",
    "Give me three questions to ask when adopting a dog from a shelter.",
    "What makes a good cup of tea?",
    "How do airplanes stay in the air?",
]

MULTI_TURN_FIRST = [
    ("Give me a packing list for a beach holiday.", "sunscreen, a swimsuit, a beach towel, sunglasses, a hat, flip-flops, a water bottle and a good book"),
    ("What are the steps to change a flat tyre?", "loosen the wheel nuts, lift the car with the jack, remove the nuts and the wheel, fit the spare wheel, tighten the nuts by hand, lower the car and tighten the nuts fully"),
    ("List the planets of the solar system in order.", "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune"),
    ("What do I need to bake banana bread?", "three ripe bananas, two eggs, a third of a cup of melted butter, three quarters of a cup of sugar, a teaspoon of baking soda, a pinch of salt and one and a half cups of flour"),
    ("Name the primary and secondary colours.", "the primary colours are red, yellow and blue, and the secondary colours are orange, green and purple"),
    ("What are the stages of the water cycle?", "evaporation, condensation, precipitation and collection"),
    ("Give me a morning routine for productive work days.", "wake up at the same time, drink a glass of water, stretch for five minutes, eat a simple breakfast, write down three goals for the day and start with the hardest task"),
    ("Which documents do I need to open a bank account?", "a passport or identity card, a proof of address such as a utility bill, your tax number and sometimes a proof of income"),
    ("What are the rules for a good password?", "use at least twelve characters, mix letters, numbers and symbols, avoid names and dates, never reuse a password and store it in a password manager"),
    ("List the ingredients of a classic pizza margherita.", "pizza dough, tomato sauce, fresh mozzarella, fresh basil leaves, olive oil and a pinch of salt"),
]
MULTI_TURN_FOLLOW = [
    "Please repeat that list again, word for word, so I can copy it.",
    "Can you repeat your answer exactly, but put each item on its own line?",
    "Say that again exactly as before, I missed it.",
    "Repeat your previous answer and add one more item at the end.",
    "Could you write your answer again as a numbered list?",
    "Repeat what you said, but start each item with a capital letter.",
]

EDIT_KINDS = ["capitalise", "number", "uppercase", "dash", "replace", "numbers"]
COPY_INSTRUCTIONS = [
    "Repeat the following text exactly, word for word:",
    "Copy this text back to me without changing anything:",
    "Please write out the following exactly as it is:",
    "Return this passage unchanged:",
    "Reproduce the text below verbatim:",
]


def _paragraph(r: random.Random) -> str:
    return " ".join(r.sample(SENTENCES, r.randint(2, 4)))


def _items(r: random.Random) -> list[str]:
    return r.sample(ITEMS, r.randint(5, 8))


def verbatim(r: random.Random, i: int) -> dict:
    text = _paragraph(r) if i % 2 == 0 else "\n".join(f"- {x}" for x in _items(r))
    return {"messages": [{"role": "user", "content": f"{r.choice(COPY_INSTRUCTIONS)}\n\n{text}"}]}


def copy_edit(r: random.Random, i: int) -> dict:
    kind = EDIT_KINDS[i % len(EDIT_KINDS)]
    items = _items(r)
    listing = "\n".join(items)
    if kind == "capitalise":
        ask = f"Copy this list back, capitalising the first letter of each item:\n\n{listing}"
    elif kind == "number":
        ask = f"Rewrite this list as a numbered list, one item per line:\n\n{listing}"
    elif kind == "uppercase":
        ask = f"Write these items again in upper case, one per line:\n\n{listing}"
    elif kind == "dash":
        ask = f"Reformat this comma-separated list as a bulleted list with dashes:\n\n{', '.join(items)}"
    elif kind == "replace":
        text = _paragraph(r)
        word = r.choice([w for w in text.split() if len(w) > 4 and w.isalpha()])
        ask = f"Copy the text below, replacing the word \"{word}\" with \"{r.choice(['banana', 'winter', 'river', 'garden'])}\":\n\n{text}"
    else:
        rows = [f"{r.choice(NAMES)}: {r.randint(10, 99)} points" for _ in range(r.randint(5, 7))]
        ask = "Copy this score table, adding 5 to every score:\n\n" + "\n".join(rows)
    return {"messages": [{"role": "user", "content": ask}]}


def _code_task(r: random.Random, i: int) -> tuple[str, str]:
    name, plural, single, code = FUNCTIONS[i % len(FUNCTIONS)]
    kind = (i // len(FUNCTIONS) + r.randint(0, 2)) % 3
    if kind == 0:
        new_plural, new_single = RENAMES[plural], RENAMES[single]
        edited = code.replace(plural, new_plural).replace(single, new_single)
        ask = f"Rename {plural} to {new_plural} and {single} to {new_single} in this function. Print the whole function.\n\n{code}"
    elif kind == 1:
        new_name = r.choice(["compute_", "get_", "calc_"]) + name.split("_", 1)[1]
        edited = code.replace(name, new_name)
        ask = f"Rename the function {name} to {new_name}. Show the complete code.\n\n{code}"
    else:
        lines = code.splitlines()
        edited = "\n".join([lines[0], f'    """{r.choice(["Return", "Compute"])} the result for the given {plural}."""', *lines[1:]]) + "\n"
        ask = f"Add a one-line docstring to this function and print it again in full.\n\n{code}"
    return ask, edited


def code_prediction(r: random.Random, i: int) -> dict:
    ask, edited = _code_task(r, i)
    return {"messages": [{"role": "user", "content": ask}], "prediction": edited}


def code_plain(r: random.Random, i: int) -> dict:
    ask, _ = _code_task(r, i + 7)
    return {"messages": [{"role": "user", "content": ask}]}


def multi_turn(r: random.Random, i: int) -> dict:
    question, answer = MULTI_TURN_FIRST[i % len(MULTI_TURN_FIRST)]
    follow = MULTI_TURN_FOLLOW[(i + r.randint(0, 5)) % len(MULTI_TURN_FOLLOW)]
    middle = r.choice(["Thanks! Is that enough for a family of four?", "Great. How long does that usually take?",
                       "Nice. Is there anything people often forget?", "Thanks, that helps a lot."])
    reply = r.choice(["Yes, that should be enough; you may want to add a few extras.",
                      "It usually takes about half an hour if you go step by step.",
                      "People often forget the small things, so check the list twice.",
                      "You are welcome! Let me know if you need anything else."])
    turns = [{"role": "user", "content": question},
             {"role": "assistant", "content": f"Here it is: {answer}."}]
    if i % 3:
        turns += [{"role": "user", "content": middle}, {"role": "assistant", "content": reply}]
    turns.append({"role": "user", "content": follow})
    return {"messages": turns}


def tool_call(r: random.Random, i: int) -> dict:
    names = sorted(TOOLS)
    chosen = r.sample(names, 3)
    schema = [{"name": n, "parameters": TOOLS[n][0]} for n in chosen]
    system = ("You are an assistant that acts by calling tools. Answer only with one JSON object of the form "
              '{"tool": NAME, "arguments": {...}}. Available tools:\n' + json.dumps(schema, indent=1))
    turns = [{"role": "system", "content": system}]
    for _ in range(i % 3):  # earlier tool calls of the same conversation
        name = r.choice(chosen)
        args = TOOLS[name][2](r)
        turns += [{"role": "user", "content": TOOLS[name][1].format(**args)},
                  {"role": "assistant", "content": json.dumps({"tool": name, "arguments": args})},
                  {"role": "user", "content": "Tool result: done."}]
    name = r.choice(chosen)
    turns.append({"role": "user", "content": TOOLS[name][1].format(**TOOLS[name][2](r))})
    return {"messages": turns}


def open_chat(r: random.Random, i: int) -> dict:
    return {"messages": [{"role": "user", "content": OPEN_CHAT[i]}]}


CATEGORIES = {
    "verbatim-copy": verbatim,
    "copy-edits": copy_edit,
    "code-edit-prediction": code_prediction,
    "code-edit": code_plain,
    "multi-turn": multi_turn,
    "tool-call": tool_call,
    "open-chat": open_chat,
}


def _key(record: dict) -> str:
    return json.dumps(record["messages"], sort_keys=True) + record.get("prediction", "")


def _messages(record: dict) -> str:
    return json.dumps(record["messages"], sort_keys=True)


def build() -> list[dict]:
    rng = random.Random(SEED)
    spare = random.Random(SEED + 1)  # replacements (below), apart from the stream every category is drawn from
    records = []
    seen: set[str] = set()  # the messages of every earlier category
    for category, make in CATEGORIES.items():
        made: dict[str, dict] = {}
        i = 0
        while len(made) < PER_CATEGORY:  # distinct prompts only
            record = make(rng, i)
            made.setdefault(_key(record), record)
            i += 1
        ordered = sorted(made.values(), key=lambda rec: hashlib.sha256(_key(rec).encode()).hexdigest())
        # A prompt whose messages an earlier category has (code edits with and without a
        # prediction ask the same edits) has that prompt's greedy answer: replaced in its
        # place (its split kept), so no held-out answer is a tuning one.
        taken = seen | {_messages(rec) for rec in ordered}
        for n, record in enumerate(ordered):
            if _messages(record) not in seen:
                continue
            while _messages(record) in taken:
                record = make(spare, i)
                i += 1
            taken.add(_messages(record))
            ordered[n] = record
        seen.update(_messages(rec) for rec in ordered)
        for n, record in enumerate(ordered):
            split = "tune" if n < PER_CATEGORY // 2 else "heldout"
            records.append({"id": f"{category}-{n:02d}", "category": category, "split": split, **record})
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in build())
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("up to date" if same else f"{OUT} differs from what this script writes")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
