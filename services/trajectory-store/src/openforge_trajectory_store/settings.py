"""Trajectory store settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from typing import ClassVar

from openforge_core.settings import ServiceSettings


class StoreSettings(ServiceSettings):
    """Settings of the trajectory store.

    Attributes:
        consumer_name: Durable JetStream consumer name prefix; the position in
            each stream survives restarts under this name.
    """

    service_name: ClassVar[str] = "trajectory-store"

    consumer_name: str = "trajectory-store"
