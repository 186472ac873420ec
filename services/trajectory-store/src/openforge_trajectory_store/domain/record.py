"""The record of rollouts and calls, built from events, idempotent per event id.

This is the in-memory index; the durable repositories (SQLite, PostgreSQL)
implement the same operations.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

from openforge.common.v1 import common_pb2
from openforge_core.errors import InvalidArgument, NotFound

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True)
class RolloutFilter:
    """Filters of ListRollouts; empty/None fields match everything."""

    run_id: str = ""
    task_id: str = ""
    status: int = common_pb2.ROLLOUT_STATUS_UNSPECIFIED
    min_reward: float | None = None
    max_reward: float | None = None

    def matches(self, r: common_pb2.Rollout) -> bool:
        if self.run_id and r.run_id != self.run_id:
            return False
        if self.task_id and r.task_id != self.task_id:
            return False
        if self.status != common_pb2.ROLLOUT_STATUS_UNSPECIFIED and r.status != self.status:
            return False
        if self.min_reward is not None and not (r.HasField("reward") and r.reward >= self.min_reward):
            return False
        return self.max_reward is None or (r.HasField("reward") and r.reward <= self.max_reward)


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def _decode_token(token: str) -> int:
    try:
        kind, _, value = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        offset = int(value)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument.field("page_token", "malformed page token") from None
    if kind != "o" or offset < 0:
        raise InvalidArgument.field("page_token", "malformed page token")
    return offset


class Record:
    """Rollouts (latest state) and calls (every attempt) keyed by id.

    Every ``apply_*`` method is idempotent: an event id seen before is ignored.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._rollouts: dict[str, common_pb2.Rollout] = {}
        self._calls: dict[str, dict[tuple[str, int], common_pb2.CallRecord]] = {}

    def _first_time(self, event_id: str) -> bool:
        if event_id in self._seen:
            return False
        self._seen.add(event_id)
        return True

    def apply_rollouts(self, event_id: str, rollouts: list[common_pb2.Rollout]) -> bool:
        """Records rollout states (a later terminal state is never overwritten by an earlier one).

        Returns:
            False when the event was already applied.
        """
        if not self._first_time(event_id):
            return False
        for r in rollouts:
            current = self._rollouts.get(r.rollout_id)
            if current is not None and _rank(current.status) > _rank(r.status):
                continue
            copy = common_pb2.Rollout()
            copy.CopyFrom(r)
            self._rollouts[r.rollout_id] = copy
        return True

    def apply_call(self, event_id: str, call: common_pb2.CallRecord) -> bool:
        """Records one attempt of one call.

        Returns:
            False when the event was already applied.
        """
        if not self._first_time(event_id):
            return False
        copy = common_pb2.CallRecord()
        copy.CopyFrom(call)
        self._calls.setdefault(call.rollout_id, {})[(call.call_id, call.attempt)] = copy
        return True

    def rollout(self, rollout_id: str) -> common_pb2.Rollout:
        """One rollout.

        Raises:
            NotFound: Unknown rollout.
        """
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id}) from None

    def list_rollouts(
        self, flt: RolloutFilter, page_size: int, page_token: str
    ) -> tuple[list[common_pb2.Rollout], str]:
        """A page of matching rollouts, newest first.

        Args:
            flt: Filters.
            page_size: 0 = 100; at most 1000.
            page_token: From the previous page ("" = first page).

        Returns:
            The page and the next page token ("" on the last page).

        Raises:
            InvalidArgument: Negative page size or malformed token.
        """
        if page_size < 0:
            raise InvalidArgument.field("page_size", "must be >= 0")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        offset = _decode_token(page_token) if page_token else 0
        key: Callable[[common_pb2.Rollout], tuple[int, str]] = lambda r: (  # noqa: E731
            -r.create_time.ToNanoseconds(),
            r.rollout_id,
        )
        matching = sorted((r for r in self._rollouts.values() if flt.matches(r)), key=key)
        page = matching[offset : offset + size]
        next_token = _encode_token(offset + size) if offset + size < len(matching) else ""
        return page, next_token

    def calls(self, rollout_id: str) -> list[common_pb2.CallRecord]:
        """Every attempt of every call of a rollout, in receive order.

        Raises:
            NotFound: Neither the rollout nor any of its calls is known.
        """
        calls = self._calls.get(rollout_id)
        if calls is None:
            if rollout_id in self._rollouts:
                return []
            raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        return sorted(calls.values(), key=lambda c: (c.receive_time.ToNanoseconds(), c.call_id, c.attempt))


def _rank(status: int) -> int:
    if status in (common_pb2.ROLLOUT_STATUS_UNSPECIFIED, common_pb2.ROLLOUT_STATUS_PENDING):
        return 0
    if status == common_pb2.ROLLOUT_STATUS_RUNNING:
        return 1
    return 2
