"""The project's browser harness (``openforge-browser``, ``libs/browser``) through the proxy, in the
wire API its settings name (Chat Completions by default).

It opens the task's page (``<workdir>/index.html``, the ``miniwob`` family's convention) in
headless Chromium, sends the page's accessibility tree with the instruction to the model and
executes the returned tool calls (click, type_text, press_key, scroll, done) for at most
:data:`MAX_STEPS` calls. The endpoint is in the OpenAI SDK's variables (``OPENAI_BASE_URL`` =
``<proxy>/v1``, ``OPENAI_API_KEY`` = the rollout key) or, with ``api: messages``, the Anthropic
SDK's (``ANTHROPIC_BASE_URL`` = the proxy, ``ANTHROPIC_API_KEY``); the instruction in
``/run/openforge/instruction.md``. The episode record with the final page state goes to
``<workdir>/page_state.json``, where the task's verifier reads it. No side traffic: the page is a
local file and Chromium runs with its network to the loopback only (the sandbox's).

Settings (``harness.config_files``: ``{browser: FILE}``): a JSON object with ``api`` (``chat``,
``messages`` or ``responses``, passed as ``--api``) and ``max_steps`` (most model calls), each
optional; e.g. ``{"api": "messages"}``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from openforge_orchestrator.domain.sandbox import SANDBOX_RUN, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base

#: The page a browser task opens, inside its workdir.
PAGE_FILE: Final = "index.html"
#: The episode record (answer, actions, final page state) the verifier reads, inside the workdir.
STATE_FILE: Final = "page_state.json"
#: Most model calls per episode.
MAX_STEPS: Final = 10
#: The wire APIs ``openforge-browser --api`` speaks.
APIS: Final = ("chat", "messages", "responses")


def browser_settings(text: str) -> tuple[str, int]:
    """The ``(api, max_steps)`` of a settings file's text (empty: the defaults).

    Raises:
        ValueError: Not a JSON object, an unknown key, an unknown API or a non-positive step limit.
    """
    doc: Any = json.loads(text) if text.strip() else {}
    if not isinstance(doc, dict):
        raise ValueError("browser settings: must be a JSON object")
    unknown = sorted(set(doc) - {"api", "max_steps"})
    if unknown:
        raise ValueError(f"browser settings: unknown keys {unknown} (api, max_steps)")
    api = doc.get("api", "chat")
    if api not in APIS:
        raise ValueError(f"browser settings: api must be one of {', '.join(APIS)}, not {api!r}")
    steps = doc.get("max_steps", MAX_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"browser settings: max_steps must be a positive integer, not {steps!r}")
    return api, steps


class BrowserAdapter:
    """``openforge-browser`` (see the module docstring)."""

    name = "browser"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``openforge-browser`` on the task's page, the proxy as its endpoint in the configured API."""
        workdir = ctx.workdir.rstrip("/")
        api, max_steps = browser_settings(ctx.config_text)
        endpoint = (
            {"ANTHROPIC_BASE_URL": ctx.base_url, "ANTHROPIC_API_KEY": ctx.api_key}
            if api == "messages"
            else {"OPENAI_BASE_URL": openai_base(ctx.base_url), "OPENAI_API_KEY": ctx.api_key}
        )
        return HarnessLaunch(
            name=self.name,
            argv=(
                installed.executable if installed else "openforge-browser",
                "--url",
                f"file://{workdir}/{PAGE_FILE}",
                "--instruction-file",
                f"{SANDBOX_RUN}/instruction.md",
                "--api",
                api,
                "--model",
                ctx.model,
                "--max-steps",
                str(max_steps),
                "--out",
                f"{workdir}/{STATE_FILE}",
            ),
            env={
                **endpoint,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
            files={f"{SANDBOX_RUN}/instruction.md": ctx.instruction},
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
