"""What every harness adapter reads: the launch context and the local install manifest.

``openforge harness install NAME`` (``libs/cli``) installs pinned versions into
``<install_dir>/<NAME>/`` and writes ``manifest.json`` there::

    {"name": "mini-swe-agent", "version": "2.4.6", "executable": "<abs path>",
     "path": ["<abs dir>", ...], "roots": ["<abs dir>", ...]}

``path`` goes first on the harness's PATH; ``roots`` are made visible read-only inside local
sandboxes (the install itself and any runtime it needs, such as a Node.js).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"


class HarnessNotInstalled(Exception):
    """The harness has no install manifest under the install folder."""


@dataclass(frozen=True)
class LaunchContext:
    """One rollout as a harness adapter sees it.

    Attributes:
        instruction: The task's instruction (the prompt).
        base_url: The proxy's base URL inside the sandbox, without ``/v1``.
        api_key: The rollout's proxy key.
        model: Model name the harness must send (the proxy checks it).
        workdir: The task's working folder inside the sandbox.
        timeout_s: The harness's time limit, seconds.
        command: Argv template of the ``command`` harness.
        config_text: Text of a settings file layered over the harness's defaults (empty: none);
            the adapter writes it into the sandbox.
    """

    instruction: str
    base_url: str
    api_key: str
    model: str
    workdir: str
    timeout_s: float
    command: tuple[str, ...] = ()
    config_text: str = ""


@dataclass(frozen=True)
class Installed:
    """A harness installed by ``openforge harness install``.

    Attributes:
        name: Harness name.
        version: Installed version.
        executable: The harness's command.
        path: Folders to put first on PATH.
        roots: Folders to make visible in local sandboxes.
    """

    name: str
    version: str
    executable: str
    path: tuple[str, ...]
    roots: tuple[str, ...]

    @classmethod
    def load(cls, install_dir: Path, name: str) -> Installed:
        """Reads ``<install_dir>/<name>/manifest.json``.

        Raises:
            HarnessNotInstalled: No manifest (run ``openforge harness install NAME``).
        """
        path = install_dir / name / MANIFEST
        if not path.is_file():
            raise HarnessNotInstalled(
                f"{name} is not installed in {install_dir}: run `openforge harness install {name}`"
            )
        doc = json.loads(path.read_text())
        return cls(
            name=str(doc["name"]),
            version=str(doc["version"]),
            executable=str(doc["executable"]),
            path=tuple(str(p) for p in doc.get("path", [])),
            roots=tuple(str(p) for p in doc.get("roots", [])),
        )


def openai_base(base_url: str) -> str:
    """``<base>/v1``: what OpenAI-style clients expect."""
    return base_url.rstrip("/") + "/v1"
