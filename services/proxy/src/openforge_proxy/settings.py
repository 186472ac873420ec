"""Proxy settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from openforge_core.settings import ServiceSettings


class ProxySettings(ServiceSettings):
    """Settings of the proxy.

    Attributes:
        session_ttl_s: Default lifetime of a session key, seconds
            (``OPENFORGE_SESSION_TTL_S``).
        max_sessions: Most open sessions kept at once.
    """

    service_name: ClassVar[str] = "proxy"

    session_ttl_s: float = Field(default=3600.0, gt=0)
    max_sessions: int = Field(default=100_000, gt=0)
