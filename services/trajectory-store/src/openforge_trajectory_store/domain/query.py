"""ListRollouts filters, and the keyset page tokens of ListRollouts, ListRuns and ListStepMetrics."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass

from openforge.common.v1 import common_pb2
from openforge_core.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: Integers in page tokens and cursors fit a signed 64-bit SQL INTEGER.
MAX_TOKEN_INT = 2**63 - 1


def token_int(text: str) -> int | None:
    """``text`` as a non-negative integer of at most :data:`MAX_TOKEN_INT` (ASCII digits only), else None."""
    if not text or not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if value <= MAX_TOKEN_INT else None


@dataclass(frozen=True)
class RolloutFilter:
    """Filters of ListRollouts; empty/None fields match everything."""

    run_id: str = ""
    task_id: str = ""
    status: int = common_pb2.ROLLOUT_STATUS_UNSPECIFIED
    min_reward: float | None = None
    max_reward: float | None = None


@dataclass(frozen=True)
class PageCursor:
    """Position after the last rollout of a page (newest-first order: create time desc, id asc)."""

    create_time_ns: int
    rollout_id: str

    def encode(self) -> str:
        raw = json.dumps([self.create_time_ns, self.rollout_id]).encode()
        return base64.urlsafe_b64encode(raw).decode()

    @staticmethod
    def decode(token: str) -> PageCursor:
        """Parses a page token.

        Raises:
            InvalidArgument: The token is not one this store issued.
        """
        try:
            ct, rid = json.loads(base64.urlsafe_b64decode(token.encode()))
            if not isinstance(ct, int) or isinstance(ct, bool) or not isinstance(rid, str):
                raise ValueError
            if not -MAX_TOKEN_INT <= ct <= MAX_TOKEN_INT:
                raise ValueError
        except (ValueError, TypeError, UnicodeDecodeError):
            raise InvalidArgument.field("page_token", "malformed page token") from None
        return PageCursor(ct, rid)


@dataclass(frozen=True)
class RunCursor:
    """Position after the last run of a ListRuns page (newest first: first-seen time desc, id asc)."""

    first_seen_s: float
    run_id: str

    def encode(self) -> str:
        raw = json.dumps(["run", self.first_seen_s, self.run_id]).encode()
        return base64.urlsafe_b64encode(raw).decode()

    @staticmethod
    def decode(token: str) -> RunCursor:
        """Parses a ListRuns page token.

        Raises:
            InvalidArgument: The token is not one this store issued for ListRuns.
        """
        try:
            kind, t, rid = json.loads(base64.urlsafe_b64decode(token.encode()))
            if kind != "run" or not isinstance(t, int | float) or not isinstance(rid, str):
                raise ValueError
            if not math.isfinite(t):
                raise ValueError
        except (ValueError, TypeError, UnicodeDecodeError, OverflowError):
            raise InvalidArgument.field("page_token", "malformed page token") from None
        return RunCursor(float(t), rid)

    def after(self, first_seen_s: float, run_id: str) -> bool:
        """Whether a run sorts after this cursor in newest-first order."""
        return first_seen_s < self.first_seen_s or (first_seen_s == self.first_seen_s and run_id > self.run_id)


def step_cursor_encode(step: int) -> str:
    """The ListStepMetrics page token after ``step``."""
    return f"s:{step}"


def step_cursor_decode(token: str) -> int:
    """The last step of the previous ListStepMetrics page; 0 for "".

    Raises:
        InvalidArgument: The token is not one this store issued for ListStepMetrics.
    """
    if not token:
        return 0
    body = token.removeprefix("s:")
    step = token_int(body) if body != token else None
    if step is None:
        raise InvalidArgument.field("page_token", "malformed page token")
    return step


def page_size(requested: int) -> int:
    """The effective page size (0 = default, capped).

    Raises:
        InvalidArgument: Negative size.
    """
    if requested < 0:
        raise InvalidArgument.field("page_size", "must be >= 0")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def status_rank(status: int) -> int:
    """0 pending, 1 running, 2 terminal: a state never goes back to a lower rank."""
    if status in (common_pb2.ROLLOUT_STATUS_UNSPECIFIED, common_pb2.ROLLOUT_STATUS_PENDING):
        return 0
    if status == common_pb2.ROLLOUT_STATUS_RUNNING:
        return 1
    return 2
