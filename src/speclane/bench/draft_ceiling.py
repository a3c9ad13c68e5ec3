"""What speculation could give on a set of greedy answers, whatever the drafter: round-by-round
replays priced by the measured step cost.

An answer is walked in rounds (``walk``): a proposer drafts at most n tokens after the
first ``done`` and says how many of them the answer keeps; a round of d drafts costs a
forward of 1 + d rows (the engine's calibrated step cost) and yields its kept drafts plus
one token. Plain decoding is the walk without drafts, so a proposer's speed-up on an
answer is ``len(answer) * step(1) / walk(...)`` (the first token, which comes with the
prefill, counted as a decode step like the others). Two idealised proposers:

- ``CopyCeiling``: at each position the longest run of the answer's next tokens (at most
  K) that occurs in text a copying drafter can read (the prompt, the prediction, the
  tenant's earlier answers, the answer so far), preceded there by the same ``anchor``
  tokens as in the answer (the suffix drafter needs a match of 2 to draft; with resync on,
  ``max_resync`` > 0, it re-aligns on fewer after a one-token divergence). No drafter that copies (suffix, prompt
  lookup) keeps more tokens a round than the ceiling of anchor 0; where the model writes
  text that is in none of those, only a model-based drafter (the MTP head) can help.
- ``perfect``: a drafter that knows the answer (K drafts a round, all kept): what the
  verify cost leaves at that K on this machine.

Both draft as much as they can each round; where the step cost has a bump (a kernel
switching paths at some row count) a shorter round could be cheaper, so they are the
speed-ups of these drafters, close to but not strictly the most any drafter could get.

``benchmarks/tune_drafters.py`` replays the suffix drafter itself with ``walk`` to tune it;
``speclane bench drafters`` reports the ceilings of its held-out answers beside what the
drafters measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Proposer = Callable[[int, int], tuple[int, int]]  # (done, most drafts) -> (drafted, kept)
LONGEST_RUN = 16  # the longest run the copy ceiling looks for (K at most)
ANCHOR_MAX = 4


def walk(answer: Sequence[int], propose: Proposer, step_ms: Sequence[float]) -> float:
    """Milliseconds to decode ``answer`` in rounds (module docstring); ``step_ms[d]`` is a
    forward of 1 + d rows, and no round drafts more than ``len(step_ms) - 1``."""
    cost, done = 0.0, 0
    while done < len(answer):
        drafted, kept = propose(done, min(len(step_ms) - 1, len(answer) - done - 1))
        cost += step_ms[drafted]
        done += kept + 1
    return cost


def speedup(answer: Sequence[int], propose: Proposer, step_ms: Sequence[float]) -> float:
    """Plain decoding's time over the walk's (1.0 for an empty answer)."""
    return len(answer) * step_ms[0] / walk(answer, propose, step_ms) if answer else 1.0


class CopyCeiling:
    """The copy ceiling's proposer for one answer (module docstring): every run of up to
    ``LONGEST_RUN + anchor`` tokens of the readable texts is kept in a set, the answer's own
    as it grows. ``drafted`` counts the tokens it drafted (all kept)."""

    def __init__(self, texts: Sequence[Sequence[int]], prompt: Sequence[int], answer: Sequence[int], k: int,
                 anchor: int = 2) -> None:
        if not 1 <= k <= LONGEST_RUN or not 0 <= anchor <= ANCHOR_MAX:
            raise ValueError(f"k must be within 1..{LONGEST_RUN} and anchor within 0..{ANCHOR_MAX}")
        self.k, self.anchor = k, anchor
        self.runs: set[tuple[int, ...]] = set()
        for text in texts:
            for end in range(1, len(text) + 1):
                self._add_runs_ending(text, end)
        self.sequence = [*prompt, *answer]  # a draft's anchor may reach back into the prompt
        self.start = self.known = len(prompt)
        self.drafted = 0

    def _add_runs_ending(self, text: Sequence[int], end: int) -> None:
        for length in range(1, min(LONGEST_RUN + self.anchor, end) + 1):
            self.runs.add(tuple(text[end - length : end]))

    def __call__(self, done: int, most: int) -> tuple[int, int]:
        at = self.start + done
        while self.known < at:  # the answer so far is readable text too
            self.known += 1
            self._add_runs_ending(self.sequence, self.known)
        longest = 0
        for length in range(1, min(self.k, most) + 1):
            if tuple(self.sequence[max(0, at - self.anchor) : at + length]) not in self.runs:
                break
            longest = length
        self.drafted += longest
        return longest, longest


def perfect(k: int) -> Proposer:
    """A drafter that knows the answer: ``k`` drafts a round, every one kept."""
    def propose(done: int, most: int) -> tuple[int, int]:
        return min(k, most), min(k, most)
    return propose
