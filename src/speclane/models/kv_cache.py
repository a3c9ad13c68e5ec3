"""The KV cache: one fixed-size tensor for keys and one for values, [layers, slots,
kv_heads, max_len, head_dim], one row ("slot") per sequence; ``keys[i]`` / ``values[i]``
are layer i's views.

Memory is fixed at start-up: ``num_slots x max_len`` tokens per layer. The
scheduler hands out slot numbers (``scheduler/kv_slots.py``, no torch); this file
holds the tensors and each slot's length. ``truncate`` drops a sequence's last
positions (rejected draft tokens): attention only ever reads ``[0, length)``, so a
dropped position is as if it had never been written.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.num_slots = num_slots
        self.max_len = max_len
        # Per layer [slots, kv_heads, max_len, head_dim], so that one slot's first L positions
        # are a strided view SDPA can read without a copy.
        # All layers live in one tensor: one allocation for the whole pool.
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.all_keys = torch.zeros(shape, dtype=dtype)
        self.all_values = torch.zeros(shape, dtype=dtype)
        self.keys = list(self.all_keys.unbind(0))  # per layer: [slots, kv_heads, max_len, head_dim]
        self.values = list(self.all_values.unbind(0))
        self.lengths = [0] * num_slots

    @staticmethod
    def bytes_per_sequence(num_layers: int, max_len: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """One slot's keys and values over every layer."""
        return 2 * num_layers * max_len * num_kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.all_keys, self.all_values))

    def reset(self, slot: int) -> None:
        """A new sequence takes this slot."""
        self.lengths[slot] = 0

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Give slot ``dst`` the first ``length`` positions of slot ``src`` (a shared prompt)."""
        if not 0 < length <= self.lengths[src]:
            raise ValueError(f"cannot copy {length} positions of slot {src}, which holds {self.lengths[src]}")
        self.all_keys[:, dst, :, :length] = self.all_keys[:, src, :, :length]
        self.all_values[:, dst, :, :length] = self.all_values[:, src, :, :length]
        self.lengths[dst] = length

    def truncate(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` positions of ``slot``."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def advance(self, slot: int, start: int, num_new: int) -> None:
        """Record that positions ``[start, start + num_new)`` were written this forward."""
        if start > self.lengths[slot]:
            raise AssertionError(f"slot {slot}: writing at {start} leaves a hole after {self.lengths[slot]}")
        if start + num_new > self.max_len:
            raise ValueError(f"slot {slot}: {start + num_new} tokens exceed the cache length {self.max_len}")
        self.lengths[slot] = start + num_new
