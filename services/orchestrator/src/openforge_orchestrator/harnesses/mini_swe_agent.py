"""mini-swe-agent 2.4.6 (PyPI, with litellm[mcp] 1.106.2) through the proxy's Chat Completions API.

Run as in the captures (``shared/cases/harness-captures/README.md``):
``mini -y --exit-immediately -t TASK -m openai/<model>`` with the endpoint in litellm's
environment (``OPENAI_API_BASE`` = ``<proxy>/v1``, ``OPENAI_API_KEY`` = the rollout key);
litellm strips the ``openai/`` provider prefix, so the proxy sees ``<model>``. Side traffic
off: ``LITELLM_LOCAL_MODEL_COST_MAP=True`` stops litellm fetching its price list at import.
``MSWEA_CONFIGURED`` skips the first-run setup, ``MSWEA_COST_TRACKING=ignore_errors`` accepts a
model without a price. ``environment.timeout`` (seconds per command, 30 by default) is raised
to the rollout's time limit, which the sandbox enforces; the trajectory goes to
``/logs/agent/trajectory.json``. A run ends when a command prints
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``. A configured settings file (``config_files``) is
layered over ``mini.yaml`` with a second ``-c`` (mini-swe-agent merges config specs in order);
its text is written into the sandbox (:data:`SETTINGS_FILE`), nothing of the host is exposed.
"""

from __future__ import annotations

from openforge_orchestrator.domain.sandbox import AGENT_LOGS, SANDBOX_HOME, SANDBOX_RUN, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base

#: Where a configured settings file's text is written in the sandbox.
SETTINGS_FILE = f"{SANDBOX_RUN}/mini-swe-agent.yaml"


class MiniSweAgentAdapter:
    """mini-swe-agent (see the module docstring)."""

    name = "mini-swe-agent"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``mini`` with litellm pointed at the proxy."""
        layered = ("-c", SETTINGS_FILE) if ctx.config_text else ()
        roots = installed.roots if installed else ()
        return HarnessLaunch(
            name=self.name,
            argv=(
                installed.executable if installed else "mini",
                "-y",
                "--exit-immediately",
                "--cost-limit",
                "0",
                "-m",
                f"openai/{ctx.model}",
                "-c",
                "mini.yaml",
                *layered,
                "-c",
                f"environment.timeout={max(1, int(ctx.timeout_s))}",
                "-o",
                f"{AGENT_LOGS}/trajectory.json",
                "-t",
                ctx.instruction,
            ),
            env={
                "OPENAI_API_BASE": openai_base(ctx.base_url),
                "OPENAI_API_KEY": ctx.api_key,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MSWEA_CONFIGURED": "true",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "MSWEA_SILENT_STARTUP": "1",
                # mini-swe-agent retries a refused call (e.g. the session's turn limit, HTTP 400)
                # 10 times with backoff up to 60 s, minutes per rollout; 3 attempts still ride
                # out a transient failure.
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
                "MSWEA_GLOBAL_CONFIG_DIR": f"{SANDBOX_HOME}/.config/mini-swe-agent",
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
            install_dirs=roots,
            files={SETTINGS_FILE: ctx.config_text} if ctx.config_text else {},
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
