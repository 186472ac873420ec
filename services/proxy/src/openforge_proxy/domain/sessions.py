"""Per-rollout sessions: the key a harness sends, its limits and enforced sampling.

A session is created by the orchestrator for one rollout. Its API key is
returned once; the proxy keeps only its SHA-256 digest, so a key never sits in
memory dumps or logs after creation. Keys look like ``ofk-<43 url-safe chars>``
(256 bits from :func:`secrets.token_urlsafe`).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import itertools
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unauthenticated

KEY_PREFIX = "ofk-"
#: Closed or expired sessions kept by default (:class:`SessionRegistry`).
DEFAULT_MAX_ENDED = 256


class SessionState(enum.Enum):
    """Lifecycle of a session."""

    OPEN = "open"
    CLOSED = "closed"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Limits:
    """Limits of one session; 0 means none.

    Attributes:
        max_turns: Most model calls.
        max_tokens_per_call: Cap on completion tokens per call.
        max_total_tokens: Cap on prompt + completion tokens over the session.
        deadline: Unix time (seconds) after which calls are refused; 0 = none.
    """

    max_turns: int = 0
    max_tokens_per_call: int = 0
    max_total_tokens: int = 0
    deadline: float = 0.0


@dataclass(frozen=True)
class Session:
    """One rollout's session (without its key).

    Attributes:
        rollout_id: The rollout served.
        run_id: Its run.
        model_name: The model name the harness sends.
        limits: Limits enforced.
        sampling: Enforced sampling parameters, the orchestrator's message (an empty one: none
            enforced); the session's own copy, never mutated. Each call's
            :class:`~openforge_proxy.domain.engine.Sampling` is built from it.
        state: Lifecycle state.
        create_time: Unix seconds.
        expire_time: Unix seconds after which the key stops working.
        calls: Calls admitted (a call's retries count once; a call counts when it is admitted,
            so calls in flight count against ``limits.max_turns``).
        total_tokens: Prompt + completion tokens of the calls served.
        reserved_tokens: Tokens that the calls in flight may still use: each reserves its
            prompt and its completion cap when admitted, until it ends.
        serial: Tells this session from an earlier one of the same rollout.
        rollout_attempt: The orchestrator's attempt of the rollout (1-based), written on every
            call record of the session so that the attempts of a re-run rollout never mix.
        harness: The harness the rollout runs, as its creator named it ("" when not given).
    """

    rollout_id: str
    run_id: str
    model_name: str
    limits: Limits
    sampling: SamplingParams
    state: SessionState
    create_time: float
    expire_time: float
    calls: int = 0
    total_tokens: int = 0
    reserved_tokens: int = 0
    serial: int = 0
    rollout_attempt: int = 1
    harness: str = ""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class _Entry:
    session: Session
    key_digest: str
    request_id: str
    key: str = field(repr=False)  # kept only so an idempotent retry can return it


def _check_request(rollout_id: str, limits: Limits, ttl_s: float | None, rollout_attempt: int) -> None:
    """Refuses a CreateSession whose fields are out of range.

    Raises:
        InvalidArgument: Empty rollout id, negative limits, ttl or attempt.
    """
    if not rollout_id:
        raise InvalidArgument.field("rollout_id", "must not be empty")
    for name in ("max_turns", "max_tokens_per_call", "max_total_tokens"):
        if getattr(limits, name) < 0:
            raise InvalidArgument.field(f"limits.{name}", "must be >= 0 (0 = no limit)")
    if ttl_s is not None and ttl_s <= 0:
        raise InvalidArgument.field("ttl", "must be positive")
    if rollout_attempt < 0:
        raise InvalidArgument.field("rollout_attempt", "must be >= 1 (0 = 1)")


class SessionRegistry:
    """Sessions in memory, by rollout id and by key digest.

    Args:
        default_ttl_s: Key lifetime when the request gives none, seconds.
        max_sessions: Most sessions kept; closed and expired ones are evicted first.
        clock: Returns the current Unix time in seconds (injectable for tests).
        max_ended: Most closed or expired sessions kept (the most recently ended), so that
            ``GetSession``/``CloseSession`` still answer for them and their key gets "session
            is closed" rather than "unknown key". Older ones are forgotten (``NotFound``,
            unknown key), so memory does not grow with the number of rollouts served.
    """

    def __init__(
        self, default_ttl_s: float, max_sessions: int, clock: Any = time.time, *, max_ended: int = DEFAULT_MAX_ENDED
    ) -> None:
        self._ttl = default_ttl_s
        self._max = max_sessions
        self._clock = clock
        self._max_ended = max_ended
        self._by_rollout: dict[str, _Entry] = {}
        self._by_digest: dict[str, _Entry] = {}
        self._ended_order: OrderedDict[str, None] = OrderedDict()
        self._serials = itertools.count(1)
        #: Called with the rollout id when a session closes, expires or is dropped.
        self.on_end: list[Callable[[str], None]] = []
        #: Sessions ended since start, by how: ``CLOSED`` (CloseSession, the rollout ended) or
        #: ``EXPIRED`` (its key's lifetime or deadline passed: reclaimed by :meth:`sweep`).
        self.ended_total: Counter[SessionState] = Counter()

    def create(
        self,
        *,
        request_id: str,
        rollout_id: str,
        run_id: str,
        model_name: str,
        limits: Limits,
        sampling: SamplingParams,
        ttl_s: float | None,
        rollout_attempt: int = 0,
        harness: str = "",
    ) -> tuple[Session, str]:
        """Opens a session; idempotent per ``request_id``.

        Args:
            rollout_attempt: The orchestrator's attempt of the rollout (1-based; 0 = 1).
            harness: The harness the rollout runs (for the proxy's metrics).

        Returns:
            The session and its API key.

        Raises:
            InvalidArgument: Empty rollout id, negative limits or ttl.
            AlreadyExists: An open session for the rollout exists from another request.
            ResourceExhausted: ``max_sessions`` open sessions exist.
        """
        _check_request(rollout_id, limits, ttl_s, rollout_attempt)
        replayed = self._replayed(request_id, rollout_id)
        if replayed is not None:
            return replayed.session, replayed.key
        if len(self._by_rollout) >= self._max:
            self._evict()
        now = self._clock()
        expire = now + (ttl_s if ttl_s is not None else self._ttl)
        if limits.deadline:
            expire = min(expire, limits.deadline)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        own_sampling = SamplingParams()
        own_sampling.CopyFrom(sampling)
        session = Session(
            rollout_id=rollout_id,
            run_id=run_id,
            model_name=model_name,
            limits=limits,
            sampling=own_sampling,
            state=SessionState.OPEN,
            create_time=now,
            expire_time=expire,
            serial=next(self._serials),
            rollout_attempt=max(1, rollout_attempt),
            harness=harness,
        )
        entry = _Entry(session=session, key_digest=_digest(key), request_id=request_id, key=key)
        self._by_rollout[rollout_id] = entry
        self._by_digest[entry.key_digest] = entry
        return session, key

    def _replayed(self, request_id: str, rollout_id: str) -> _Entry | None:
        """The rollout's session when ``request_id`` opened it (an idempotent retry); an ended
        one is dropped to make room for the new one.

        Raises:
            AlreadyExists: Another request opened a session for the rollout that is still open.
        """
        existing = self._refresh(self._by_rollout.get(rollout_id))
        if existing is None:
            return None
        if request_id and existing.request_id == request_id:
            return existing
        if existing.session.state is SessionState.OPEN:
            raise AlreadyExists(
                f"rollout {rollout_id} already has an open session",
                reason="SESSION_EXISTS",
                metadata={"rollout_id": rollout_id},
            )
        self._drop(existing)
        return None

    def get(self, rollout_id: str) -> Session:
        """The session of a rollout.

        Raises:
            NotFound: No session for that rollout.
        """
        entry = self._refresh(self._by_rollout.get(rollout_id))
        if entry is None:
            raise NotFound(f"no session for rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        return entry.session

    def close(self, rollout_id: str) -> Session:
        """Closes a session; its key stops working. Idempotent.

        Raises:
            NotFound: No session for that rollout.
        """
        entry = self._refresh(self._by_rollout.get(rollout_id))
        if entry is None:
            raise NotFound(f"no session for rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        if entry.session.state is SessionState.OPEN:
            entry.session = replace(entry.session, state=SessionState.CLOSED)
            self.ended_total[SessionState.CLOSED] += 1
            self._ended(rollout_id)
        entry.key = ""
        return entry.session

    def harness_of(self, key: str) -> str:
        """The harness of the session ``key`` belongs to, in any state ("" for an unknown key);
        no side effect (for counting a request's answer, whatever it was)."""
        entry = self._by_digest.get(_digest(key)) if key else None
        return entry.session.harness if entry is not None else ""

    def authenticate(self, key: str) -> Session:
        """The open session a key belongs to.

        Raises:
            Unauthenticated: Unknown, closed or expired key (the message never
                contains the key).
            ResourceExhausted: The session's deadline passed (reason
                ``DEADLINE_PASSED``): a limit, not a bad key.
        """
        entry = self._by_digest.get(_digest(key))
        if entry is not None:
            deadline = entry.session.limits.deadline
            if deadline and self._clock() >= deadline and entry.session.state is not SessionState.CLOSED:
                raise ResourceExhausted("the rollout's deadline has passed", reason="DEADLINE_PASSED")
        entry = self._refresh(entry)
        if entry is None:
            raise Unauthenticated("unknown API key", reason="UNKNOWN_KEY")
        if entry.session.state is not SessionState.OPEN:
            raise Unauthenticated(f"session is {entry.session.state.value}", reason="SESSION_NOT_OPEN")
        return entry.session

    def current(self, session: Session) -> Session:
        """The session as it is now (its counts up to date).

        Raises:
            NotFound: The session is gone: forgotten, or replaced by a newer session of its rollout.
        """
        return self._entry_of(session).session

    def admit(self, session: Session, *, new_call: bool, reserve_tokens: int) -> Session:
        """Admits a call: one more call when ``new_call``, and ``reserve_tokens`` (its prompt
        and completion cap) reserved until :meth:`settle` or :meth:`release`. The caller checks
        the limits against :meth:`current` first, with no ``await`` in between (the event loop
        runs nothing else meanwhile).

        Raises:
            NotFound: The session is gone.
        """
        entry = self._entry_of(session)
        entry.session = replace(
            entry.session,
            calls=entry.session.calls + (1 if new_call else 0),
            reserved_tokens=entry.session.reserved_tokens + reserve_tokens,
        )
        return entry.session

    def settle(self, session: Session, *, reserved: int, tokens: int) -> Session:
        """Counts a served call's ``tokens`` (prompt + completion) and frees what it reserved.

        Raises:
            NotFound: The session is gone (the call must not be recorded for its rollout).
        """
        entry = self._entry_of(session)
        entry.session = replace(
            entry.session,
            total_tokens=entry.session.total_tokens + tokens,
            reserved_tokens=max(0, entry.session.reserved_tokens - reserved),
        )
        return entry.session

    def release(self, session: Session, reserved: int) -> None:
        """Frees what a call that ended without being served reserved (nothing if the session is gone)."""
        with contextlib.suppress(NotFound):
            entry = self._entry_of(session)
            entry.session = replace(entry.session, reserved_tokens=max(0, entry.session.reserved_tokens - reserved))

    def _entry_of(self, session: Session) -> _Entry:
        entry = self._by_rollout.get(session.rollout_id)
        if entry is None or entry.session.serial != session.serial:
            raise NotFound(
                f"no session for rollout {session.rollout_id!r}", metadata={"rollout_id": session.rollout_id}
            )
        return entry

    def sweep(self) -> int:
        """Marks sessions past their expiry as expired (notifying ``on_end``); returns how many."""
        n = 0
        for entry in list(self._by_rollout.values()):
            was_open = entry.session.state is SessionState.OPEN
            self._refresh(entry)
            n += was_open and entry.session.state is not SessionState.OPEN
        return n

    def __len__(self) -> int:
        return len(self._by_rollout)

    def held(self) -> Counter[SessionState]:
        """Sessions held now, by state (ended ones are kept up to ``max_ended``)."""
        return Counter(entry.session.state for entry in self._by_rollout.values())

    def _refresh(self, entry: _Entry | None) -> _Entry | None:
        if entry is not None and entry.session.state is SessionState.OPEN:
            if self._clock() >= entry.session.expire_time:
                entry.session = replace(entry.session, state=SessionState.EXPIRED)
                entry.key = ""
                self.ended_total[SessionState.EXPIRED] += 1
                self._ended(entry.session.rollout_id)
        return entry

    def _ended(self, rollout_id: str) -> None:
        for callback in self.on_end:
            callback(rollout_id)
        ended = self._ended_order
        ended[rollout_id] = None
        ended.move_to_end(rollout_id)
        while len(ended) > self._max_ended:
            old, _ = ended.popitem(last=False)
            entry = self._by_rollout.get(old)
            if entry is not None and entry.session.state is not SessionState.OPEN:
                self._by_rollout.pop(old, None)
                self._by_digest.pop(entry.key_digest, None)

    def _drop(self, entry: _Entry) -> None:
        self._by_rollout.pop(entry.session.rollout_id, None)
        self._by_digest.pop(entry.key_digest, None)
        self._ended(entry.session.rollout_id)
        self._ended_order.pop(entry.session.rollout_id, None)

    def _evict(self) -> None:
        for entry in list(self._by_rollout.values()):
            if self._refresh(entry) is not None and entry.session.state is not SessionState.OPEN:
                self._drop(entry)
        if len(self._by_rollout) >= self._max:
            raise ResourceExhausted(f"{self._max} sessions are open", reason="TOO_MANY_SESSIONS")
