"""A lazy registry: name → ``"module:attribute"``, imported on first use.

A heavy stack (vLLM, torch, verl, the Kubernetes client) is imported only by the process that
builds what needs it. Used for the inference engines, the trainer backends, the orchestrator's
sandbox backends and its harness adapters.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


class UnknownName(KeyError):
    """No entry of that name; the message names the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class LazyRegistry:
    """Names mapped to ``"module:attribute"`` targets.

    Args:
        kind: What an entry is, for messages (``"engine"``, ``"sandbox backend"``).
        targets: Name → ``"package.module:Attribute"``.

    Raises:
        ValueError: A target without ``:``.
    """

    def __init__(self, kind: str, targets: Mapping[str, str]) -> None:
        for name, target in targets.items():
            module, _, attribute = target.partition(":")
            if not module or not attribute:
                raise ValueError(f"{kind} {name!r}: target {target!r} is not 'module:attribute'")
        self.kind = kind
        self.targets: Mapping[str, str] = dict(targets)

    def __contains__(self, name: object) -> bool:
        return name in self.targets

    def __iter__(self) -> Iterator[str]:
        return iter(self.targets)

    def __len__(self) -> int:
        return len(self.targets)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self.targets)

    def load(self, name: str) -> Any:
        """The attribute registered as ``name``, its module imported now.

        Raises:
            UnknownName: No such name (a ``KeyError``).
            ImportError: The module (or a library it needs) is not installed.
        """
        try:
            target = self.targets[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
