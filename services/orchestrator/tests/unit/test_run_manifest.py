"""What the first launch adds to a run's manifest: the harness config hash (the same for every
rollout of a run, another for another settings file), the harness version on Kubernetes (the
image's tag), the sandbox image's digest, and the verifiers' version (every task's ``tests/``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from openforge_orchestrator.domain.manifest import config_hash, image_digest, image_tag, run_config_hash
from openforge_orchestrator.domain.rollouts import HARNESSES, Rollout, RolloutStatus
from openforge_orchestrator.domain.tasks import TaskCatalog
from openforge_orchestrator.harnesses.launches import LaunchFactory

ROOT = Path(__file__).resolve().parents[4]
TASKS = ROOT / "examples" / "tasks"


def _rollout(rollout_id: str, task_id: str, harness: str, timeout_s: float = 0.0) -> Rollout:
    return Rollout(
        rollout_id=rollout_id, run_id="run", task_id=task_id, task_set="train", group_id="g", group_index=0,
        harness=harness, model_name="policy", status=RolloutStatus.PENDING, min_policy_version=0,
        timeout_s=timeout_s, create_time=0.0, command=("sh", "-c", "run {instruction} in {workdir} at {base_url}"),
    )  # fmt: skip


def _installs(root: Path, at: str = "/x") -> Path:
    for name in HARNESSES - {"command"}:
        folder = root / name
        folder.mkdir(parents=True)
        manifest = {"name": name, "version": "1.2.3", "executable": f"{at}/bin/{name}", "path": [f"{at}/bin"]}
        (folder / "manifest.json").write_text(json.dumps({**manifest, "roots": [at]}))
    return root


def test_every_rollout_of_a_run_has_the_same_config_hash_and_another_settings_file_another(tmp_path: Path) -> None:
    installs = _installs(tmp_path / "installs")
    catalog = TaskCatalog(TASKS)
    a, b = catalog.get("train", "count-lines"), catalog.get("train", "hello-world")
    assert a.instruction != b.instruction
    factory = LaunchFactory(installs)
    hashes = {}
    for harness in sorted(HARNESSES):
        one, two = _rollout("r1", a.task_id, harness), _rollout("r2", b.task_id, harness, timeout_s=30.0)
        # the real launches differ (key, instruction, time limit)...
        assert factory(one, a, "http://127.0.0.1:1", "ofk-1", 60.0) != factory(
            two, b, "http://10.0.0.1:2", "ofk-2", 30.0
        )
        # ...the run's config does not
        hashes[harness] = run_config_hash(factory, one, a)
        assert hashes[harness] == run_config_hash(factory, two, b), harness
        assert hashes[harness].startswith("sha256:") and len(hashes[harness]) == 71
    assert len(set(hashes.values())) == len(HARNESSES)  # each harness its own config
    # where a machine installed the harnesses is no part of the config
    elsewhere = LaunchFactory(_installs(tmp_path / "other-installs", at="/opt/elsewhere"))
    for harness in sorted(HARNESSES):
        assert run_config_hash(elsewhere, _rollout("r3", a.task_id, harness), a) == hashes[harness], harness

    settings = tmp_path / "mini.yaml"
    settings.write_text("agent: {step_limit: 3}\n")
    rollout = _rollout("r1", a.task_id, "mini-swe-agent")
    layered = run_config_hash(LaunchFactory(installs, config_files={"mini-swe-agent": str(settings)}), rollout, a)
    assert layered != hashes["mini-swe-agent"]
    settings.write_text("agent: {step_limit: 4}\n")
    changed = run_config_hash(LaunchFactory(installs, config_files={"mini-swe-agent": str(settings)}), rollout, a)
    assert changed not in (layered, hashes["mini-swe-agent"])


def test_config_hash_covers_argv_env_and_files_not_host_paths() -> None:
    from openforge_orchestrator.domain.sandbox import HarnessLaunch

    base = HarnessLaunch(name="x", argv=("x", "-p"), env={"A": "1"}, files={"/run/openforge/c": "k=v"})
    assert config_hash(base) == config_hash(HarnessLaunch(**{**base.__dict__, "install_dirs": ("/elsewhere",)}))
    assert config_hash(base) == config_hash(HarnessLaunch(**{**base.__dict__, "argv": ("/opt/bin/x", "-p")}))
    for change in ({"argv": ("x", "-q")}, {"env": {"A": "2"}}, {"files": {"/run/openforge/c": "k=w"}}):
        assert config_hash(HarnessLaunch(**{**base.__dict__, **change})) != config_hash(base), change


def test_kubernetes_launches_take_their_version_from_the_harness_image_tag(tmp_path: Path) -> None:
    task = TaskCatalog(TASKS).get("train", "count-lines")
    images = {"codex": "registry.local:5000/openforge/harness-codex:0.171.0"}
    launch = LaunchFactory(None, images=images)(_rollout("r", task.task_id, "codex"), task, "http://p", "k", 60.0)
    assert (launch.image, launch.version) == (images["codex"], "0.171.0")


@pytest.mark.parametrize(
    ("reference", "tag", "digest"),
    [
        ("openforge/task-train-a:latest", "latest", "openforge/task-train-a:latest"),
        ("registry.local:5000/task@sha256:" + "ab" * 32, "", "sha256:" + "ab" * 32),
        ("registry.local:5000/task:v1@sha256:" + "cd" * 32, "v1", "sha256:" + "cd" * 32),
        ("registry.local:5000/task", "", "registry.local:5000/task"),
        ("", "", ""),
    ],
)
def test_image_tag_and_digest(reference: str, tag: str, digest: str) -> None:
    assert (image_tag(reference), image_digest(reference)) == (tag, digest)


def test_verifier_version_follows_every_tests_file_of_every_set(tmp_path: Path) -> None:
    root = tmp_path / "tasks"
    shutil.copytree(TASKS / "train" / "count-lines", root / "train" / "count-lines")
    shutil.copytree(TASKS / "train" / "hello-world", root / "eval" / "hello-world")
    catalog = TaskCatalog(root)
    first = catalog.verifier_version()
    assert first.startswith("sha256:") and first == TaskCatalog(root).verifier_version()
    (root / "train" / "count-lines" / "instruction.md").write_text("Something else.\n")
    assert catalog.verifier_version() == first  # only the verifiers count
    test_sh = root / "eval" / "hello-world" / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text() + "\n# changed\n")
    changed = catalog.verifier_version()
    assert changed != first  # a task of another set than the one launched first
    (root / "train" / "count-lines" / "tests" / "data").mkdir()
    (root / "train" / "count-lines" / "tests" / "data" / "expected.txt").write_text("3\n")
    added = catalog.verifier_version()
    assert added != changed
    (root / "train" / "count-lines" / "tests" / "data" / "expected.txt").rename(
        root / "train" / "count-lines" / "tests" / "data" / "wanted.txt"
    )
    assert catalog.verifier_version() not in (first, changed, added)  # a renamed file too
