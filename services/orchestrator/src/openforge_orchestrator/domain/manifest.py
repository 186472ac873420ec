"""A run's manifest as its first launched rollout completes it (``openforge.common.v1.RunManifest``).

At submission the orchestrator knows the run's harness, model and sampling; at the first launch it
also knows what produced the data, each fact from its source:

* the harness's installed version (:attr:`HarnessLaunch.version`: the install manifest, or the
  harness image's tag on Kubernetes);
* the hash of the harness config it generated (:func:`run_config_hash`), the launch built with
  :data:`PLACEHOLDERS` for what differs per rollout, so every rollout of a run hashes alike;
* what the proxy serves with (:class:`~openforge_core.manifest.ServedModel`, from ``CreateSession``);
* the sandbox image (:func:`image_digest` of the backend's image for the task);
* the verifiers' version (:meth:`~.tasks.TaskCatalog.verifier_version`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Protocol

from openforge_core.manifest import ServedModel, sha256_digest
from openforge_orchestrator.domain.rollouts import Rollout
from openforge_orchestrator.domain.sandbox import HarnessLaunch
from openforge_orchestrator.domain.tasks import Task

#: Stand-ins for what differs per rollout of a run, put in the launch whose config is hashed.
PLACEHOLDERS = {
    "instruction": "{instruction}",
    "workdir": "{workdir}",
    "base_url": "{base_url}",
    "api_key": "{api_key}",
}
#: The time limit in the hashed launch: tasks differ in theirs (the adapters write at least 1 s).
PLACEHOLDER_TIMEOUT_S = 0.0


@dataclass(frozen=True)
class LaunchManifest:
    """What a run's first launch adds to its manifest (the ``RunManifest`` fields of that name).

    Attributes:
        harness_version: The harness's installed version ("" for ``command``).
        harness_config_hash: :func:`run_config_hash`.
        served: What the proxy serves with.
        sandbox_image_digest: :func:`image_digest` of the sandbox image (for local sandboxes,
            which run none, the sandbox program's version and what it isolates).
        verifier_version: The task catalog's verifier digest.
    """

    harness_version: str
    harness_config_hash: str
    served: ServedModel
    sandbox_image_digest: str
    verifier_version: str


class RunManifests(Protocol):
    """Where a run's complete manifest goes (a NATS publisher)."""

    async def launched(self, rollout: Rollout, manifest: LaunchManifest) -> None:
        """Publishes the manifest of ``rollout``'s run, completed with ``manifest``."""
        ...


def run_config_hash(
    build: Callable[[Rollout, Task, str, str, float], HarnessLaunch], rollout: Rollout, task: Task
) -> str:
    """:func:`config_hash` of the launch ``build`` (a ``LaunchBuilder``) makes for ``rollout`` with
    :data:`PLACEHOLDERS` for the task's instruction and working folder, the proxy URL and key, and
    :data:`PLACEHOLDER_TIMEOUT_S`: the same for every rollout of a run.

    Raises:
        What ``build`` raises.
    """
    environment = replace(task.environment, workdir=PLACEHOLDERS["workdir"])
    template = replace(task, instruction=PLACEHOLDERS["instruction"], environment=environment)
    launch = build(rollout, template, PLACEHOLDERS["base_url"], PLACEHOLDERS["api_key"], PLACEHOLDER_TIMEOUT_S)
    return config_hash(launch)


def config_hash(launch: HarnessLaunch) -> str:
    """``sha256:<hex>`` of the harness config a launch carries: its name, argv (the command by its
    name, not where it is installed), environment and files as canonical JSON (sorted keys, no
    spaces). Host paths (the install, PATH folders) and the image are left out: the version
    stands for the install."""
    argv = [PurePosixPath(launch.argv[0]).name, *launch.argv[1:]] if launch.argv else []
    doc = {"name": launch.name, "argv": argv, "env": dict(launch.env), "files": dict(launch.files)}
    return sha256_digest(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def _split_digest(reference: str) -> tuple[str, str]:
    name, _, digest = reference.partition("@")
    return name, digest


def image_digest(reference: str) -> str:
    """The manifest's sandbox image: the digest an image reference names (``name@sha256:<hex>`` →
    ``sha256:<hex>``), else the reference as given ("" stays "")."""
    _, digest = _split_digest(reference)
    return digest or reference


def image_tag(reference: str) -> str:
    """The tag of an image reference (``registry:5000/harness-codex:0.171.0@sha256:..`` →
    ``0.171.0``); "" when it has none."""
    name, _ = _split_digest(reference)
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2]
