"""KV slot accounting for the scheduler: which cache rows are free. No torch.

The cache has a fixed number of rows, each ``max_model_len`` tokens long, so a
request admitted into a slot can never run out of KV memory mid-generation and
nothing ever needs to be swapped or recomputed.
"""

from __future__ import annotations


class SlotAllocator:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        # Lowest slot first keeps live rows packed at the front of the cache.
        self._free = list(range(num_slots - 1, -1, -1))
        self._owner: dict[int, str] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def all_free(self) -> bool:
        return len(self._free) == self.num_slots and not self._owner

    def can_allocate(self) -> bool:
        return bool(self._free)

    def allocate(self, request_id: str) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot (callers must check can_allocate first)")
        slot = self._free.pop()
        self._owner[slot] = request_id
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._owner:
            raise AssertionError(f"slot {slot} freed twice or never allocated")
        del self._owner[slot]
        self._free.append(slot)
        self._free.sort(reverse=True)

    def owner(self, slot: int) -> str | None:
        return self._owner.get(slot)
