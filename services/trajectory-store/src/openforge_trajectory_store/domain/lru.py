"""A map bounded by the total cost of its entries, least recently stored out first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CostLru(Generic[K, V]):
    """Entries in the order they were stored; storing one past the budget drops the oldest.

    Args:
        budget: The most total cost kept (entries go until the total is at most this).
        cost: The cost of one entry (1 for a count of entries, its bytes for memory).
    """

    def __init__(self, budget: int, cost: Callable[[V], int]) -> None:
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._budget = budget
        self._cost = cost
        self._total = 0

    def get(self, key: K) -> V | None:
        """The entry, or None (reading does not make it recent)."""
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        """Stores an entry as the most recent, then drops the oldest while over the budget."""
        self.pop(key)
        self._entries[key] = value
        self._total += self._cost(value)
        while self._total > self._budget and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self._total -= self._cost(dropped)

    def pop(self, key: K) -> None:
        """Drops an entry if present."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._total -= self._cost(old)
