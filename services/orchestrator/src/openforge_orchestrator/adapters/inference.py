"""The policy version inference serves (``GetModelInfo``), for ``min_policy_version`` gates."""

from __future__ import annotations

import grpc

from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.errors import Unavailable
from openforge_core.rpc.client import open_channel

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


class InferencePolicy:
    """Reads the served policy version.

    Args:
        target: ``host:port`` of inference's gRPC server.
    """

    def __init__(self, target: str) -> None:
        self._channel = open_channel(target, service=SERVICE, idempotent_methods=["GetModelInfo"])
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)

    async def current(self) -> int:
        """The policy version now.

        Raises:
            Unavailable: Inference cannot be reached.
        """
        try:
            info = await self._stub.GetModelInfo(inference_pb2.GetModelInfoRequest())
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"inference GetModelInfo failed: {exc.code().name}") from exc
        return int(info.policy_version)

    async def aclose(self) -> None:
        """Closes the channel."""
        await self._channel.close()
