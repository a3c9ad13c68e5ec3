"""A draft tree's shape: which draft token follows which. Pure Python, no torch.

A draft of n tokens is a tree when ``parents`` is given: ``parents[j]`` is the index of
node j's parent among the draft's nodes, or ``-1`` for a child of the root (the last
token the round feeds, whose next token the target samples anyway). Parents come before
their children (``parents[j] < j``), so the nodes are in an order the forward can lay
out at consecutive cache positions. A chain (every parent the node before it) is the
plain draft of ``K`` tokens, and ``parents=None`` means a chain.

The forward runs one row per node: node j's row sees the request's context, then its
ancestors and itself, at RoPE position ``context + depth(j) - 1`` (``models/llama.py``).
Verification walks from the root: at each node the target's token is compared with the
node's children, and the walk follows the child that holds it (``accept``). A tree of n
nodes costs the n rows a chain of n drafts costs, and yields the longest matching path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def check(parents: Sequence[int]) -> None:
    """ValueError unless every parent is -1 or an earlier node."""
    for j, parent in enumerate(parents):
        if not -1 <= parent < j:
            raise ValueError(f"draft tree node {j} has parent {parent}; need -1 <= parent < {j}")


def is_chain(parents: Sequence[int] | None) -> bool:
    return parents is None or all(parent == j - 1 for j, parent in enumerate(parents))


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the root."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """The nodes from the root's child down to ``node``, ``node`` included (ascending)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def first_chain(parents: Sequence[int]) -> list[int]:
    """The path that takes the first child at every node (a drafter lists its likeliest
    branch first): what a round that can only verify a chain keeps of a tree."""
    path: list[int] = []
    tip = -1
    for j, parent in enumerate(parents):
        if parent == tip:
            path.append(j)
            tip = j
    return path


def accept(tokens: Sequence[int], parents: Sequence[int] | None,
           target: Callable[[int, int], int]) -> tuple[list[int], list[int]]:
    """Walk the tree (``parents`` None: the chain of ``tokens``) from the root with the
    target's choices.

    ``target(row, depth)``: the target's token after row ``row`` (0: the root, j + 1: node
    j) at ``depth`` (0 at the root). Returns the accepted nodes (a root-to-node path)
    and the tokens to append: the accepted drafts, then the target's own token after the
    last of them. ``target`` is called once per row on the path, in order, so a sampler
    keyed by position draws exactly what classic decoding would.
    """
    if parents is None:
        parents = range(-1, len(tokens) - 1)
    children: dict[int, list[int]] = {}
    for j, parent in enumerate(parents):
        children.setdefault(parent, []).append(j)
    path: list[int] = []
    node = -1
    while True:
        chosen = target(node + 1, len(path))
        follow = next((c for c in children.get(node, ()) if tokens[c] == chosen), None)
        if follow is None:
            return path, [tokens[j] for j in path] + [chosen]
        path.append(follow)
        node = follow
