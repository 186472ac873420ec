"""Sandbox backends behind :class:`~openforge_orchestrator.domain.sandbox.SandboxBackend`.

Registry: backend name → ``module:Class``, imported on first use.
"""

from __future__ import annotations

from typing import Any

from openforge_core.registry import LazyRegistry
from openforge_orchestrator.domain.sandbox import SandboxBackend

BACKENDS = LazyRegistry(
    "sandbox backend",
    {
        "local": "openforge_orchestrator.backends.local:LocalBackend",
        "kubernetes": "openforge_orchestrator.backends.kubernetes:KubernetesBackend",
    },
)


def build_backend(name: str, *args: Any, **kwargs: Any) -> SandboxBackend:
    """Builds the backend registered as ``name`` with the given arguments.

    Raises:
        KeyError: No such backend.
    """
    backend: SandboxBackend = BACKENDS.load(name)(*args, **kwargs)
    return backend
