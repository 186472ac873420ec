"""Stubs of the Tilt builtins, for evaluating a Tiltfile without Tilt.

Each stub has the parameter names and defaults of Tilt's own API (docs.tilt.dev/api.html, the
Python signatures Tilt generates that page from), so a misspelled keyword or a missing
argument fails exactly as it would in Tilt. The stubs do not build or deploy anything; they
record what the Tiltfile asked for and check on the spot what Tilt would check when it loads
the file (paths that must exist, Dockerfile stages, the order of live-update steps). Checks
that need the whole file are in ``tilt_check.analyze``.

Only the builtins this project's Tiltfile uses, and their close relatives, are stubbed; a
builtin without a stub is an undefined name, and evaluation fails until a stub is added here.
Extensions (``load('ext://...')``) are stubbed the same way, from the extension's source.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import starlark as sl
import yaml

from tools.deploy.dockerfiles import parse_dockerfile

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


class TiltfileError(ValueError):
    """What Tilt would report as an error while loading the Tiltfile."""


@dataclass(frozen=True)
class Blob:
    """Tilt's ``Blob``: text that is content, not a path (``kustomize`` output, ``local``)."""

    text: str


@dataclass(frozen=True)
class SyncStep:
    """``sync(local_path, remote_path)``."""

    local_path: str
    remote_path: str


@dataclass(frozen=True)
class RunStep:
    """``run(cmd, trigger, echo_off)``."""

    cmd: str | tuple[str, ...]
    trigger: tuple[str, ...]


@dataclass(frozen=True)
class FallBackOnStep:
    """``fall_back_on(files)``."""

    files: tuple[str, ...]


@dataclass(frozen=True)
class InitialSyncStep:
    """``initial_sync()``."""


@dataclass(frozen=True)
class RestartContainerStep:
    """``restart_container()`` (Docker Compose only; deprecated for Kubernetes)."""


LiveUpdateStep = SyncStep | RunStep | FallBackOnStep | InitialSyncStep | RestartContainerStep


@dataclass(frozen=True)
class Link:
    """``link(url, name)``."""

    url: str
    name: str | None


@dataclass(frozen=True)
class PortForward:
    """``port_forward(local_port, container_port, name, link_path, host)``."""

    local_port: int
    container_port: int | None = None
    name: str | None = None
    link_path: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class TriggerMode:
    """``TRIGGER_MODE_AUTO`` or ``TRIGGER_MODE_MANUAL``."""

    name: str


TRIGGER_MODE_AUTO = TriggerMode("auto")
TRIGGER_MODE_MANUAL = TriggerMode("manual")


@dataclass
class DockerBuild:
    """One ``docker_build`` call (the extension's wrappers record theirs here too).

    Attributes:
        ref: image name; Tilt injects the built image wherever a workload uses this name.
        context: build context, relative to the Tiltfile's folder.
        dockerfile: Dockerfile path relative to the Tiltfile's folder ("" when inline).
        dockerfile_contents: inline Dockerfile text ("" when from a file).
        target: the Dockerfile stage built ("" for the last one).
        build_args: ``--build-arg`` values.
        only: context paths that are part of the build (empty: the whole context).
        ignore: dockerignore-style patterns excluded from the context.
        live_update: live-update steps, in order.
        entrypoint: the command that replaces the image's entrypoint, if any.
        base_of: for an extension's internal base image, the ref of the image built on it.
    """

    ref: str
    context: str
    dockerfile: str
    dockerfile_contents: str
    target: str
    build_args: dict[str, str]
    only: list[str]
    ignore: list[str]
    live_update: list[LiveUpdateStep]
    entrypoint: list[str] | str
    base_of: str | None = None


@dataclass
class LocalResource:
    """One ``local_resource`` call."""

    name: str
    cmd: str | list[str]
    deps: list[str]
    resource_deps: list[str]
    labels: list[str]
    trigger_mode: TriggerMode
    auto_init: bool
    links: list[Link]


