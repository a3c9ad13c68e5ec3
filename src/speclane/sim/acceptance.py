"""How many of a round's draft tokens the target accepts, in the simulator.

Two sources share one small protocol:

- ``RateAcceptance``: each request has its own acceptance rate (drawn by the workload
  from a Beta); each draft position is accepted with that probability until the first
  rejection. Every request has its own random stream seeded from (seed, request id),
  so a request's i-th round accepts the same number of drafts under every policy
  (common random numbers: policy comparisons are not blurred by acceptance noise).
- ``ScriptedAcceptance``: a fixed list of accepted counts per request, one per round
  (tests that replay the same rounds through the real engine and the simulator).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Protocol


class AcceptanceSource(Protocol):
    def accepted(self, request_id: str, num_draft_tokens: int) -> int:
        """Drafts accepted this round, in ``0..num_draft_tokens`` (leading ones)."""
        ...

    def release(self, request_id: str) -> None:
        """The request left; forget its state."""
        ...


class RateAcceptance:
    def __init__(self, rates: Mapping[str, float], seed: int) -> None:
        self._rates = rates
        self._seed = seed
        self._streams: dict[str, random.Random] = {}

    def accepted(self, request_id: str, num_draft_tokens: int) -> int:
        rng = self._streams.get(request_id)
        if rng is None:
            rng = self._streams[request_id] = random.Random((self._seed << 32) ^ zlib.crc32(request_id.encode()))
        rate = self._rates.get(request_id, 0.0)
        n = 0
        while n < num_draft_tokens and rng.random() < rate:
            n += 1
        return n

    def release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)


class ScriptedAcceptance:
    """Round i of a request accepts ``script[request_id][i]`` drafts (capped at the
    drafts proposed); past the end of its script, a request accepts nothing."""

    def __init__(self, script: Mapping[str, Sequence[int]]) -> None:
        self._script = script
        self._next: dict[str, int] = {}

    def accepted(self, request_id: str, num_draft_tokens: int) -> int:
        i = self._next.get(request_id, 0)
        self._next[request_id] = i + 1
        planned = self._script.get(request_id, ())
        return min(planned[i], num_draft_tokens) if i < len(planned) else 0

    def release(self, request_id: str) -> None:
        pass  # keep the position: a released request never runs again
