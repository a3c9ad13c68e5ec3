"""Imports go one way: no two speclane modules reach each other, directly or round a loop.

grimp reads every import statically, those under ``TYPE_CHECKING`` and inside functions
included, so a circle hidden from the interpreter still fails here. The layering itself
(which package may import which) is import-linter's contract in pyproject.toml, checked
by ``make test`` (``lint-imports``).
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in graph.modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            for child in edges[node]:
                if child in on_stack:
                    low[node] = min(low[node], low[child])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_cycle_finder_finds_a_loop():
    class Loop:
        modules = {"p.a", "p.b", "p.c", "p.d"}

        def find_modules_directly_imported_by(self, module: str) -> set[str]:
            return {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}[module]

    assert _cycles(Loop()) == [["p.a", "p.b", "p.c"]]  # type: ignore[arg-type]


def test_no_import_cycles_in_speclane():
    cycles = _cycles(grimp.build_graph("speclane"))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
