"""``speclane bench prefix``'s logic without a server: the system prompt's size, one run
per conversation, and the per-turn table read from measured turns (medians, ratios, the
note that says whether the answers with the cache on and off agree)."""

from __future__ import annotations

from speclane.bench import prefix_scenario as ps


def _turns(ttfts: list[float], answer: str = "ok") -> list[dict]:
    return [{"ttft_s": t, "prompt_tokens": 1000 + 40 * i, "cached_tokens": 0 if i == 0 else 992 + 32 * i,
             "answer": f"{answer} {i}"} for i, t in enumerate(ttfts)]


def test_each_conversation_has_its_own_long_system_prompt():
    first, second = ps.system_prompt(0), ps.system_prompt(1)
    assert first != second and first.split(".", 1)[1] == second.split(".", 1)[1]
    assert len(first.split()) > 600, "about 1,000 tokens of rules"
    assert len(ps.QUESTIONS) == 10


def test_turn_table_reports_medians_ratios_and_the_target():
    n = len(ps.QUESTIONS)
    measured = {
        "on": [_turns([1.0] + [0.05] * (n - 1)), _turns([1.2] + [0.07] * (n - 1)), _turns([1.1] + [0.06] * (n - 1))],
        "off": [_turns([1.0] * n), _turns([1.0] * n), _turns([1.0] * n)],
        "llama": [_turns([2.0] + [0.3] * (n - 1))] * 3,
    }
    table = ps._turn_table(measured, threads=2, repeats=3, with_llama_cpp=True)
    assert len(table.rows) == n
    first, second = table.rows[0], table.rows[1]
    assert first[:6] == [1, 1000, 0, 1.1, 1.0, 1.1]
    assert second[3] == 0.06 and abs(second[5] - 0.06) < 1e-12
    assert abs(second[7] - 0.3 / 0.06) < 1e-9
    assert "at most 0.06" in table.notes[0] and "are identical" in table.notes[0]


def test_turn_table_says_when_answers_differ():
    n = len(ps.QUESTIONS)
    measured = {"on": [_turns([1.0] * n)], "off": [_turns([1.0] * n, answer="other")]}
    table = ps._turn_table(measured, threads=2, repeats=1, with_llama_cpp=False)
    assert "DIFFER" in table.notes[0]
    assert len(table.columns) == 6 and "not found" in table.notes[-1]
