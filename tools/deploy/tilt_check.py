"""Evaluates the Tiltfile without Tilt and checks what it would do.

The Tiltfile runs under ``starlark-pyo3`` with the stubs of ``tilt_stubs`` as Tilt's builtins,
once per flag set in :data:`FLAG_SETS` (``tilt up``, ``tilt up -- --gpu``, ...); ``kustomize()``
really builds the overlay. Evaluation alone catches a misspelled keyword, a missing argument, a
missing file or folder, an unknown Dockerfile stage or build arg, and misordered live-update
steps. :func:`analyze` then checks the whole result the way Tilt would on ``up``: every built
image is deployed and every project image deployed is built, each ``k8s_resource`` names a
workload or objects that exist, resource dependencies exist and have no cycle, port forwards
reach a declared container port and do not collide; and what ``docker build`` would find
missing: each image's Dockerfile target, read with its build args, gets every ARG it needs and
every ``COPY``/bind-mount source from the context Tilt sends (``only``, ``.dockerignore``).

Usage, from the repository root: ``python -m tools.deploy.tilt_check``; exits 1 and lists the problems if any.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import starlark as sl

from tools.deploy.dockerfiles import (
    TASKS_CUSTOM_TARGET,
    TASKS_DOCKERFILE,
    context_problems,
    parse_dockerfile,
    task_set_problems,
    tasks_image_problems,
)
from tools.deploy.k8s_check import ROOT, kustomize_build_text
from tools.deploy.tilt_stubs import DockerBuild, K8sResource, Link, PortForward, TiltRun, TiltStubs, evaluate

TILTFILE = ROOT / "Tiltfile"

#: The configurations CI evaluates: plain ``tilt up``, ``tilt up -- --gpu``, and the task catalog
#: built from a folder of task sets (``tilt up -- --tasks examples/tasks``) instead of the bundled one.
FLAG_SETS: tuple[dict[str, Any], ...] = ({}, {"gpu": True}, {"tasks": "examples/tasks"})

#: Images of this project: each one that a workload uses must be built by the Tiltfile.
OWN_IMAGE_PREFIX = "openforge/"

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}


def run_tiltfile(tiltfile: Path = TILTFILE, flags: Mapping[str, Any] | None = None) -> TiltRun:
    """Evaluates ``tiltfile`` with the stubs and the given ``config.parse()`` values.

    Raises:
        starlark.StarlarkError: evaluation failed (see :func:`tilt_stubs.evaluate`).
    """
    stubs = TiltStubs(tiltfile.parent, flags or {}, kustomize_build_text)
    return evaluate(tiltfile, stubs)


def _image_name(image: str) -> str:
    """``repo/name:tag`` or ``repo/name@sha256:...`` → ``repo/name``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        return ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
    return (spec.get("template") or {}).get("spec") or {}


