"""``bench.common.alternate``: every arm runs once per repeat, the first repeat in the given
order and the later ones shuffled (the same every run), so no arm always runs right after
the same one."""

from __future__ import annotations

from speclane.bench.common import alternate


def test_arms_run_once_per_repeat_after_varied_neighbours() -> None:
    order: list[str] = []

    def arm(name: str, value: float):  # type: ignore[no-untyped-def]
        def run() -> float:
            order.append(name)
            return value
        return run

    arms = {name: arm(name, value) for name, value in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))}
    results = alternate(arms, repeats=6, warmup=True)
    assert results == {name: [value] * 6 for name, value in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))}
    assert order[:8] == ["a", "b", "c", "d", "a", "b", "c", "d"], "the warm-up, then the first repeat as given"
    repeats = [order[4 + 4 * i: 8 + 4 * i] for i in range(6)]
    assert all(sorted(r) == ["a", "b", "c", "d"] for r in repeats), "each arm once per repeat"
    measured = order[4:]
    after = {name: {measured[i + 1] for i in range(len(measured) - 1) if measured[i] == name} - {name}
             for name in "abcd"}
    assert all(len(followers) >= 2 for followers in after.values()), after
    order.clear()
    alternate(arms, repeats=6, warmup=True)
    again = list(order)
    assert again[4:] == measured, "the same order every run"
