"""The suffix drafter's structure: stored token text with a sparse suffix index.

``SuffixIndex`` holds token text (one request's context, or a tenant's recent outputs,
documents separated by ``SEPARATOR``) and, for every position, the pair of tokens
ending there: a dict from that pair to its end positions, oldest first. Where a suffix
tree answers "where does the longest suffix of the context occur, and what followed each
occurrence", this index answers it for suffixes up to ``max_match`` tokens: the context's
last two tokens name the candidate end positions, and each candidate is extended
backwards, token by token, to its full match length. A suffix tree over the same text
holds a node per distinct substring position; in Python that is several dicts per
stored token, where this holds one list entry, and the text is never rebuilt as the
context grows (``extend`` indexes only the new positions).

``alignments`` finds the occurrences, exact or (with ``max_resync`` > 0) resynchronised:
after a one-token divergence between a copy and its source (a capitalised word, a changed
number, an inserted comma), no suffix ending at the newest tokens occurs, but the tokens
before the divergence do; the alignment skips the divergent tokens (1 or 2 in the context,
0 to 2 in the source) and checks that the tokens after it match again. Resync is off by
default: on the tuning half its drafts were wrong often enough that their verify rows cost
more than they saved (``benchmarks/tune_drafters.py``: max_resync 0 over 1 and 3).

``vote`` turns occurrences into a draft: of the occurrences with the longest match, each
next token is counted, the most frequent one is taken, the occurrences that disagree are
dropped, and so on; the estimated probability of the path is the product of the
chosen tokens' shares, times a confidence in the match itself that grows with its
length (``prior``). The draft stops when that probability falls below ``min_prob``, when
it is ``spec_factor`` times as long as the match (a short match says little about a long
continuation), or at ``k``. With ``max_branches`` > 1 the draft is a tree: where the
occurrences disagree, the less frequent continuations are drafted too while their own
probability stays above ``branch_min_prob``, best first, and the round verifies every
branch in one forward (``draft_tree.py``). SuffixDecoding (arXiv 2411.04975) scores
continuations by the same frequency counts, grows its speculation trees best first by
them, and bounds a draft by the same factor of the match length.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

SEPARATOR = -1  # between documents; never a token, so no match runs across it
_SHIFT = 1 << 21  # a pair's key: first * _SHIFT + second (token ids are below 2**21)


@dataclass(frozen=True)
class SuffixParams:
    """What the drafter's matching and stopping use; the defaults are what
    ``benchmarks/tune_drafters.py`` chose on the evaluation set's tuning half."""

    max_match: int = 4  # longest match counted (a longer one scores this)
    min_match: int = 2  # shortest exact match that proposes
    resync_min: int = 3  # tokens that must match before a divergence to resynchronise
    max_resync: int = 0  # tokens after a divergence searched (1 or 2 of them divergent); 0: no resync
    max_candidates: int = 16  # most recent occurrences tried per source and anchor
    min_prob: float = 0.35  # stop when the path's estimated probability falls below this
    spec_factor: float = 2.0  # draft at most this many times the match length
    prior: float = 2.0  # confidence in a match of length L: L / (L + prior)
    resync_penalty: int = 1  # a resynchronised match scores this much less than an exact one
    max_branches: int = 1  # next tokens drafted per node (1: a chain; more: a draft tree)
    branch_min_prob: float = 0.2  # a node that is not its parent's likeliest child needs this

    def __post_init__(self) -> None:
        if not 2 <= self.min_match <= self.max_match:
            raise ValueError(f"need 2 <= min_match <= max_match; got {self.min_match}, {self.max_match}")
        if not 0 <= self.min_prob < 1:
            raise ValueError(f"min_prob must be in [0, 1); got {self.min_prob}")
        if self.max_branches < 1 or not 0 <= self.branch_min_prob < 1:
            raise ValueError(f"need max_branches >= 1 and branch_min_prob in [0, 1); got {self.max_branches}, "
                             f"{self.branch_min_prob}")
        if self.spec_factor <= 0 or self.prior < 0 or self.max_candidates < 1 or self.resync_min < 2:
            raise ValueError("spec_factor must be > 0, prior >= 0, max_candidates >= 1, resync_min >= 2")