@dataclass
class K8sResource:
    """One ``k8s_resource`` call."""

    workload: str
    new_name: str
    port_forwards: list[str | int | PortForward]
    resource_deps: list[str]
    objects: list[str]
    labels: list[str]
    links: list[str | Link]
    trigger_mode: TriggerMode
    auto_init: bool


@dataclass
class TiltRun:
    """Everything one evaluation of a Tiltfile asked Tilt to do.

    Attributes:
        root: the Tiltfile's folder; relative paths are relative to it.
        flags: the config values ``config.parse()`` returned.
        images: ``docker_build`` calls, in order.
        local_resources: ``local_resource`` calls.
        k8s_resources: ``k8s_resource`` calls.
        yaml_objects: every Kubernetes object given to ``k8s_yaml``.
        kustomized: folders passed to ``kustomize``.
        defined_flags: config settings the Tiltfile defined, by name.
        enabled_resources: the argument of ``config.set_enabled_resources``, if called.
        allowed_contexts: contexts passed to ``allow_k8s_contexts``.
        warnings: messages passed to ``warn``.
        loads: extensions and files loaded.
    """

    root: Path
    flags: dict[str, Any]
    images: list[DockerBuild] = field(default_factory=list)
    local_resources: list[LocalResource] = field(default_factory=list)
    k8s_resources: list[K8sResource] = field(default_factory=list)
    yaml_objects: list[dict[str, Any]] = field(default_factory=list)
    kustomized: list[str] = field(default_factory=list)
    defined_flags: dict[str, str] = field(default_factory=dict)
    enabled_resources: list[str] | None = None
    allowed_contexts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)


