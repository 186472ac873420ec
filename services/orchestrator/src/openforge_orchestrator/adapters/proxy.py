"""The proxy's session API (``openforge.proxy.v1.ProxyService``) as a :class:`SessionGateway`."""

from __future__ import annotations

import time

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.errors import Unavailable
from openforge_core.manifest import ServedModel
from openforge_core.rpc.client import open_channel
from openforge_orchestrator.domain.execution import OpenedSession
from openforge_orchestrator.domain.rollouts import Rollout

SERVICE = proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"].full_name


class ProxySessions:
    """Opens and closes per-rollout proxy sessions over gRPC.

    ``CreateSession`` is retried by the channel (idempotent per ``request_id`` =
    ``<rollout_id>/<attempt>``), ``CloseSession`` and ``GetSession`` too.

    Args:
        target: ``host:port`` of the proxy's gRPC server.
        timeout_s: Deadline of each call, seconds.
    """

    def __init__(self, target: str, timeout_s: float = 10.0) -> None:
        self._channel = open_channel(
            target,
            service=SERVICE,
            idempotent_methods=["CreateSession", "GetSession", "CloseSession"],
            default_timeout_s=timeout_s,
        )
        self._stub = proxy_pb2_grpc.ProxyServiceStub(self._channel)

    async def open(self, rollout: Rollout, attempt: int, ttl_s: float) -> OpenedSession:
        """Opens the rollout's session with its limits and sampling (the rollout's own seed in
        place of the submission's); returns the key and what the
        proxy serves with (when it has loaded the model).

        Raises:
            Unavailable: The proxy cannot be reached (an infrastructure failure).
        """
        deadline = Timestamp()
        deadline.FromNanoseconds(int((time.time() + ttl_s) * 1e9))
        request = proxy_pb2.CreateSessionRequest(
            request_id=f"{rollout.rollout_id}/{attempt}",
            rollout_id=rollout.rollout_id,
            run_id=rollout.run_id,
            model_name=rollout.model_name,
            limits=proxy_pb2.SessionLimits(
                max_turns=rollout.limits.max_turns,
                max_tokens_per_call=rollout.limits.max_tokens_per_call,
                max_total_tokens=rollout.limits.max_total_tokens,
                deadline=deadline,
            ),
            ttl=Duration(seconds=int(ttl_s) + 1),
            rollout_attempt=attempt,
            harness=rollout.harness,
        )
        if rollout.sampling is not None:
            request.sampling.CopyFrom(rollout.sampling)
            if rollout.seed is not None:
                request.sampling.seed = rollout.seed
        try:
            response = await self._stub.CreateSession(request)
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"proxy CreateSession failed: {exc.code().name}: {exc.details()}") from exc
        served = None
        if response.HasField("served_model"):
            m = response.served_model
            served = ServedModel(m.tokenizer_hash, m.chat_template_hash, tuple(m.parsers))
        return OpenedSession(response.api_key, served)

    async def close(self, rollout_id: str) -> int:
        """Closes the session; returns the model calls it served (0 when the proxy lost it)."""
        try:
            response = await self._stub.CloseSession(proxy_pb2.CloseSessionRequest(rollout_id=rollout_id))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return 0
            raise Unavailable(f"proxy CloseSession failed: {exc.code().name}: {exc.details()}") from exc
        return int(response.session.calls)

    async def aclose(self) -> None:
        """Closes the channel."""
        await self._channel.close()
