"""Fixtures for the deployment checks (deploy/, the Tiltfile and the Dockerfiles).

Nothing here needs Docker, a cluster or Tilt: kustomize is the pinned kubectl's, objects are
validated with kubernetes-validate, the Tiltfile runs under starlark-pyo3 with stubs of the Tilt
builtins, and Dockerfiles are read with Docker's own parser (tools/deploy).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The checks live in tools/deploy (imported as tools.deploy.*, like `python -m` from the root).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.deploy import k8s_check  # noqa: E402

K8sObject = dict[str, Any]

#: What a production-like deployment combines (see deploy/README.md): hardened, no live update.
HARDENED_COMPONENTS = ("gpu", "network-policies", "otel-collector")


@pytest.fixture(scope="session")
def built() -> dict[str, list[K8sObject]]:
    """Every base and overlay under deploy/k8s, built once: folder (``overlays/dev``) → objects."""
    return {
        str(folder.relative_to(k8s_check.K8S_DIR)): k8s_check.kustomize_build(folder)
        for folder in k8s_check.buildable_folders()
    }


@pytest.fixture(scope="session")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> list[K8sObject]:
    """base + gpu + network-policies + otel-collector, without the live-update component."""
    folder = tmp_path_factory.mktemp("hardened")
    rel = os.path.relpath(k8s_check.K8S_DIR, folder)  # kustomize refuses absolute paths
    components = "".join(f"  - {rel}/components/{c}\n" for c in HARDENED_COMPONENTS)
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {rel}/base\n"
        f"components:\n{components}"
    )
    return k8s_check.kustomize_build(folder)
