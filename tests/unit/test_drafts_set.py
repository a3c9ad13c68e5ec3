"""The drafters' evaluation set: its categories, sizes and two disjoint halves."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from speclane.bench import drafts_set

ROOT = Path(__file__).resolve().parents[2]


def test_every_category_has_at_least_30_prompts_split_in_halves():
    prompts = drafts_set.load()
    counts = Counter((p.category, p.split) for p in prompts)
    assert {p.category for p in prompts} == set(drafts_set.CATEGORIES)
    for category in drafts_set.CATEGORIES:
        tune, heldout = counts[(category, "tune")], counts[(category, "heldout")]
        assert tune + heldout >= 30, category
        assert tune == heldout, category


def test_no_prompt_is_in_both_halves_and_ids_are_unique():
    """By its messages alone: a held-out prompt that is a tuning prompt with or without a
    prediction has the same greedy answer, which the tuning replayed."""
    prompts = drafts_set.load()
    text = {split: {json.dumps(p.messages, sort_keys=True) for p in drafts_set.load(split)}
            for split in drafts_set.SPLITS}
    assert not text["tune"] & text["heldout"]
    assert len(text["tune"]) + len(text["heldout"]) == len(prompts)  # no duplicate within a half either
    assert len({p.id for p in prompts}) == len(prompts)


def test_prompts_are_chat_turns_ending_with_the_user_and_predictions_only_where_named():
    for p in drafts_set.load():
        assert p.messages[-1]["role"] == "user" and p.messages[-1]["content"].strip()
        assert bool(p.prediction) == (p.category == "code-edit-prediction"), p.id


def test_the_committed_file_is_what_the_generator_writes():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_drafts_set.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
