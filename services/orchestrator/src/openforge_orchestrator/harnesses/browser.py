"""The project's browser harness (``openforge-browser``, ``libs/browser``) through the proxy's Chat
Completions API.

It opens the task's page (``<workdir>/index.html``, the ``miniwob`` family's convention) in
headless Chromium, sends the page's accessibility tree with the instruction to the model and
executes the returned tool calls (click, type_text, press_key, scroll, done) for at most
:data:`MAX_STEPS` calls. The endpoint is in the OpenAI SDK's variables (``OPENAI_BASE_URL`` =
``<proxy>/v1``, ``OPENAI_API_KEY`` = the rollout key), the instruction in
``/run/openforge/instruction.md``. The episode record with the final page state goes to
``<workdir>/page_state.json``, where the task's verifier reads it. No side traffic: the page is a
local file and Chromium runs with its network to the loopback only (the sandbox's).
"""

from __future__ import annotations

from typing import Final

from openforge_orchestrator.domain.sandbox import SANDBOX_RUN, HarnessLaunch
from openforge_orchestrator.harnesses.base import Installed, LaunchContext, openai_base

#: The page a browser task opens, inside its workdir.
PAGE_FILE: Final = "index.html"
#: The episode record (answer, actions, final page state) the verifier reads, inside the workdir.
STATE_FILE: Final = "page_state.json"
#: Most model calls per episode.
MAX_STEPS: Final = 10


class BrowserAdapter:
    """``openforge-browser`` (see the module docstring)."""

    name = "browser"

    def launch(self, ctx: LaunchContext, installed: Installed | None) -> HarnessLaunch:
        """``openforge-browser`` on the task's page, the proxy as its endpoint."""
        workdir = ctx.workdir.rstrip("/")
        return HarnessLaunch(
            name=self.name,
            argv=(
                installed.executable if installed else "openforge-browser",
                "--url",
                f"file://{workdir}/{PAGE_FILE}",
                "--instruction-file",
                f"{SANDBOX_RUN}/instruction.md",
                "--model",
                ctx.model,
                "--max-steps",
                str(MAX_STEPS),
                "--out",
                f"{workdir}/{STATE_FILE}",
            ),
            env={
                "OPENAI_BASE_URL": openai_base(ctx.base_url),
                "OPENAI_API_KEY": ctx.api_key,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
            files={f"{SANDBOX_RUN}/instruction.md": ctx.instruction},
            install_dirs=installed.roots if installed else (),
            path_dirs=installed.path if installed else (),
            version=installed.version if installed else "",
        )