def _as_list(value: object) -> list[Any]:
    """Tilt accepts a single value or a list for many parameters."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _strs(value: object, what: str) -> list[str]:
    items = _as_list(value)
    for item in items:
        if not isinstance(item, str):
            raise TiltfileError(f"{what}: expected strings, got {item!r}")
    return [str(item) for item in items]


_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _labels(value: object) -> list[str]:
    labels = _strs(value, "labels")
    for label in labels:
        if not _LABEL.match(label):
            raise TiltfileError(f"invalid label {label!r}")
    return labels


class TiltStubs:
    """The Tilt builtins, recording into a :class:`TiltRun`.

    Args:
        root: the Tiltfile's folder.
        flags: what ``config.parse()`` returns (as ``tilt up -- --flag`` would set).
        kustomize_builder: runs ``kustomize build`` on a folder and returns the YAML.
        k8s_context_name: what ``k8s_context()`` returns.
    """

    def __init__(
        self,
        root: Path,
        flags: Mapping[str, Any],
        kustomize_builder: Callable[[Path], str],
        k8s_context_name: str = "kind-openforge",
    ) -> None:
        self.run_record = TiltRun(root=root, flags=dict(flags))
        self._root = root
        self._kustomize_builder = kustomize_builder
        self._k8s_context = k8s_context_name

    # --- helpers ------------------------------------------------------------------------

    def _path(self, path: str, what: str, *, base: Path | None = None, kind: str = "any") -> Path:
        if not isinstance(path, str) or not path:
            raise TiltfileError(f"{what}: expected a path, got {path!r}")
        resolved = ((base or self._root) / path).resolve()
        if not resolved.exists():
            raise TiltfileError(f"{what}: {path} does not exist")
        if kind == "dir" and not resolved.is_dir():
            raise TiltfileError(f"{what}: {path} is not a directory")
        if kind == "file" and not resolved.is_file():
            raise TiltfileError(f"{what}: {path} is not a file")
        return resolved

    def _inside(self, path: Path, folder: Path) -> bool:
        return path == folder or folder in path.parents

    def _add_yaml(self, text: str, source: str, allow_duplicates: bool) -> None:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as err:
            raise TiltfileError(f"k8s_yaml: {source}: {err}") from err
        seen = {_object_key(o) for o in self.run_record.yaml_objects}
        for doc in docs:
            if not isinstance(doc, dict) or "kind" not in doc:
                raise TiltfileError(f"k8s_yaml: {source}: not a Kubernetes object: {doc!r:.80}")
            key = _object_key(doc)
            if key in seen and not allow_duplicates:
                raise TiltfileError(f"k8s_yaml: {source}: duplicate object {key}")
            seen.add(key)
            self.run_record.yaml_objects.append(doc)

    # --- images -------------------------------------------------------------------------

    def docker_build(
        self,
        ref: str,
        context: str,
        build_args: Mapping[str, str] | None = None,
        dockerfile: str = "Dockerfile",
        dockerfile_contents: str | Blob = "",
        live_update: Sequence[LiveUpdateStep] = (),
        match_in_env_vars: bool = False,
        ignore: str | Sequence[str] = (),
        only: str | Sequence[str] = (),
        entrypoint: str | Sequence[str] = (),
        target: str = "",
        ssh: str | Sequence[str] = "",
        network: str = "",
        secret: str | Sequence[str] = "",
        extra_tag: str | Sequence[str] = "",
        container_args: Sequence[str] | None = None,
        cache_from: str | Sequence[str] = (),
        pull: bool = False,
        platform: str = "",
        extra_hosts: str | Sequence[str] = (),
    ) -> None:
        """Records a ``docker_build`` and checks its paths, stage, build args and steps."""
        return self._docker_build(
            ref,
            context,
            build_args=build_args,
            dockerfile=dockerfile,
            dockerfile_contents=dockerfile_contents,
            live_update=live_update,
            ignore=ignore,
            only=only,
            entrypoint=entrypoint,
            target=target,
        )

    def _docker_build(
        self,
        ref: str,
        context: str,
        *,
        build_args: Mapping[str, str] | None,
        dockerfile: str,
        dockerfile_contents: str | Blob,
        live_update: Sequence[LiveUpdateStep],
        ignore: str | Sequence[str],
        only: str | Sequence[str],
        entrypoint: str | Sequence[str],
        target: str,
        base_of: str | None = None,
    ) -> None:
        what = f"docker_build({ref!r})"
        if not isinstance(ref, str) or not ref:
            raise TiltfileError("docker_build: ref must be a non-empty string")
        ctx = self._path(context, f"{what}: context", kind="dir")
        inline = dockerfile_contents.text if isinstance(dockerfile_contents, Blob) else dockerfile_contents
        args = {str(k): str(v) for k, v in (build_args or {}).items()}
        if inline:
            df_path = ""
        else:
            df = self._path(dockerfile, f"{what}: dockerfile", kind="file")
            df_path = dockerfile
            parsed = parse_dockerfile(df)
            if target and target not in parsed.stage_names:
                raise TiltfileError(
                    f"{what}: target {target!r} is not a stage of {dockerfile} "
                    f"(stages: {', '.join(parsed.stage_names)})"
                )
            for name in args:
                if name not in parsed.arg_names:
                    raise TiltfileError(f"{what}: build arg {name!r} is not an ARG of {dockerfile}")
        only_list = _strs(only, f"{what}: only")
        only_paths = [self._path(p, f"{what}: only", base=ctx) for p in only_list]
        steps = list(live_update)
        self._check_live_update(what, ctx, only_paths, steps)
        ep: list[str] | str = entrypoint if isinstance(entrypoint, str) else _strs(entrypoint, "entrypoint")
        self.run_record.images.append(
            DockerBuild(
                ref=ref,
                context=context,
                dockerfile=df_path,
                dockerfile_contents=inline,
                target=target,
                build_args=args,
                only=only_list,
                ignore=_strs(ignore, f"{what}: ignore"),
                live_update=steps,
                entrypoint=ep,
                base_of=base_of,
            )
        )

    def _check_live_update(self, what: str, ctx: Path, only: list[Path], steps: list[LiveUpdateStep]) -> None:
        watched = only or [ctx]

        def check_local(path: str, step: str) -> None:
            resolved = self._path(path, f"{what}: {step}")
            if not any(self._inside(resolved, w) for w in watched):
                raise TiltfileError(f"{what}: {step}: {path} is outside the build's files")

        phase = 0  # 0: initial_sync/fall_back_on, 1: sync, 2: run, 3: restart_container
        for index, step in enumerate(steps):
            if isinstance(step, InitialSyncStep):
                if index != 0:
                    raise TiltfileError(f"{what}: initial_sync() must be the first step")
            elif isinstance(step, FallBackOnStep):
                if phase > 0:
                    raise TiltfileError(f"{what}: fall_back_on() must precede every other step")
                for file in step.files:
                    check_local(file, "fall_back_on")
            elif isinstance(step, SyncStep):
                if phase > 1:
                    raise TiltfileError(f"{what}: sync() may not follow run()")
                phase = 1
                check_local(step.local_path, "sync")
                if not step.remote_path.startswith("/"):
                    raise TiltfileError(f"{what}: sync remote path {step.remote_path!r} is not absolute")
            elif isinstance(step, RunStep):
                phase = 2
                for file in step.trigger:
                    check_local(file, "run trigger")
            elif isinstance(step, RestartContainerStep):
                if index != len(steps) - 1:
                    raise TiltfileError(f"{what}: restart_container() must be the last step")
                phase = 3
            else:
                raise TiltfileError(f"{what}: live_update: not a live-update step: {step!r}")

    def sync(self, local_path: str, remote_path: str) -> sl.OpaquePythonObject:
        """``sync(local_path, remote_path)``."""
        return sl.OpaquePythonObject(SyncStep(str(local_path), str(remote_path)))

    def run(
        self, cmd: str | Sequence[str], trigger: str | Sequence[str] = (), echo_off: bool = False
    ) -> sl.OpaquePythonObject:
        """``run(cmd, trigger=[], echo_off=False)``."""
        command: str | tuple[str, ...] = cmd if isinstance(cmd, str) else tuple(_strs(cmd, "run"))
        return sl.OpaquePythonObject(RunStep(command, tuple(_strs(trigger, "run: trigger"))))

    def fall_back_on(self, files: str | Sequence[str]) -> sl.OpaquePythonObject:
        """``fall_back_on(files)``."""
        return sl.OpaquePythonObject(FallBackOnStep(tuple(_strs(files, "fall_back_on"))))

    def initial_sync(self) -> sl.OpaquePythonObject:
        """``initial_sync()``."""
        return sl.OpaquePythonObject(InitialSyncStep())

    def restart_container(self) -> sl.OpaquePythonObject:
        """``restart_container()``."""
        return sl.OpaquePythonObject(RestartContainerStep())

    # --- Kubernetes ---------------------------------------------------------------------

    def k8s_yaml(self, yaml: str | Sequence[str] | Blob, allow_duplicates: bool = False) -> None:
        """``k8s_yaml(yaml, allow_duplicates=False)``: a path, a list of paths or a Blob."""
        if isinstance(yaml, Blob):
            self._add_yaml(yaml.text, "blob", allow_duplicates)
            return
        for item in _as_list(yaml):
            if isinstance(item, Blob):
                self._add_yaml(item.text, "blob", allow_duplicates)
                continue
            path = self._path(str(item), "k8s_yaml", kind="file")
            self._add_yaml(path.read_text(), str(item), allow_duplicates)

    def kustomize(
        self,
        pathToDir: str,  # Tilt's parameter name
        kustomize_bin: str | None = None,
        flags: Sequence[str] = (),
    ) -> sl.OpaquePythonObject:
        """``kustomize(pathToDir, kustomize_bin=None, flags=[])``: runs kustomize build."""
        folder = self._path(pathToDir, "kustomize", kind="dir")
        if not any((folder / n).is_file() for n in KUSTOMIZATION_FILES):
            raise TiltfileError(f"kustomize: {pathToDir} has no kustomization file")
        if flags:
            raise TiltfileError("kustomize: flags are not supported by this check")
        self.run_record.kustomized.append(pathToDir)
        return sl.OpaquePythonObject(Blob(self._kustomize_builder(folder)))

    def k8s_resource(
        self,
        workload: str = "",
        new_name: str = "",
        port_forwards: str | int | PortForward | Sequence[str | int | PortForward] = (),
        extra_pod_selectors: Mapping[str, str] | Sequence[Mapping[str, str]] = (),
        trigger_mode: TriggerMode = TRIGGER_MODE_AUTO,
        resource_deps: Sequence[str] = (),
        objects: Sequence[str] = (),
        auto_init: bool = True,
        pod_readiness: str = "",
        links: str | Link | Sequence[str | Link] = (),
        labels: str | Sequence[str] = (),
        discovery_strategy: str = "",
    ) -> None:
        """Records a ``k8s_resource``; ``tilt_check.analyze`` matches it to the YAML."""
        if not workload and not (new_name and objects):
            raise TiltfileError("k8s_resource: give `workload`, or both `new_name` and `objects`")
        if pod_readiness not in ("", "ignore", "wait"):
            raise TiltfileError(f"k8s_resource: pod_readiness {pod_readiness!r}")
        if discovery_strategy not in ("", "default", "selectors-only"):
            raise TiltfileError(f"k8s_resource: discovery_strategy {discovery_strategy!r}")
        if not isinstance(trigger_mode, TriggerMode):
            raise TiltfileError(f"k8s_resource: trigger_mode {trigger_mode!r}")
        self.run_record.k8s_resources.append(
            K8sResource(
                workload=workload,
                new_name=new_name,
                port_forwards=list(_as_list(port_forwards)),
                resource_deps=_strs(resource_deps, "resource_deps"),
                objects=_strs(objects, "objects"),
                labels=_labels(labels),
                links=list(_as_list(links)),
                trigger_mode=trigger_mode,
                auto_init=bool(auto_init),
            )
        )

    def port_forward(
        self,
        local_port: int,
        container_port: int | None = None,
        name: str | None = None,
        link_path: str | None = None,
        host: str | None = None,
    ) -> sl.OpaquePythonObject:
        """``port_forward(local_port, container_port=None, name=None, link_path=None, host=None)``."""
        return sl.OpaquePythonObject(PortForward(local_port, container_port, name, link_path, host))

    def link(self, url: str, name: str | None = None) -> sl.OpaquePythonObject:
        """``link(url, name)``."""
        return sl.OpaquePythonObject(Link(str(url), name))

    def k8s_context(self) -> str:
        """``k8s_context()``."""
        return self._k8s_context

    def allow_k8s_contexts(self, contexts: str | Sequence[str]) -> None:
        """``allow_k8s_contexts(contexts)``."""
        self.run_record.allowed_contexts.extend(_strs(contexts, "allow_k8s_contexts"))

    # --- local resources ------------------------------------------------------------------

    def local_resource(
        self,
        name: str,
        cmd: str | Sequence[str] = "",
        deps: str | Sequence[str] | None = None,
        trigger_mode: TriggerMode = TRIGGER_MODE_AUTO,
        resource_deps: Sequence[str] = (),
        ignore: str | Sequence[str] = (),
        auto_init: bool = True,
        serve_cmd: str | Sequence[str] = "",
        cmd_bat: str | Sequence[str] = "",
        serve_cmd_bat: str | Sequence[str] = "",
        allow_parallel: bool = False,
        links: str | Link | Sequence[str | Link] = (),
        labels: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        serve_env: Mapping[str, str] | None = None,
        readiness_probe: object = None,
        dir: str = "",  # Tilt's parameter name (shadows the builtin)
        serve_dir: str = "",
    ) -> None:
        """Records a ``local_resource``; its deps, dirs and script paths must exist."""
        what = f"local_resource({name!r})"
        if not cmd and not serve_cmd:
            raise TiltfileError(f"{what}: needs cmd or serve_cmd")
        if not isinstance(trigger_mode, TriggerMode):
            raise TiltfileError(f"{what}: trigger_mode {trigger_mode!r}")
        for dep in _strs(deps, f"{what}: deps"):
            self._path(dep, f"{what}: deps")
        workdir = self._path(dir, f"{what}: dir", kind="dir") if dir else self._root
        if serve_dir:
            self._path(serve_dir, f"{what}: serve_dir", kind="dir")
        for command in (cmd, serve_cmd):
            words = shlex.split(command) if isinstance(command, str) else _strs(command, what)
            if words and ("/" in words[0]) and not words[0].startswith("/"):
                script = self._path(words[0], f"{what}: command", base=workdir, kind="file")
                if not os.access(script, os.X_OK):
                    raise TiltfileError(f"{what}: {words[0]} is not executable")
        self.run_record.local_resources.append(
            LocalResource(
                name=name,
                cmd=cmd if isinstance(cmd, str) else list(cmd),
                deps=_strs(deps, f"{what}: deps"),
                resource_deps=_strs(resource_deps, f"{what}: resource_deps"),
                labels=_labels(labels),
                trigger_mode=trigger_mode,
                auto_init=bool(auto_init),
                links=[x for x in _as_list(links) if isinstance(x, Link)],
            )
        )

    # --- settings -------------------------------------------------------------------------

    def update_settings(
        self,
        max_parallel_updates: int = 3,
        k8s_upsert_timeout_secs: int = 30,
        suppress_unused_image_warnings: str | Sequence[str] | None = None,
        k8s_server_side_apply: str = "auto",
    ) -> None:
        """``update_settings(...)``."""
        if max_parallel_updates < 1 or k8s_upsert_timeout_secs < 1:
            raise TiltfileError("update_settings: values must be positive")

    def version_settings(self, check_updates: bool = True, constraint: str = "") -> None:
        """``version_settings(check_updates=True, constraint='')``."""
        if constraint and not re.match(r"^[<>=!~^]*\s*v?\d+\.\d+(\.\d+)?", constraint):
            raise TiltfileError(f"version_settings: bad constraint {constraint!r}")

    def watch_settings(self, ignore: str | Sequence[str]) -> None:
        """``watch_settings(ignore)``."""
        _strs(ignore, "watch_settings")

    def watch_file(self, file_path: str) -> None:
        """``watch_file(file_path)``."""
        self._path(file_path, "watch_file")

    def warn(self, msg: str) -> None:
        """``warn(msg)``."""
        self.run_record.warnings.append(str(msg))

    def read_file(self, file_path: str, default: str | None = None) -> sl.OpaquePythonObject:
        """``read_file(file_path, default=None)``."""
        path = (self._root / file_path).resolve()
        if not path.is_file():
            if default is None:
                raise TiltfileError(f"read_file: {file_path} does not exist")
            return sl.OpaquePythonObject(Blob(default))
        return sl.OpaquePythonObject(Blob(path.read_text()))

    def blob(self, contents: str) -> sl.OpaquePythonObject:
        """``blob(contents)``."""
        return sl.OpaquePythonObject(Blob(str(contents)))

    # --- the config module ------------------------------------------------------------------

    def _define(self, kind: str, name: str, args: bool, usage: str) -> None:
        if name in self.run_record.defined_flags:
            raise TiltfileError(f"config: setting {name!r} defined twice")
        self.run_record.defined_flags[name] = kind

    def config_define_bool(self, name: str, args: bool = False, usage: str = "") -> None:
        """``config.define_bool(name, args=False, usage='')``."""
        self._define("bool", name, args, usage)

    def config_define_string(self, name: str, args: bool = False, usage: str = "") -> None:
        """``config.define_string(name, args=False, usage='')``."""
        self._define("string", name, args, usage)

    def config_define_string_list(self, name: str, args: bool = False, usage: str = "") -> None:
        """``config.define_string_list(name, args=False, usage='')``."""
        self._define("string_list", name, args, usage)

    def config_parse(self) -> dict[str, Any]:
        """``config.parse()``: the flags this run was given; each must have been defined."""
        for name, value in self.run_record.flags.items():
            kind = self.run_record.defined_flags.get(name)
            if kind is None:
                raise TiltfileError(f"config.parse: {name!r} is not a defined setting")
            expected = {"bool": bool, "string": str, "string_list": list}[kind]
            if not isinstance(value, expected):
                raise TiltfileError(f"config.parse: {name!r} must be a {kind}")
        return dict(self.run_record.flags)

    def config_set_enabled_resources(self, resources: Sequence[str]) -> None:
        """``config.set_enabled_resources(resources)``."""
        self.run_record.enabled_resources = _strs(resources, "set_enabled_resources")

    def config_clear_enabled_resources(self) -> None:
        """``config.clear_enabled_resources()``."""
        self.run_record.enabled_resources = []

    # --- the os module ----------------------------------------------------------------------

    def os_path_exists(self, path: str) -> bool:
        """``os.path.exists(path)``."""
        return (self._root / path).exists()

    def os_path_join(self, path: str, *paths: str) -> str:
        """``os.path.join(path, *paths)``."""
        return os.path.join(path, *paths)

    def os_path_basename(self, path: str) -> str:
        """``os.path.basename(path)``."""
        return os.path.basename(path)

    def os_path_dirname(self, path: str) -> str:
        """``os.path.dirname(path)``."""
        return os.path.dirname(path)

    def os_getenv(self, key: str, default: str | None = None) -> str | None:
        """``os.getenv(key, default=None)``: always the default here (no environment)."""
        return default

    # --- extensions -------------------------------------------------------------------------

    def ext_restart_process_docker_build_with_restart(
        self,
        ref: str,
        context: str,
        entrypoint: str | Sequence[str],
        live_update: Sequence[LiveUpdateStep],
        base_suffix: str = "-base",
        restart_file: str = "/.restart-proc",
        trigger: str | Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        """``docker_build_with_restart`` of ``ext://restart_process``, as the extension does it.

        It builds ``ref + base_suffix`` with the caller's arguments, then ``ref`` from an inline
        Dockerfile that adds the restart wrapper, with the entrypoint wrapped and a last
        live-update step that writes ``restart_file``.
        """
        steps = list(live_update)
        if not steps:
            raise TiltfileError("`docker_build_with_restart` requires at least one live_update step")
        if any(isinstance(s, RestartContainerStep) for s in steps):
            raise TiltfileError("`docker_build_with_restart` is not compatible with restart_container()")
        if not restart_file.startswith("/"):
            raise TiltfileError("docker_build_with_restart: restart_file must be absolute")
        base_ref = ref + base_suffix
        # The extension passes **kwargs to docker_build: unknown names fail there.
        self.docker_build(base_ref, context, **kwargs)
        self.run_record.images[-1].base_of = ref
        wrapped: list[str] = (
            ["/tilt-restart-wrapper", f"--watch_file={restart_file}", "sh", "-c", entrypoint]
            if isinstance(entrypoint, str)
            else ["/tilt-restart-wrapper", f"--watch_file={restart_file}", *_strs(entrypoint, "entrypoint")]
        )
        # Like the extension: these describe the base build and would conflict in the child.
        dropped = ("dockerfile", "dockerfile_contents", "target")
        child_kwargs = {k: v for k, v in kwargs.items() if k not in dropped}
        child_dockerfile = (
            "FROM tiltdev/restart-helper AS restart-helper\n"
            f"FROM {base_ref}\n"
            f'RUN ["touch", "{restart_file}"]\n'
            "COPY --from=restart-helper /tilt-restart-wrapper /\n"
            "COPY --from=restart-helper /entr /\n"
        )
        restart = RunStep(f"date > {restart_file}", tuple(_strs(trigger, "trigger")))
        self.docker_build(
            ref,
            context,
            entrypoint=wrapped,
            dockerfile_contents=child_dockerfile,
            live_update=[*steps, restart],
            **child_kwargs,
        )

    # --- assembling the Starlark environment ------------------------------------------------

    def extensions(self) -> dict[str, dict[str, Callable[..., Any]]]:
        """Stubbed extensions: ``ext://name`` → exported symbol → stub."""
        return {
            "ext://restart_process": {
                "docker_build_with_restart": self.ext_restart_process_docker_build_with_restart,
            },
        }

    def builtins(self) -> dict[str, Callable[..., Any]]:
        """Top-level builtins by their Tilt names."""
        names = [
            "docker_build",
            "sync",
            "run",
            "fall_back_on",
            "initial_sync",
            "restart_container",
            "k8s_yaml",
            "kustomize",
            "k8s_resource",
            "port_forward",
            "link",
            "k8s_context",
            "allow_k8s_contexts",
            "local_resource",
            "update_settings",
            "version_settings",
            "watch_settings",
            "watch_file",
            "warn",
            "read_file",
            "blob",
        ]
        return {name: getattr(self, name) for name in names}

    def namespaces(self) -> dict[str, dict[str, Callable[..., Any]]]:
        """Builtin modules (``config.*``, ``os.*``, ``os.path.*``) by attribute name."""
        return {
            "config": {
                "define_bool": self.config_define_bool,
                "define_string": self.config_define_string,
                "define_string_list": self.config_define_string_list,
                "parse": self.config_parse,
                "set_enabled_resources": self.config_set_enabled_resources,
                "clear_enabled_resources": self.config_clear_enabled_resources,
            },
            "os.path": {
                "exists": self.os_path_exists,
                "join": self.os_path_join,
                "basename": self.os_path_basename,
                "dirname": self.os_path_dirname,
            },
            "os": {"getenv": self.os_getenv},
        }


