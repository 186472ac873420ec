"""Every place that pins a harness agrees with the harness catalog
(:mod:`openforge_core.harness_catalog`): the packages the host install and the rollout images
take, the orchestrator's adapters and default images, the CLI's installer."""

from __future__ import annotations

import json
import re
from pathlib import Path

from openforge_cli.harness import PINS
from openforge_core.harness_catalog import HARNESSES
from openforge_orchestrator.harnesses import adapter
from openforge_orchestrator.settings import KubernetesSandboxSettings

ROOT = Path(__file__).resolve().parents[2]
NPM = {name: h for name, h in HARNESSES.items() if h.kind == "npm"}


def test_the_real_clients_install_pins_the_catalogs_npm_harnesses() -> None:
    folder = ROOT / "tools" / "harness-clis"
    assert json.loads((folder / "package.json").read_text())["dependencies"] == {
        h.package: h.version for h in NPM.values()
    }
    lock = json.loads((folder / "package-lock.json").read_text())["packages"]
    for h in NPM.values():
        assert lock[f"node_modules/{h.package}"]["version"] == h.version


def test_the_python_harness_requirements_pin_the_catalogs_version() -> None:
    h = HARNESSES["mini-swe-agent"]
    text = (ROOT / "deploy" / "harness" / h.name / "requirements.in").read_text()
    assert re.findall(rf"^{re.escape(h.package)}==(\S+)$", text, flags=re.MULTILINE) == [h.version]


def test_the_node_a_harness_needs_is_the_node_of_its_image() -> None:
    for h in HARNESSES.values():
        if h.node:
            dockerfile = (ROOT / "deploy" / "harness" / h.name / "Dockerfile").read_text()
            assert f"ARG NODE_IMAGE=node:{h.node.split('@')[1]}-" in dockerfile, h.name


def test_the_orchestrator_and_the_cli_read_the_catalog() -> None:
    assert KubernetesSandboxSettings().harness_images == {name: h.image for name, h in HARNESSES.items()}
    assert PINS is HARNESSES
    for name in HARNESSES:
        assert adapter(name).name == name  # an adapter for every harness the catalog installs
