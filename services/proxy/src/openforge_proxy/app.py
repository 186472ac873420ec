"""The proxy's composition root."""

from __future__ import annotations

import grpc

from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.events import EventBus
from openforge_proxy.domain.sessions import SessionRegistry
from openforge_proxy.servicer import ProxyServicer
from openforge_proxy.settings import ProxySettings


class ProxyApp:
    """Builds the proxy's dependencies: the session registry and the event bus.

    Ready once NATS is connected and the proxy's stream exists (call records
    are published there).
    """

    def __init__(self, settings: ProxySettings) -> None:
        self.service_names = [proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"].full_name]
        self.settings = settings
        self.sessions = SessionRegistry(settings.session_ttl_s, settings.max_sessions)
        self.events = EventBus(settings.nats)

    def register(self, server: grpc.aio.Server) -> None:
        proxy_pb2_grpc.add_ProxyServiceServicer_to_server(ProxyServicer(self.sessions), server)

    async def start(self) -> None:
        await self.events.connect()
        await self.events.ensure_stream("proxy")

    async def close(self) -> None:
        await self.events.close()