def _object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('namespace', '')}/{meta.get('name')}".lower()


def tilt_dialect() -> sl.Dialect:
    """The Starlark dialect Tilt accepts (starlark-go with Tilt's options).

    Top-level ``if``/``for``, ``def``, ``lambda`` and keyword-only arguments are allowed;
    f-strings and type annotations are not, so a Tiltfile that uses them fails here as in Tilt.
    """
    dialect = sl.Dialect.extended()
    dialect.enable_def = True
    dialect.enable_lambda = True
    dialect.enable_load = True
    dialect.enable_keyword_only_arguments = True
    dialect.enable_top_level_stmt = True
    dialect.enable_f_strings = False
    dialect.enable_types = sl.DialectTypes.DISABLE
    dialect.enable_load_reexport = False
    return dialect


def evaluate(tiltfile: Path, stubs: TiltStubs) -> TiltRun:
    """Evaluates ``tiltfile`` with ``stubs`` as Tilt's builtins.

    Raises:
        starlark.StarlarkError: the Tiltfile does not parse, calls a builtin wrongly (an
            unknown keyword, a missing argument), names a builtin with no stub, or a stub
            reported a :class:`TiltfileError` (shown in the message with the call site).
    """
    module = sl.Module()
    for name, func in stubs.builtins().items():
        module.add_callable(name, func)
    module["TRIGGER_MODE_AUTO"] = sl.OpaquePythonObject(TRIGGER_MODE_AUTO)
    module["TRIGGER_MODE_MANUAL"] = sl.OpaquePythonObject(TRIGGER_MODE_MANUAL)
    # The builtin modules are structs assembled in Starlark from hidden callables.
    prelude = []
    for namespace, funcs in stubs.namespaces().items():
        fields = []
        for attr, func in funcs.items():
            hidden = "__tilt_" + namespace.replace(".", "_") + "_" + attr
            module.add_callable(hidden, func)
            fields.append(f"{attr} = {hidden}")
        if namespace == "os.path":
            prelude.append(f"__tilt_os_path = struct({', '.join(fields)})")
        elif namespace == "os":
            prelude.append(f"os = struct(path = __tilt_os_path, {', '.join(fields)})")
        else:
            prelude.append(f"{namespace} = struct({', '.join(fields)})")
    extensions = [sl.LibraryExtension.StructType, sl.LibraryExtension.Print, sl.LibraryExtension.Json]
    globals_ = sl.Globals.extended_by(extensions)
    sl.eval(module, sl.parse("<tilt builtins>", "\n".join(prelude) + "\n"), globals_)

    exts = stubs.extensions()

    def load(name: str) -> sl.FrozenModule:
        stubs.run_record.loads.append(name)
        if name not in exts:
            raise TiltfileError(f"load({name!r}): no stub for this extension or file")
        ext_module = sl.Module()
        for symbol, func in exts[name].items():
            ext_module.add_callable(symbol, func)
        return ext_module.freeze()

    ast = sl.parse(str(tiltfile.name), tiltfile.read_text(), tilt_dialect())
    sl.eval(module, ast, globals_, sl.FileLoader(load))
    return stubs.run_record
