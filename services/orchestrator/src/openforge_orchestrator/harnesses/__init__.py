"""Harness adapters: how each harness is pointed at the proxy and run non-interactively.

Every adapter turns a :class:`LaunchContext` (instruction, the proxy's base URL as the sandbox
sees it, the rollout's key, the model name, the time limit) into a
:class:`~openforge_orchestrator.domain.sandbox.HarnessLaunch`: the harness's own config files,
its environment (base URL, key, side traffic off, as in ``shared/reference/harness-protocols.md``)
and its command line. Adapters are pure: they write nothing and start nothing.

Registry: harness name → ``module:Class``, imported on first use.
"""

from __future__ import annotations

from typing import Protocol

from openforge_core.registry import LazyRegistry
from openforge_orchestrator.domain.sandbox import HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext

__all__ = ["ADAPTERS", "HarnessAdapter", "Installed", "LaunchContext", "adapter"]


class HarnessAdapter(Protocol):
    """Builds one harness's launch."""

    #: Harness name (``mini-swe-agent``, ``claude-code``...).
    name: str

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """The launch for one rollout.

        Args:
            ctx: The rollout's instruction, proxy URL, key, model and limits.
            installed: Where ``openforge harness install`` put the harness (local backend);
                None when the harness is on the sandbox image's PATH (Kubernetes backend).
        """
        ...


ADAPTERS = LazyRegistry(
    "harness",
    {
        "command": "openforge_orchestrator.harnesses.command:CommandAdapter",
        "mini-swe-agent": "openforge_orchestrator.harnesses.mini_swe_agent:MiniSweAgentAdapter",
        "claude-code": "openforge_orchestrator.harnesses.claude_code:ClaudeCodeAdapter",
        "codex": "openforge_orchestrator.harnesses.codex:CodexAdapter",
        "openclaw": "openforge_orchestrator.harnesses.openclaw:OpenClawAdapter",
        "browser": "openforge_orchestrator.harnesses.browser:BrowserAdapter",
    },
)


def adapter(name: str) -> HarnessAdapter:
    """The adapter registered as ``name``.

    Raises:
        KeyError: No such harness.
    """
    built: HarnessAdapter = ADAPTERS.load(name)()
    return built
