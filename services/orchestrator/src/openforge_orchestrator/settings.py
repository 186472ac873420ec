"""Orchestrator settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from typing import ClassVar

from openforge_core.settings import ServiceSettings


class OrchestratorSettings(ServiceSettings):
    """Settings of the orchestrator (the shared ones only, for now)."""

    service_name: ClassVar[str] = "orchestrator"
