"""The paged KV cache: one fixed-size tensor for keys and one for values, [layers, blocks,
kv_heads, block_size, head_dim]; ``keys[i]`` / ``values[i]`` are layer i's views.

Memory is fixed at start-up: ``num_blocks x block_size`` positions per layer. A sequence
reaches its positions through a block table (position p at offset ``p % block_size`` of
block ``table[p // block_size]``); the scheduler owns the tables (``scheduler/kv_manager.py``,
no torch) and the block size, this file holds the tensors and the gathers the torch
attention path reads. One position's key (or value) of one head is ``head_dim`` contiguous
elements, wherever its block sits, so a position's attention does not depend on the table's
layout. Nothing here records lengths: attention reads ``[0, start + new)`` of a forward's
sequences, so positions past a sequence's verified length (rejected drafts) are as if never
written, and the next forward overwrites them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype):
        self.num_blocks = num_blocks
        self.block_size = block_size
        # All layers live in one tensor: one allocation for the whole pool.
        shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)
        self.all_keys = torch.zeros(shape, dtype=dtype)
        self.all_values = torch.zeros(shape, dtype=dtype)
        self.keys = list(self.all_keys.unbind(0))  # per layer: [blocks, kv_heads, block_size, head_dim]
        self.values = list(self.all_values.unbind(0))

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """One block's keys and values over every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.all_keys, self.all_values))

    @property
    def dtype(self) -> torch.dtype:
        return self.all_keys.dtype

    def move(self, table: Sequence[int], moves: Sequence[tuple[int, int]]) -> None:
        """Copy, in every layer, the keys and values at position ``source`` to position
        ``target`` of the sequence with block ``table``, for each (source, target) in turn:
        a draft tree's accepted nodes, from their slots to the positions of their depths.
        A position's key (rotated at its depth) and value do not depend on where they sit."""
        if not moves:
            return
        size = self.block_size
        for cache in (self.all_keys, self.all_values):
            for source, target in moves:
                cache[:, table[target // size], :, target % size] = cache[:, table[source // size], :, source % size]

    def copy_blocks(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """For each (source, target, j): the keys and values of the first j positions of
        block ``source`` into block ``target``, in every layer (a prompt's positions read
        from part of a cached block; the source stays as it is)."""
        for cache in (self.all_keys, self.all_values):
            for source, target, j in copies:
                cache[:, target, :, :j] = cache[:, source, :, :j]

    def blocks_needed(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def row_tables(self, num_rows: int, positions: int) -> list[list[int]]:
        """Block tables laying the pool out as ``num_rows`` rows of ``positions`` each, row r
        on consecutive blocks (calibration and tests that address the pool by rows)."""
        per_row = self.blocks_needed(positions)
        if num_rows * per_row > self.num_blocks:
            raise ValueError(f"{num_rows} rows of {positions} positions need {num_rows * per_row} blocks; "
                             f"the pool has {self.num_blocks}")
        return [list(range(r * per_row, (r + 1) * per_row)) for r in range(num_rows)]


def gather(layer: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    """One layer's [blocks, kv_heads, block_size, d] read through ``tables`` [S, width]
    (long) into contiguous [S, kv_heads, length, d]: position p of sequence s is
    ``layer[tables[s, p // block_size], :, p % block_size]``."""
    num_seqs, width = tables.shape
    _, kv_heads, block_size, head_dim = layer.shape
    picked = layer.index_select(0, tables.reshape(-1)).view(num_seqs, width, kv_heads, block_size, head_dim)
    return picked.transpose(1, 2).reshape(num_seqs, kv_heads, width * block_size, head_dim)[:, :, :length]
