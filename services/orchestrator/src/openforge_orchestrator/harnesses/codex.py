"""Codex CLI 0.171.0 (npm ``@openai/codex``) through the proxy's OpenAI Responses API.

Documented settings (``shared/reference/harness-protocols.md`` §3): ``$CODEX_HOME/config.toml``
with a model provider whose ``base_url`` is the proxy's ``/v1`` (it appends ``/responses``),
``wire_api = "responses"`` (the only one 0.171.0 accepts) and ``env_key`` naming the variable
that holds the rollout key (sent as ``Authorization: Bearer``). Side traffic off:
``[features] plugins = false`` (plus ``remote_plugin``/``apps``) and ``[analytics] enabled = false``.
Non-interactive: ``codex exec --skip-git-repo-check TASK`` with stdin closed.
"""

from __future__ import annotations

import json

from openforge_orchestrator.domain.sandbox import SANDBOX_HOME, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base

CODEX_HOME = f"{SANDBOX_HOME}/.codex"
KEY_VARIABLE = "OPENFORGE_API_KEY"


def config_toml(model: str, base_url: str) -> str:
    """The ``config.toml`` pointing Codex at the proxy (strings quoted as TOML basic strings)."""
    return "\n".join(
        [
            f"model = {json.dumps(model)}",
            'model_provider = "openforge"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "remote_plugin = false",
            "apps = false",
            "",
            "[model_providers.openforge]",
            'name = "OpenForgeRL proxy"',
            f"base_url = {json.dumps(openai_base(base_url))}",
            f"env_key = {json.dumps(KEY_VARIABLE)}",
            'wire_api = "responses"',
            "",
        ]
    )


class CodexAdapter:
    """Codex CLI (see the module docstring)."""

    name = "codex"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``codex exec`` with a provider pointing at the proxy."""
        return HarnessLaunch(
            name=self.name,
            argv=(installed.executable if installed else "codex", "exec", "--skip-git-repo-check", ctx.instruction),
            env={"CODEX_HOME": CODEX_HOME, KEY_VARIABLE: ctx.api_key},
            files={f"{CODEX_HOME}/config.toml": config_toml(ctx.model, ctx.base_url)},
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
