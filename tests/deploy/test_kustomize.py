"""Every kustomization builds, and every object it yields validates strictly.

The Kubernetes version is pinned in ``tools.deploy.k8s_check.KUBERNETES_VERSION``; strict means
an unknown or misspelled field is an error, not something the API server silently drops.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate.utils as kv  # type: ignore[import-untyped]
import pytest

from tools.deploy import k8s_check

K8S = k8s_check.K8S_DIR
FOLDERS = [str(f.relative_to(K8S)) for f in k8s_check.buildable_folders()]
COMPONENTS = [str(f.relative_to(K8S)) for f in k8s_check.kustomization_folders() if k8s_check.is_component(f)]


def test_the_overlays_and_components_the_design_names_exist() -> None:
    assert {"overlays/dev", "overlays/gpu"} <= set(FOLDERS)
    assert {
        "components/gpu",
        "components/network-policies",
        "components/otel-collector",
        "components/live-update",
    } <= set(COMPONENTS)
    for service in ("proxy", "orchestrator", "trajectory-store", "inference", "trainer"):
        assert f"base/{service}" in FOLDERS, f"no kustomize base for {service}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_kustomization_builds(built: dict[str, list[dict[str, Any]]], folder: str) -> None:
    assert built[folder], f"{folder} yields no objects"


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f.startswith("overlays/") or f == "base"])
def test_every_object_validates_strictly(built: dict[str, list[dict[str, Any]]], folder: str) -> None:
    problems = k8s_check.validate_objects(built[folder], k8s_check.KUBERNETES_VERSION)
    assert problems == []


def test_the_hardened_composition_validates_strictly(hardened: list[dict[str, Any]]) -> None:
    assert k8s_check.validate_objects(hardened, k8s_check.KUBERNETES_VERSION) == []


def test_the_pinned_kubernetes_version_has_schemas() -> None:
    minor = k8s_check.KUBERNETES_VERSION.rsplit(".", 1)[0]
    assert any(v.startswith(minor + ".") for v in kv.all_versions())


def test_every_referenced_path_exists_and_every_file_is_used() -> None:
    assert k8s_check.check_paths() == []


def test_every_component_is_used_by_an_overlay() -> None:
    used: set[Path] = set()
    for folder in k8s_check.overlay_folders():
        for ref in k8s_check.load_kustomization(folder).get("components") or []:
            used.add((folder / ref).resolve())
    unused = [c for c in COMPONENTS if (K8S / c).resolve() not in used]
    assert unused == []


def test_objects_have_unique_identities(built: dict[str, list[dict[str, Any]]]) -> None:
    for folder in ("overlays/dev", "overlays/gpu"):
        ids = [k8s_check.object_id(o) for o in built[folder]]
        assert len(ids) == len(set(ids)), folder


# --- the checks fail when a kustomization breaks --------------------------------------------------


@pytest.fixture()
def k8s_copy(tmp_path: Path) -> Path:
    """A scratch copy of deploy/k8s to break."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    return copy


def test_a_missing_resource_file_is_reported(k8s_copy: Path) -> None:
    (k8s_copy / "base/proxy/service.yaml").unlink()
    with pytest.raises(k8s_check.KustomizeError, match=r"service\.yaml"):
        k8s_check.kustomize_build(k8s_copy / "overlays/dev")
    assert any("service.yaml does not exist" in p for p in k8s_check.check_paths(k8s_copy))


def test_a_misspelled_field_is_reported(k8s_copy: Path) -> None:
    deployment = k8s_copy / "base/trainer/deployment.yaml"
    deployment.write_text(deployment.read_text().replace("enableServiceLinks:", "enableServiceLink:"))
    objects = k8s_check.kustomize_build(k8s_copy / "overlays/gpu")
    problems = k8s_check.validate_objects(objects, k8s_check.KUBERNETES_VERSION)
    assert any("Deployment/openforge/trainer" in p and "enableServiceLink" in p for p in problems)


def test_a_patch_on_a_missing_object_is_reported(k8s_copy: Path) -> None:
    patch = k8s_copy / "components/gpu/inference.yaml"
    patch.write_text(patch.read_text().replace("name: inference\n", "name: inferense\n", 1))
    with pytest.raises(k8s_check.KustomizeError):
        k8s_check.kustomize_build(k8s_copy / "overlays/gpu")


def test_an_unused_file_is_reported(k8s_copy: Path) -> None:
    (k8s_copy / "base/proxy/forgotten.yaml").write_text("kind: ConfigMap\n")
    assert any("forgotten.yaml: used by no kustomization" in p for p in k8s_check.check_paths(k8s_copy))


def test_the_whole_check_reports_a_broken_overlay(k8s_copy: Path) -> None:
    kustomization = k8s_copy / "overlays/dev/kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("network-policies", "network-policy"))
    report = k8s_check.check_k8s(k8s_copy)
    assert any(p.startswith("kustomize build") and "overlays/dev" in p for p in report.problems)
    assert "overlays/dev" not in report.built


def test_the_helper_manifests_validate_strictly() -> None:
    helpers = sorted((K8S.parent / "tools").glob("*.yaml"))
    assert helpers
    for path in helpers:
        objects = k8s_check.parse_stream(path.read_text())
        assert objects, path
        assert k8s_check.validate_objects(objects, k8s_check.KUBERNETES_VERSION) == [], path
