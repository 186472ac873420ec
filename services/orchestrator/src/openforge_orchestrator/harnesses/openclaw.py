"""OpenClaw 2026.9.6 (npm ``openclaw``, Node >= 24.16) through the proxy's Chat Completions API.

Documented settings (``shared/reference/harness-protocols.md`` §4): a config file passed with
``--config`` whose ``models.providers.<name>`` has ``baseUrl`` = the proxy's ``/v1``, ``apiKey``
= the rollout key and ``api: "openai-completions"``, and ``agents.defaults.model.primary`` naming
it; ``update.checkOnStart: false``, ``OPENCLAW_NO_AUTO_UPDATE=1`` and ``OPENCLAW_OFFLINE=1`` (no
helper downloads) keep side traffic off; ``OPENCLAW_HOME`` is a fresh folder. Headless:
``openclaw agent exec --config FILE --cwd DIR --json --timeout S TASK`` with stdin closed.

Its sandbox gets at least :data:`MIN_MEMORY_MB`: on the demo's tasks its sandbox peaked at
1.3-1.5 GiB (cgroup v1 ``memory.max_usage_in_bytes``, measured with ``openforge eval --harness
openclaw --engine scripted-oracle``); under a 512 MiB limit it is killed before its first call,
under 1 GiB after it.
"""

from __future__ import annotations

import json

from openforge_orchestrator.domain.sandbox import SANDBOX_HOME, SANDBOX_RUN, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base

CONFIG = f"{SANDBOX_RUN}/openclaw.json"
#: The least memory an OpenClaw sandbox gets, MiB (see the module docstring).
MIN_MEMORY_MB = 2048


def config_json(model: str, base_url: str, api_key: str) -> str:
    """The OpenClaw config (JSON is valid JSON5)."""
    return json.dumps(
        {
            "update": {"checkOnStart": False},
            "models": {
                "mode": "replace",
                "providers": {
                    "openforge": {
                        "baseUrl": openai_base(base_url),
                        "apiKey": api_key,
                        "api": "openai-completions",
                        "models": [
                            {
                                "id": model,
                                "name": model,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": 128000,
                                "maxTokens": 8192,
                            }
                        ],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"openforge/{model}"}}},
        },
        indent=2,
    )


class OpenClawAdapter:
    """OpenClaw (see the module docstring)."""

    name = "openclaw"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``openclaw agent exec`` with a provider pointing at the proxy."""
        return HarnessLaunch(
            name=self.name,
            argv=(
                installed.executable if installed else "openclaw",
                "agent",
                "exec",
                "--config",
                CONFIG,
                "--cwd",
                ctx.workdir,
                "--json",
                "--timeout",
                str(max(1, int(ctx.timeout_s))),
                ctx.instruction,
            ),
            env={
                "OPENCLAW_HOME": f"{SANDBOX_HOME}/.openclaw",
                "OPENCLAW_NO_AUTO_UPDATE": "1",
                "OPENCLAW_OFFLINE": "1",
            },
            files={CONFIG: config_json(ctx.model, ctx.base_url, ctx.api_key)},
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
            min_memory_mb=MIN_MEMORY_MB,
        )