def _containers(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = _pod_spec(obj)
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _selector_matches(selector: str, obj: Mapping[str, Any]) -> bool:
    """Tilt's object selector ``name[:kind[:namespace]]`` (case-insensitive, regex-escaped)."""
    parts = selector.split(":")
    meta = obj.get("metadata") or {}
    fields = [str(meta.get("name", "")), str(obj.get("kind", "")), str(meta.get("namespace", ""))]
    return all(
        re.fullmatch(re.escape(part), value, flags=re.IGNORECASE) is not None
        for part, value in zip(parts, fields, strict=False)
    )


def _parse_port_forward(pf: str | int | PortForward) -> tuple[int, int | None]:
    if isinstance(pf, PortForward):
        return pf.local_port, pf.container_port
    if isinstance(pf, int):
        return pf, None
    parts = str(pf).split(":")
    if len(parts) == 1:
        return int(parts[0]), None
    return int(parts[-2]), int(parts[-1])


def _cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in graph.get(node, ()):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if state.get(dep) is None and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in graph:
        if state.get(node) is None and (found := visit(node)):
            return found
    return None


def analyze(run: TiltRun, own_image_prefix: str = OWN_IMAGE_PREFIX) -> list[str]:
    """Checks a finished evaluation as a whole.

    Returns:
        Problems, one line each; empty when Tilt would deploy everything it builds, and build
        everything of this project that it deploys.
    """
    problems: list[str] = []
    objects = run.yaml_objects
    workloads = [o for o in objects if o.get("kind") in WORKLOAD_KINDS]
    workload_names = [str((o.get("metadata") or {}).get("name")) for o in workloads]

    # Images.
    built = {img.ref: img for img in run.images}
    deployed: dict[str, list[str]] = {}
    for obj in workloads:
        for container in _containers(obj):
            deployed.setdefault(_image_name(str(container.get("image", ""))), []).append(
                str((obj.get("metadata") or {}).get("name"))
            )
    for ref, img in built.items():
        if img.base_of is not None:
            if img.base_of not in built:
                problems.append(f"image {ref}: base of {img.base_of}, which is not built")
            continue
        if ref not in deployed:
            problems.append(f"image {ref} is built but no workload uses it")
    for name, users in sorted(deployed.items()):
        if name.startswith(own_image_prefix) and name not in built:
            problems.append(f"image {name} (used by {', '.join(users)}) is deployed but never built")
    if len(built) != len(run.images):
        problems.append("an image ref is built twice")
    for img in run.images:
        if img.dockerfile:
            df = parse_dockerfile(run.root / img.dockerfile)
            target = img.target or df.stages[-1].name
            found = context_problems(df, target, img.build_args, run.root / img.context, img.only or None)
            problems.extend(f"image {img.ref}: {p}" for p in found)
            if (run.root / img.dockerfile).resolve() == TASKS_DOCKERFILE:
                problems.extend(f"image {img.ref}: {p}" for p in _task_catalog_problems(run.root, img, target))

    # Resources.
    resources: dict[str, K8sResource] = {}
    graph: dict[str, list[str]] = {}
    for local in run.local_resources:
        if local.name in resources or local.name in graph:
            problems.append(f"resource {local.name!r} defined twice")
        graph[local.name] = list(local.resource_deps)
    for wl in workload_names:
        if workload_names.count(wl) > 1:
            problems.append(f"workload name {wl!r} is ambiguous; Tilt would name resources by kind")
    names_of_workloads = dict(zip(workload_names, workloads, strict=True))
    claimed: set[int] = set()
    for res in run.k8s_resources:
        if res.workload:
            if res.workload not in names_of_workloads:
                problems.append(f"k8s_resource({res.workload!r}): no such workload in the YAML")
                continue
            name = res.new_name or res.workload
            targets = [names_of_workloads[res.workload]]
        else:
            name = res.new_name
            targets = []
        for selector in res.objects:
            matches = [o for o in objects if _selector_matches(selector, o)]
            if len(matches) != 1:
                problems.append(f"k8s_resource({name!r}): object selector {selector!r} matches {len(matches)} objects")
                continue
            if id(matches[0]) in claimed:
                problems.append(f"k8s_resource({name!r}): {selector!r} already belongs to a resource")
            claimed.add(id(matches[0]))
        if name in graph:
            problems.append(f"resource {name!r} defined twice")
        graph[name] = list(res.resource_deps)
        resources[name] = res
        problems.extend(_check_port_forwards(name, res, targets))
    for wl in workload_names:
        graph.setdefault(wl, [])
    all_local_ports: dict[int, str] = {}
    for name, res in resources.items():
        for pf in res.port_forwards:
            try:
                port, _ = _parse_port_forward(pf)
            except ValueError:
                continue  # reported by _check_port_forwards
            if port in all_local_ports:
                problems.append(f"local port {port} forwarded by {all_local_ports[port]!r} and {name!r}")
            all_local_ports[port] = name
    for name, deps in graph.items():
        for dep in deps:
            if dep not in graph:
                problems.append(f"resource {name!r} depends on unknown resource {dep!r}")
            if dep == name:
                problems.append(f"resource {name!r} depends on itself")
    cycle = _cycle(graph)
    if cycle:
        problems.append("resource dependency cycle: " + " -> ".join(cycle))
    for enabled in run.enabled_resources or []:
        if enabled not in graph:
            problems.append(f"set_enabled_resources: unknown resource {enabled!r}")
    for res in run.k8s_resources:
        for link in res.links:
            url = link.url if isinstance(link, Link) else str(link)
            if not re.match(r"^https?://", url):
                problems.append(f"k8s_resource link {url!r} is not an http(s) URL")
    return problems


def _task_catalog_problems(root: Path, img: DockerBuild, target: str) -> list[str]:
    """The task-set image's checks for what Tilt sends: the bundled sets, or each task set of
    the folder that a ``custom`` build has as its context."""
    context = root / img.context
    if target != TASKS_CUSTOM_TARGET:
        return tasks_image_problems(context=context, only=img.only or None)
    sets = sorted(p.name for p in context.iterdir() if p.is_dir())
    if not sets:
        return [f"{img.context}: holds no task set"]
    return [p for name in sets for p in task_set_problems(name, context, img.only or None)]


def _check_port_forwards(name: str, res: K8sResource, targets: Iterable[Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    declared: set[int] = set()
    for obj in targets:
        for container in _containers(obj):
            declared.update(int(p["containerPort"]) for p in container.get("ports") or [])
    for pf in res.port_forwards:
        try:
            local, container_port = _parse_port_forward(pf)
        except ValueError:
            problems.append(f"k8s_resource({name!r}): bad port forward {pf!r}")
            continue
        if not 0 < local < 65536:
            problems.append(f"k8s_resource({name!r}): bad local port {local}")
        wanted = container_port if container_port is not None else local
        if targets and wanted not in declared:
            problems.append(
                f"k8s_resource({name!r}): port forward {pf!r} reaches port {wanted}, "
                f"which no container declares ({sorted(declared)})"
            )
    return problems


def check_tiltfile(tiltfile: Path = TILTFILE, flag_sets: Sequence[Mapping[str, Any]] = FLAG_SETS) -> list[str]:
    """Evaluates and analyzes ``tiltfile`` under each flag set.

    Returns:
        Problems, each prefixed with the flags it was found under.
    """
    problems: list[str] = []
    for flags in flag_sets:
        words = [f"--{k}" if v is True else f"--{k} {v}" for k, v in flags.items()]
        label = "tilt up" + (" -- " + " ".join(words) if words else "")
        try:
            run = run_tiltfile(tiltfile, flags)
        except sl.StarlarkError as err:
            problems.append(f"{label}: {err}")
            continue
        problems.extend(f"{label}: {p}" for p in analyze(run))
    return problems


def main() -> int:
    """Command-line entry point; returns the exit status."""
    problems = check_tiltfile()
    for problem in problems:
        print(f"ERROR {problem}", file=sys.stderr)
    if not problems:
        print(f"Tiltfile OK under {len(FLAG_SETS)} flag sets")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
