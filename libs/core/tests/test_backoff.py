"""The capped doubling every retry wait uses."""

from __future__ import annotations

from openforge_core.backoff import doubling_delay


def test_doubles_from_the_first_wait_up_to_the_cap() -> None:
    assert [doubling_delay(0.5, r, 10.0) for r in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert doubling_delay(0.0, 5, 10.0) == 0.0
