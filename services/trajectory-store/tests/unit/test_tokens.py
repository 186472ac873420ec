"""Delta storage of prompts."""

from __future__ import annotations

import pytest
from store_builders import conversation

from openforge_trajectory_store.domain import tokens


def test_round_trip_and_compaction() -> None:
    calls = conversation("r", turns=30, prompt_len=2000)
    stored, base = [], None
    for c in calls:
        s = tokens.encode(c, base)
        stored.append(s)
        base = (s.key, s.sequence)
    full_bytes = sum(len(c.SerializeToString()) for c in calls)
    stored_bytes = sum(len(s.data) for s in stored)
    assert stored_bytes * 10 < full_bytes
    decoded = tokens.decode((s.data, s.base, s.prefix_len) for s in stored)
    assert [d.SerializeToString() for d in decoded] == [c.SerializeToString() for c in calls]


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2], [2], 0), ([], [1], 0), (list(range(1000)), [*range(517), 9, 9], 517)],
)
def test_common_prefix(a: list[int], b: list[int], n: int) -> None:
    assert tokens.common_prefix(a, b) == n


def test_missing_base_is_an_error() -> None:
    c = conversation("r", turns=2, prompt_len=100)
    first = tokens.encode(c[0], None)
    second = tokens.encode(c[1], (first.key, first.sequence))
    with pytest.raises(ValueError, match="not stored before"):
        tokens.decode([(second.data, second.base, second.prefix_len)])
