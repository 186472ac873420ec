"""Capped exponential backoff: the one rule behind every retry wait (event redelivery and
publishing, infrastructure retries of a rollout, service restarts)."""

from __future__ import annotations


def doubling_delay(first_s: float, retry: int, max_s: float) -> float:
    """Seconds to wait before retry ``retry`` (0-based): ``first_s`` doubled ``retry`` times, at
    most ``max_s``. 0 when ``first_s`` is 0."""
    return min(max_s, first_s * 2.0**retry)
