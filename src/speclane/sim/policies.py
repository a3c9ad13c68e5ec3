"""The lane policies a simulation compares, derived from the configured lane options.

The fair lane (docs/design.md, "The lane, exactly") against its two legacy comparisons. Every other
lane option (slots, K, skip cap, preemption, spec mode) is kept as given; so is
``--spec-grant-ms``, except for the hold policy, which has no budget of any kind.
"""

from __future__ import annotations

import dataclasses

from speclane.config import LaneConfig

DEFAULT_BUDGET = 8  # rounds per grant when the configured lane has none (--spec-grant-rounds 0)


def lane_policies(lane: LaneConfig) -> dict[str, LaneConfig]:
    budget = lane.spec_grant_rounds or DEFAULT_BUDGET
    return {
        "fair lane (--fairness tenant)": dataclasses.replace(lane, fairness="tenant", spec_grant_rounds=budget),
        "round-robin (--fairness request)": dataclasses.replace(lane, fairness="request", spec_grant_rounds=budget),
        "hold (--spec-grant-rounds 0)": dataclasses.replace(lane, fairness="request", spec_grant_rounds=0,
                                                            spec_grant_ms=0.0),
    }


def slug(policy: str) -> str:
    """A file-name friendly short name: "fair", "round-robin", "hold"."""
    return policy.split(" ")[0]
