"""Tasks in the Harbor task-folder format (the one Terminal-Bench 2 and other public task sets use).

A task folder holds::

    task.toml            timeouts, resources, metadata
    instruction.md       what the agent is asked (the harness's prompt)
    environment/         Dockerfile and its build context (the agent's starting state)
    tests/test.sh        the verifier: writes /logs/verifier/reward.txt (a float) or reward.json
    solution/solve.sh    optional oracle solution

``task.toml`` keys read (both Harbor schema 1.0 and 1.1 spellings): ``[agent].timeout_sec``,
``[verifier].timeout_sec``, ``[verifier].env``, ``[environment].cpus``, ``memory_mb`` or
``memory`` ("2G"), ``storage_mb`` or ``storage``, ``allow_internet``, ``docker_image``; the rest
is kept as metadata. Source: harborframework.com/docs/tasks.

The local sandbox cannot run a Dockerfile; it reads the subset a workspace needs
(:class:`EnvironmentSpec`): ``WORKDIR``, ``ENV``, ``COPY``/``ADD`` of build-context files and
``RUN`` commands, which it runs inside the sandbox once per task to prepare the workspace.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from openforge_core.errors import InvalidArgument, NotFound
from openforge_core.manifest import files_digest

DEFAULT_WORKDIR = "/app"
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS_MB = {"": 1.0 / (1024 * 1024), "K": 1.0 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


class InvalidTask(InvalidArgument):
    """A task folder that does not follow the format (missing file, bad TOML, bad value)."""

    default_reason = "INVALID_TASK"


@dataclass(frozen=True)
class Resources:
    """What one sandbox of the task may use.

    Attributes:
        cpus: CPU cores (fractions allowed).
        memory_mb: Memory limit, MiB.
        storage_mb: Disk the workspace may use, MiB (0 = no limit given).
    """

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None


@dataclass(frozen=True)
class EnvironmentSpec:
    """What the local sandbox takes from ``environment/Dockerfile``.

    Attributes:
        base_image: The ``FROM`` image (used by the Kubernetes backend's task image).
        workdir: Last ``WORKDIR`` (the harness's working folder), absolute.
        env: ``ENV`` variables in order.
        copies: ``(source in the build context, absolute destination)`` per ``COPY``/``ADD`` source.
        run: ``RUN`` commands (shell form; an exec form is quoted into one).
    """

    base_image: str = ""
    workdir: str = DEFAULT_WORKDIR
    env: tuple[tuple[str, str], ...] = ()
    copies: tuple[tuple[str, str], ...] = ()
    run: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    """One task folder, loaded.

    Attributes:
        task_id: The folder's name.
        task_set: The set it belongs to.
        path: The folder.
        instruction: ``instruction.md``'s text.
        agent_timeout_s: The harness's time limit, seconds.
        verifier_timeout_s: The verifier's time limit, seconds.
        resources: Sandbox limits.
        allow_internet: Whether the task asks for internet (never granted: only the proxy).
        docker_image: A prebuilt task image named by the task (Kubernetes backend).
        environment: The Dockerfile subset.
        verifier_env: Extra environment of the verifier.
        metadata: Everything else in ``task.toml``.
    """

    task_id: str
    task_set: str
    path: Path
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    resources: Resources
    allow_internet: bool
    docker_image: str
    environment: EnvironmentSpec
    verifier_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``<task_set>/<task_id>``, unique over the catalog."""
        return f"{self.task_set}/{self.task_id}"

    @property
    def tests_dir(self) -> Path:
        """``tests/`` (holds ``test.sh``)."""
        return self.path / "tests"

    @property
    def environment_dir(self) -> Path:
        """``environment/`` (the build context)."""
        return self.path / "environment"

    @property
    def solution_script(self) -> Path | None:
        """``solution/solve.sh`` when the task ships an oracle."""
        p = self.path / "solution" / "solve.sh"
        return p if p.is_file() else None


def parse_size_mb(value: object, what: str) -> int:
    """``2048`` (MiB) or ``"2G"``/``"512M"``/``"1.5GiB"`` → MiB.

    Raises:
        InvalidTask: Not a size.
    """
    if isinstance(value, bool):
        raise InvalidTask.field(what, f"not a size: {value!r}")
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return max(1, int(float(m.group(1)) * _UNITS_MB[m.group(2).upper()]))
    raise InvalidTask.field(what, f"not a size: {value!r}")


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def _json_or_words(args: str) -> list[str]:
    if args.startswith("["):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            return parsed
    return shlex.split(args)


def _resolve(workdir: str, dst: str) -> str:
    p = PurePosixPath(dst)
    return str(p if p.is_absolute() else PurePosixPath(workdir) / p)


def parse_dockerfile(text: str, what: str = "environment/Dockerfile") -> EnvironmentSpec:
    """Reads the subset of a Dockerfile a local workspace needs.

    ``FROM``, ``WORKDIR``, ``ENV``, ``COPY``/``ADD`` (build-context sources; flags such as
    ``--chown`` are ignored) and ``RUN`` are read; ``ARG``, ``LABEL``, ``USER``, ``EXPOSE``,
    ``CMD``, ``ENTRYPOINT`` and the like do not change a workspace and are skipped.

    Raises:
        InvalidTask: ``COPY --from`` (multi-stage), an ``ADD`` of a URL, or a malformed line.
    """
    base = ""
    workdir = DEFAULT_WORKDIR
    env: list[tuple[str, str]] = []
    copies: list[tuple[str, str]] = []
    run: list[str] = []
    for line in _logical_lines(text):
        word, _, args = line.partition(" ")
        op = word.upper()
        args = args.strip()
        if op == "FROM":
            base = args.split()[0] if args else ""
        elif op == "WORKDIR":
            workdir = _resolve(workdir, args)
        elif op == "ENV":
            if "=" in args.split(" ", 1)[0]:
                for item in shlex.split(args):
                    k, _, v = item.partition("=")
                    env.append((k, v))
            else:
                k, _, v = args.partition(" ")
                env.append((k, v.strip()))
        elif op in ("COPY", "ADD"):
            raw = _json_or_words(args)
            parts = [p for p in raw if not p.startswith("--")]
            if any(p.startswith("--from") for p in raw):
                raise InvalidTask.field(what, "COPY --from (multi-stage builds) is not supported by local sandboxes")
            if len(parts) < 2:
                raise InvalidTask.field(what, f"{op} needs a source and a destination: {line!r}")
            *sources, dst = parts
            for src in sources:
                if "://" in src:
                    raise InvalidTask.field(what, f"{op} of a URL cannot be prepared offline: {src!r}")
                target = _resolve(workdir, dst)
                if dst.endswith("/") or len(sources) > 1:
                    target = target.rstrip("/") + "/"
                copies.append((src, target))
        elif op == "RUN":
            words = _json_or_words(args) if args.startswith("[") else None
            run.append(shlex.join(words) if words is not None else args)
    return EnvironmentSpec(base_image=base, workdir=workdir, env=tuple(env), copies=tuple(copies), run=tuple(run))


def _float(table: dict[str, Any], key: str, default: float, what: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidTask.field(what, f"must be a positive number, got {value!r}")
    return float(value)


def load_task(path: Path, task_set: str) -> Task:
    """Loads one Harbor task folder.

    Args:
        path: The task folder.
        task_set: Name of the set it belongs to.

    Returns:
        The task.

    Raises:
        InvalidTask: A required file is missing, ``task.toml`` does not parse, or a value is wrong.
    """
    task_id = path.name
    for required in ("task.toml", "instruction.md", "tests/test.sh"):
        if not (path / required).is_file():
            raise InvalidTask.field(required, f"task {task_set}/{task_id} has no {required}")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InvalidTask.field("task.toml", f"{task_set}/{task_id}: {exc}") from exc
    agent = config.get("agent", {})
    verifier = config.get("verifier", {})
    env_table = config.get("environment", {})
    cpus = env_table.get("cpus")
    memory = env_table.get("memory_mb", env_table.get("memory"))
    storage = env_table.get("storage_mb", env_table.get("storage"))
    dockerfile = path / "environment" / "Dockerfile"
    spec = parse_dockerfile(dockerfile.read_text()) if dockerfile.is_file() else EnvironmentSpec()
    return Task(
        task_id=task_id,
        task_set=task_set,
        path=path,
        instruction=(path / "instruction.md").read_text(),
        agent_timeout_s=_float(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, "agent.timeout_sec"),
        verifier_timeout_s=_float(verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, "verifier.timeout_sec"),
        resources=Resources(
            cpus=float(cpus) if cpus is not None else None,
            memory_mb=parse_size_mb(memory, "environment.memory") if memory is not None else None,
            storage_mb=parse_size_mb(storage, "environment.storage") if storage is not None else None,
        ),
        allow_internet=bool(env_table.get("allow_internet", False)),
        docker_image=str(env_table.get("docker_image", "")),
        environment=spec,
        verifier_env={str(k): str(v) for k, v in verifier.get("env", {}).items()},
        metadata={k: v for k, v in config.items() if k not in ("agent", "verifier", "environment")},
    )


class TaskCatalog:
    """Task sets under one root folder, loaded on first use and cached.

    Args:
        root: Folder whose sub-folders are task sets.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, str], Task] = {}

    def _set_dir(self, task_set: str) -> Path:
        if not _ID.match(task_set):
            raise InvalidArgument.field("task_set", f"not a task set name: {task_set!r}")
        folder = self.root / task_set
        if not folder.is_dir():
            raise NotFound(f"no task set {task_set!r} under {self.root}", metadata={"task_set": task_set})
        return folder

    def get(self, task_set: str, task_id: str) -> Task:
        """One task.

        Raises:
            InvalidArgument: A malformed name, or a malformed task folder (:class:`InvalidTask`).
            NotFound: No such task set or task.
        """
        key = (task_set, task_id)
        if key in self._cache:
            return self._cache[key]
        if not _ID.match(task_id):
            raise InvalidArgument.field("task_id", f"not a task id: {task_id!r}")
        folder = self._set_dir(task_set) / task_id
        if not (folder / "task.toml").is_file():
            raise NotFound(f"no task {task_set}/{task_id}", metadata={"task_set": task_set, "task_id": task_id})
        task = load_task(folder, task_set)
        self._cache[key] = task
        return task

    def ids(self, task_set: str) -> list[str]:
        """Task ids of a set, sorted.

        Raises:
            NotFound: No such task set.
        """
        return sorted(p.name for p in self._set_dir(task_set).iterdir() if (p / "task.toml").is_file())

    def sets(self) -> list[str]:
        """Names of the task sets, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _ID.match(p.name))

    def verifier_version(self) -> str:
        """``sha256:<hex>`` over the ``tests/`` folder of every task of every set (the run
        manifest's ``verifier_version``): per file, in order of its path
        ``<task_set>/<task_id>/tests/<relative path>``, that path and the file's bytes (a symbolic
        link: ``symlink:`` and its target). Reads the files now: a changed test changes it.

        Raises:
            OSError: A file could not be read.
        """
        files: list[tuple[str, bytes]] = []
        for task_set in self.sets():
            for task_id in self.ids(task_set):
                tests = self.root / task_set / task_id / "tests"
                for folder, _, names in os.walk(tests):
                    for name in names:
                        path = Path(folder) / name
                        key = f"{task_set}/{task_id}/tests/{path.relative_to(tests).as_posix()}"
                        content = f"symlink:{os.readlink(path)}".encode() if path.is_symlink() else path.read_bytes()
                        files.append((key, content))
        return files_digest(sorted(files))
