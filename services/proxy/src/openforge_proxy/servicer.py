"""``openforge.proxy.v1.ProxyService``: proto ↔ domain translation only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.field_rules import require
from openforge_core.manifest import ServedModel
from openforge_core.timestamps import to_timestamp
from openforge_proxy.domain.sessions import Limits, Session, SessionRegistry, SessionState

_STATES = {
    SessionState.OPEN: proxy_pb2.SESSION_STATE_OPEN,
    SessionState.CLOSED: proxy_pb2.SESSION_STATE_CLOSED,
    SessionState.EXPIRED: proxy_pb2.SESSION_STATE_EXPIRED,
}


def session_to_proto(s: Session) -> proxy_pb2.Session:
    """Domain session → ``Session`` message."""
    limits = proxy_pb2.SessionLimits(
        max_turns=s.limits.max_turns,
        max_tokens_per_call=s.limits.max_tokens_per_call,
        max_total_tokens=s.limits.max_total_tokens,
    )
    if s.limits.deadline:
        limits.deadline.CopyFrom(to_timestamp(s.limits.deadline))
    return proxy_pb2.Session(
        rollout_id=s.rollout_id,
        run_id=s.run_id,
        model_name=s.model_name,
        limits=limits,
        sampling=s.sampling,
        state=_STATES[s.state],
        create_time=to_timestamp(s.create_time),
        expire_time=to_timestamp(s.expire_time),
        calls=s.calls,
        total_tokens=s.total_tokens,
        rollout_attempt=s.rollout_attempt,
        harness=s.harness,
    )


def served_to_proto(served: ServedModel) -> proxy_pb2.ServedModel:
    """Domain served model → ``ServedModel`` message."""
    return proxy_pb2.ServedModel(
        tokenizer_hash=served.tokenizer_hash,
        chat_template_hash=served.chat_template_hash,
        parsers=list(served.parsers),
    )


def _none() -> ServedModel | None:
    return None


class ProxyServicer(proxy_pb2_grpc.ProxyServiceServicer):
    """Sessions over gRPC, backed by a :class:`SessionRegistry`.

    Every id in a request is checked by the shared server against :mod:`openforge_core.field_rules`
    (the rule the store and the orchestrator use too) before a method runs, so a session is never
    opened for a rollout id the store would refuse; the methods only say which are required.

    Args:
        sessions: The sessions.
        served: What the proxy serves with now, None while the model is not loaded (never waits).
    """

    def __init__(self, sessions: SessionRegistry, served: Callable[[], ServedModel | None] = _none) -> None:
        self._sessions = sessions
        self._served = served

    async def CreateSession(
        self, request: proxy_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> proxy_pb2.CreateSessionResponse:
        """Opens a session for one rollout; idempotent per ``request_id``. The response carries
        the served model once the proxy has loaded it (it never waits for it).

        Errors: INVALID_ARGUMENT (also a missing or malformed id), ALREADY_EXISTS,
        RESOURCE_EXHAUSTED (see the proto).
        """
        require(request, "rollout_id")
        lim = request.limits
        limits = Limits(
            max_turns=lim.max_turns,
            max_tokens_per_call=lim.max_tokens_per_call,
            max_total_tokens=lim.max_total_tokens,
            deadline=lim.deadline.ToNanoseconds() / 1e9 if lim.HasField("deadline") else 0.0,
        )
        session, key = self._sessions.create(
            request_id=request.request_id,
            rollout_id=request.rollout_id,
            run_id=request.run_id,
            model_name=request.model_name,
            limits=limits,
            sampling=request.sampling,
            ttl_s=request.ttl.ToNanoseconds() / 1e9 if request.HasField("ttl") else None,
            rollout_attempt=request.rollout_attempt,
            harness=request.harness,
        )
        response = proxy_pb2.CreateSessionResponse(session=session_to_proto(session), api_key=key)
        served = self._served()
        if served is not None:
            response.served_model.CopyFrom(served_to_proto(served))
        return response

    async def GetSession(
        self, request: proxy_pb2.GetSessionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> proxy_pb2.GetSessionResponse:
        """Reads a session (never its key). Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id)."""
        require(request, "rollout_id")
        return proxy_pb2.GetSessionResponse(session=session_to_proto(self._sessions.get(request.rollout_id)))

    async def CloseSession(
        self, request: proxy_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> proxy_pb2.CloseSessionResponse:
        """Closes a session; idempotent. Errors: NOT_FOUND; INVALID_ARGUMENT (missing or malformed id)."""
        require(request, "rollout_id")
        return proxy_pb2.CloseSessionResponse(session=session_to_proto(self._sessions.close(request.rollout_id)))
