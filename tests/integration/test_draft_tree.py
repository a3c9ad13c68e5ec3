"""Draft trees in the forward: each node's row equals the row of the same tokens verified
as a chain (its path from the root), and after the accepted path's keys and values move
to their positions the sequence decodes on as if the chain had been verified.

Bit for bit in the default configuration (bfloat16 on our attention kernel's tree rows);
within float32 rounding on the torch path (a mask)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from speclane import draft_tree
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch

# Node j's parent (-1: the root, the fed token): two branches under node 0, one under node 3.
PARENTS = (-1, 0, 0, -1, 3, 1, 5)
TOKENS_OFFSET = 7  # node j's token: a prompt token picked by j (any tokens will do)


def _run(model: LlamaModel, cache: KVCache, table: list[int], start: int, fed: Sequence[int],
         nodes: Sequence[int] = (), parents: tuple[int, ...] | None = None) -> torch.Tensor:
    """Hidden states of one sequence's forward: ``fed`` at ``start``, then ``nodes`` as a
    tree with ``parents`` (None: a chain)."""
    positions = list(range(start, start + len(fed)))
    if parents is None:
        positions += range(start + len(fed), start + len(fed) + len(nodes))
    else:
        positions += [start + len(fed) - 1 + d for d in draft_tree.depths(parents)]
    batch = RaggedBatch(torch.tensor([*fed, *nodes]), torch.tensor(positions), [table], [start],
                        [len(fed) + len(nodes)], trees=[parents] if parents is not None else None)
    return model(batch, cache)


def _check(model: LlamaModel, prompt: list[int], same) -> None:
    c = model.config
    cache = KVCache(c.num_layers, 16, 16, c.num_kv_heads, c.head_dim, model.dtype)
    tree_table, chain_table = [0, 1, 2, 3], [8, 5, 10, 7]
    start = len(prompt) - 1
    for table in (tree_table, chain_table):
        _run(model, cache, table, 0, prompt[:start])
    nodes = [prompt[(TOKENS_OFFSET * (j + 1)) % start] for j in range(len(PARENTS))]
    tree = _run(model, cache, tree_table, start, prompt[start:], nodes, PARENTS)
    for j in range(len(PARENTS)):
        path = draft_tree.path_to(PARENTS, j)
        chain = _run(model, cache, chain_table, start, prompt[start:], [nodes[i] for i in path])
        assert same(tree[1 + j], chain[-1]), f"node {j} (path {path})"
    # Accept the path 0 -> 1 -> 5 -> 6: move it into place, then both decode one more token.
    path = draft_tree.path_to(PARENTS, 6)
    first = start + 1
    cache.move(tree_table, [(first + j, first + d) for d, j in enumerate(path) if j != d])
    _run(model, cache, chain_table, start, prompt[start:], [nodes[i] for i in path])
    after = start + 1 + len(path)
    next_token = prompt[3]
    assert same(_run(model, cache, tree_table, after, [next_token]), _run(model, cache, chain_table, after, [next_token]))


def test_tree_rows_equal_their_paths_bit_for_bit(our_kernels, llm_default):
    model = llm_default.engine.model
    assert model.attention_library is not None and model.dtype == torch.bfloat16
    prompt = llm_default.engine.tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it runs far away.")
    _check(model, prompt, torch.equal)


def test_tree_rows_equal_their_paths_on_the_torch_path(llm_f32):
    model = llm_f32.engine.model
    assert not any(model.kernel_layers)  # float32: SDPA with the tree's mask
    prompt = llm_f32.engine.tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it runs far away.")
    _check(model, prompt, lambda a, b: torch.allclose(a, b, atol=1e-4, rtol=1e-4))


def test_a_tree_whose_parent_follows_its_child_is_refused(llm_f32):
    model = llm_f32.engine.model
    c = model.config
    cache = KVCache(c.num_layers, 4, 16, c.num_kv_heads, c.head_dim, model.dtype)
    batch = RaggedBatch(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3]), [[0, 1]], [0], [4], trees=[(-1, 1)])
    with pytest.raises(ValueError, match="parent"):
        model(batch, cache)