class SuffixIndex:
    """Token text and the end positions of every pair of tokens in it (module docstring)."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        self.ends: dict[int, list[int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the pairs that end in them."""
        text, ends = self.tokens, self.ends
        prev = text[-1] if text else SEPARATOR
        i = len(text)
        text.extend(tokens)
        for token in tokens:
            if prev != SEPARATOR and token != SEPARATOR:
                key = prev * _SHIFT + token
                found = ends.get(key)
                if found is None:
                    ends[key] = [i]
                else:
                    found.append(i)
            prev = token
            i += 1

    def add_document(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` as a document of their own (no match spans two documents)."""
        if self.tokens:
            self.tokens.append(SEPARATOR)
        self.extend(tokens)

    def recent_ends(self, first: int, second: int, limit: int, before: int) -> list[int]:
        """The up to ``limit`` latest positions ``e < before`` where ``first second`` ends."""
        found = self.ends.get(first * _SHIFT + second)
        if not found:
            return []
        out = []
        for e in reversed(found):
            if e < before:
                out.append(e)
                if len(out) == limit:
                    break
        return out


@dataclass(frozen=True)
class Occurrence:
    text: list[int]  # the stored text it is in
    start: int  # where its continuation starts in ``text``
    score: int  # tokens matched (less the resync penalty)


def _match_back(text: list[int], end: int, context: Sequence[int], last: int, limit: int) -> int:
    """Tokens that match going backwards from ``text[end]`` and ``context[last]``, up to ``limit``."""
    n = 0
    while n < limit and end - n >= 0 and last - n >= 0 and text[end - n] == context[last - n]:
        n += 1
    return n


def alignments(index: SuffixIndex, context: Sequence[int], params: SuffixParams, *, own: bool = False) -> list[Occurrence]:
    """Occurrences in ``index`` of the context's suffix, exact or resynchronised (module docstring).

    ``own``: ``index`` holds the context itself; only matches ending before the tokens
    matched count, so the context never matches itself."""
    n = len(context)
    if n < 2:
        return []
    text = index.tokens
    out: list[Occurrence] = []
    # Exact: the longest suffix ending at the newest token.
    for e in index.recent_ends(context[-2], context[-1], params.max_candidates, n - 1 if own else len(text)):
        if e + 1 < len(text):
            length = _match_back(text, e, context, n - 1, params.max_match)
            if length >= params.min_match:
                out.append(Occurrence(text, e + 1, length))
    # Resynchronised: the match ends ``d`` tokens back, then ``t`` context tokens differ
    # from ``s`` source tokens, then the last ``d - t`` tokens match again.
    for d in range(1, min(params.max_resync, n - 2) + 1):
        anchor = n - 1 - d
        for e in index.recent_ends(context[anchor - 1], context[anchor], params.max_candidates, anchor if own else len(text)):
            back = _match_back(text, e, context, anchor, params.max_match)
            if back < params.resync_min:
                continue
            for t in range(1, min(2, d) + 1):
                tail = context[n - (d - t):] if d > t else ()
                for s in range(3):
                    if s == t and text[e + 1 : e + 1 + s] == list(context[anchor + 1 : anchor + 1 + t]):
                        continue  # no divergence: the exact search covers it
                    start = e + 1 + s + len(tail)
                    if start < len(text) and text[e + 1 + s : start] == list(tail) and SEPARATOR not in text[e + 1 : start]:
                        # A replacement of one token (one in, one out) is the likeliest edit.
                        score = min(back + len(tail), params.max_match) - params.resync_penalty - (s != t) - (t - 1)
                        if score > 0:
                            out.append(Occurrence(text, start, score))
    return out


def vote(occurrences: list[Occurrence], k: int, params: SuffixParams) -> tuple[list[int], list[float], list[int]]:
    """The draft the longest-matching occurrences vote for: up to ``k`` tokens, each one's
    estimated probability of being accepted, and each one's parent (a draft tree's
    ``parents``, ``draft_tree.py``; a chain where ``params.max_branches`` is 1).

    Best first: the candidates are the next tokens seen after a drafted node (its
    ``max_branches`` most frequent), each with its parent's probability times its share
    of the occurrences that reached the parent; the likeliest candidate is drafted next,
    while it is at least ``min_prob`` (the most frequent child) or ``branch_min_prob`` (the
    others) and at most ``spec_factor`` times the match length deep. Earlier occurrences win
    ties, and a node's likeliest child comes before its others."""
    if not occurrences or k <= 0:
        return [], [], []
    best = max(o.score for o in occurrences)
    group: list[tuple[list[int], int]] = []
    seen: set[tuple[int, int]] = set()
    for o in occurrences:
        key = (id(o.text), o.start)
        if o.score == best and key not in seen:
            seen.add(key)
            group.append((o.text, o.start))
    max_depth = max(1, int(params.spec_factor * best))
    tokens: list[int] = []
    probs: list[float] = []
    parents: list[int] = []
    # (-probability, tie-break, parent, depth, token, the occurrences that continue with it)
    frontier: list[tuple[float, int, int, int, int, list[tuple[list[int], int]]]] = []
    pushed = 0

    def expand(node: int, prob: float, members: list[tuple[list[int], int]], depth: int) -> None:
        nonlocal pushed
        if depth >= max_depth:
            return
        following: dict[int, list[tuple[list[int], int]]] = {}
        for text, start in members:
            i = start + depth
            if i < len(text) and text[i] != SEPARATOR:
                following.setdefault(text[i], []).append((text, start))
        ranked = sorted(following.items(), key=lambda item: -len(item[1]))  # stable: the first seen among equals
        for rank, (token, continuing) in enumerate(ranked[: params.max_branches]):
            p = prob * len(continuing) / len(members)
            if p >= (params.min_prob if rank == 0 else params.branch_min_prob):
                heapq.heappush(frontier, (-p, pushed, node, depth + 1, token, continuing))
                pushed += 1

    expand(-1, best / (best + params.prior), group, 0)
    while frontier and len(tokens) < k:
        neg_prob, _, parent, depth, token, continuing = heapq.heappop(frontier)
        tokens.append(token)
        probs.append(-neg_prob)
        parents.append(parent)
        expand(len(tokens) - 1, -neg_prob, continuing, depth)
    return tokens, probs, parents
