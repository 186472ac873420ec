"""The ``command`` harness: any command line, given the proxy through placeholders and variables.

Placeholders in the argv template (Python ``str.format`` fields): ``{instruction}``,
``{base_url}`` (no ``/v1``), ``{openai_base_url}`` (with ``/v1``), ``{api_key}``, ``{model}``,
``{workdir}``. The same values are in the environment as ``OPENFORGE_INSTRUCTION_FILE`` (the
instruction also sits in ``/run/openforge/instruction.md``), ``OPENFORGE_BASE_URL``,
``OPENFORGE_API_KEY``, ``OPENFORGE_MODEL``, and the variables the OpenAI and Anthropic SDKs
read (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``).
"""

from __future__ import annotations

from openforge_orchestrator.domain.sandbox import SANDBOX_RUN, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base


class InvalidCommand(ValueError):
    """The argv template is empty or names an unknown placeholder."""


class CommandAdapter:
    """A generic command template (see the module docstring)."""

    name = "command"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """Fills the template; raises :class:`InvalidCommand` for an empty or bad one."""
        if not ctx.command:
            raise InvalidCommand("the command harness needs an argv template")
        values = {
            "instruction": ctx.instruction,
            "base_url": ctx.base_url,
            "openai_base_url": openai_base(ctx.base_url),
            "api_key": ctx.api_key,
            "model": ctx.model,
            "workdir": ctx.workdir,
        }
        try:
            argv = tuple(part.format(**values) for part in ctx.command)
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidCommand(f"bad placeholder in the command template: {exc}") from exc
        return HarnessLaunch(
            name=self.name,
            argv=argv,
            env={
                "OPENFORGE_BASE_URL": ctx.base_url,
                "OPENFORGE_API_KEY": ctx.api_key,
                "OPENFORGE_MODEL": ctx.model,
                "OPENFORGE_INSTRUCTION_FILE": f"{SANDBOX_RUN}/instruction.md",
                "OPENAI_BASE_URL": openai_base(ctx.base_url),
                "OPENAI_API_KEY": ctx.api_key,
                "ANTHROPIC_BASE_URL": ctx.base_url,
                "ANTHROPIC_API_KEY": ctx.api_key,
            },
            files={f"{SANDBOX_RUN}/instruction.md": ctx.instruction},
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
