"""The speed-up ceilings of ``bench/draft_ceiling.py`` and their table in ``bench drafters``:
rounds priced by a step cost, the copy ceiling's runs and anchors, the perfect drafter."""

from __future__ import annotations

import pytest

from speclane.bench import draft_ceiling as dc
from speclane.bench.drafters_scenario import ceiling_table

STEP = [10.0, 12.0, 14.0, 16.0, 18.0]  # ms of a forward of 1..5 rows


def test_walk_prices_each_round_by_its_rows_and_moves_past_its_kept_drafts_and_one_token():
    answer = list(range(10))
    assert dc.walk(answer, lambda done, most: (0, 0), STEP) == 10 * 10.0  # plain decoding
    assert dc.walk(answer, dc.perfect(4), STEP) == 18.0 + 18.0  # 5 tokens a round
    rounds: list[tuple[int, int]] = []

    def half_kept(done: int, most: int) -> tuple[int, int]:
        rounds.append((done, most))
        return most, most // 2

    # 4 drafts keep 2 (3 tokens), again; 3 drafts keep 1; 1 draft keeps 0; the last token alone
    assert dc.walk(answer, half_kept, STEP) == 18.0 + 18.0 + 16.0 + 12.0 + 10.0
    assert rounds == [(0, 4), (3, 4), (6, 3), (8, 1), (9, 0)]  # never past the answer's last token
    assert dc.speedup(answer, dc.perfect(4), STEP) == pytest.approx(100 / 36)
    assert dc.speedup([], dc.perfect(4), STEP) == 1.0


def test_the_copy_ceiling_drafts_the_longest_readable_run_and_only_what_the_answer_keeps():
    prompt = [1, 2, 3, 4, 5]
    answer = [1, 2, 3, 4, 5, 9]
    any_run = dc.CopyCeiling([prompt], prompt, answer, k=4, anchor=0)
    assert any_run(0, 4) == (4, 4)  # 1 2 3 4 is in the prompt
    assert any_run(5, 0) == (0, 0)
    assert any_run.drafted == 4
    # Anchor 2: the two tokens before a draft must precede its run in the readable text.
    anchored = dc.CopyCeiling([prompt], prompt, answer, k=4, anchor=2)
    assert anchored(0, 4) == (0, 0)  # 4 5 | 1: not in the prompt
    assert anchored(1, 4) == (0, 0)  # 5 1 | 2: nor here
    assert anchored(2, 3) == (3, 3)  # 1 2 | 3 4 5
    # The answer so far is readable: a repeat drafts from the answer's own earlier tokens.
    repeat = dc.CopyCeiling([[7]], [7], [1, 2, 3, 1, 2, 3], k=4, anchor=1)
    assert repeat(3, 2) == (0, 0)  # 3 | 1: the run 3 1 was never read
    assert repeat(4, 1) == (1, 1)  # 1 | 2 was read (tokens 0-1)
    with pytest.raises(ValueError):
        dc.CopyCeiling([], [], [], k=dc.LONGEST_RUN + 1)


def test_the_ceiling_table_bounds_each_category_between_plain_and_perfect():
    copy = ([1, 2, 3], [], [10, 11, 12, 13, 14, 15, 16, 17])
    answers = {"verbatim": [([0, 10, 11, 12, 13, 14, 15, 16, 17], [], copy[2]), copy],
               "chat": [([1], [], [20, 21, 22, 23, 24, 25])]}

    table = ceiling_table(answers, lambda rows: 10.0 + 2.0 * rows, k=8)
    rows = {row[0]: row[1:] for row in table.rows}
    verbatim = [float(cell.rstrip("x")) for cell in rows["verbatim"][:6]]
    chat = [float(cell.rstrip("x")) for cell in rows["chat"][:6]]
    assert chat[:4] == [1.0, 1.0, 1.0, 1.0]  # nothing to copy: the ceilings are plain decoding's
    assert all(v > 1.0 for v in verbatim[:4])  # the first prompt's answer is in its prompt, the second's earlier
    # columns: K=8 anchor 2, K=16 anchor 2, K=8 any run, K=16 any run, perfect K=8, perfect K=16
    assert verbatim[4] >= max(verbatim[0], verbatim[2]) and verbatim[5] >= max(verbatim[1], verbatim[3])
    assert verbatim[2] >= verbatim[0] and verbatim[3] >= verbatim[1]  # an anchor only takes runs away
    assert rows["chat"][6] == "0%" and rows["verbatim"][6] != "0%"
