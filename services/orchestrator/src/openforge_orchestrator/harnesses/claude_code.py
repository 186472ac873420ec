"""Claude Code 2.1.332 (npm ``@anthropic-ai/claude-code``) through the proxy's Anthropic Messages API.

Documented settings (``shared/reference/harness-protocols.md`` §2): ``ANTHROPIC_BASE_URL`` = the
proxy (it appends ``/v1/messages?beta=true``), ``ANTHROPIC_API_KEY`` = the rollout key (sent as
``x-api-key``); ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` alone removed all side traffic,
``DISABLE_TELEMETRY``, ``DISABLE_ERROR_REPORTING`` and ``DISABLE_AUTOUPDATER`` are harmless
extras. Non-interactive: ``claude -p TASK --output-format stream-json --verbose --model NAME``
with the file and shell tools allowed (no permission prompt in ``-p`` mode).
"""

from __future__ import annotations

from openforge_orchestrator.domain.sandbox import HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext

ALLOWED_TOOLS = "Bash Edit Write Read Glob Grep"


class ClaudeCodeAdapter:
    """Claude Code (see the module docstring)."""

    name = "claude-code"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``claude -p`` with the proxy as its Anthropic endpoint."""
        return HarnessLaunch(
            name=self.name,
            argv=(
                installed.executable if installed else "claude",
                "-p",
                ctx.instruction,
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                ctx.model,
                "--allowedTools",
                ALLOWED_TOOLS,
            ),
            env={
                "ANTHROPIC_BASE_URL": ctx.base_url,
                "ANTHROPIC_API_KEY": ctx.api_key,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_AUTOUPDATER": "1",
            },
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
