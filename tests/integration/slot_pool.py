"""A paged KV cache addressed by slot, for tests that run the model's forward directly.

Slot s of S holds blocks s, s + S, s + 2S, ...: interleaved, so no sequence's blocks are
adjacent and every forward reads and writes through a non-trivial block table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaConfig, RaggedBatch

BLOCK_SIZE = 16


class SlotPool(KVCache):
    def __init__(self, config: LlamaConfig, num_slots: int, max_len: int, dtype: torch.dtype,
                 block_size: int = BLOCK_SIZE):
        self.num_slots = num_slots
        self.per_slot = -(-max_len // block_size)
        super().__init__(config.num_layers, num_slots * self.per_slot, block_size, config.num_kv_heads,
                         config.head_dim, dtype)

    def table(self, slot: int) -> list[int]:
        return [slot + i * self.num_slots for i in range(self.per_slot)]

    def batch(self, rows: Sequence[tuple[int, int, Sequence[int]]]) -> RaggedBatch:
        """One ragged batch of ``(slot, start, new token ids)`` rows."""
        ids: list[int] = []
        positions: list[int] = []
        for _, start, tokens in rows:
            ids += tokens
            positions += range(start, start + len(tokens))
        return RaggedBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long),
                           [self.table(slot) for slot, _, _ in rows], [start for _, start, _ in rows],
                           [len(tokens) for _, _, tokens in rows])
