"""The orchestrator's task catalog in a cluster: the task-set image and how its pod gets it.

``deploy/tasks/Dockerfile`` puts task sets under ``/openforge/tasks``; the orchestrator's
Deployment runs that image (``openforge/tasks``) as an init container which copies them into an
emptyDir, and the orchestrator mounts that volume read-only at its ``OPENFORGE_TASKS__ROOT``.
No image is built here: the Dockerfile is read with Docker's parser, and what its ``COPY``
lines would put into the image is assembled from the repository and loaded with the
orchestrator's own task catalog.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from openforge_orchestrator.domain.tasks import TaskCatalog
from tools.deploy import dockerfiles, tilt_check
from tools.deploy.dockerfiles import TASKS_DOCKERFILE, TASKS_IMAGE_DIR, parse_dockerfile
from tools.deploy.tilt_stubs import TiltRun

K8sObject = dict[str, Any]

ROOT = dockerfiles.ROOT
NAMESPACE = "openforge"
TASKS_IMAGE = "openforge/tasks"
#: The bundled task sets: the name each gets in the image → the repository folder it comes from.
BUNDLED = {
    "train": "examples/tasks/train",
    "test": "examples/tasks/test",
    "demo-train": "examples/demo/tasks/train",
    "demo-test": "examples/demo/tasks/test",
}


def find(objects: list[K8sObject], kind: str, name: str) -> K8sObject:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name and obj["metadata"].get("namespace") == NAMESPACE:
            return obj
    raise AssertionError(f"no {kind} {NAMESPACE}/{name}")


@pytest.fixture(params=["overlays/dev", "overlays/gpu", "hardened"])
def objects(request: pytest.FixtureRequest, built: dict[str, list[K8sObject]]) -> list[K8sObject]:
    if request.param == "hardened":
        result: list[K8sObject] = request.getfixturevalue("hardened")
        return result
    return built[request.param]


def tasks_root(objects: list[K8sObject]) -> str:
    """``OPENFORGE_TASKS__ROOT`` as the orchestrator's ConfigMap sets it."""
    container = find(objects, "Deployment", "orchestrator")["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    assert "OPENFORGE_TASKS__ROOT" not in {e["name"] for e in container.get("env", [])}
    return env["OPENFORGE_TASKS__ROOT"]


# --- the orchestrator's pod ---------------------------------------------------------------------


def test_the_orchestrator_mounts_the_tasks_images_catalog_read_only_at_its_tasks_root(
    objects: list[K8sObject],
) -> None:
    spec = find(objects, "Deployment", "orchestrator")["spec"]["template"]["spec"]
    root = tasks_root(objects)
    assert PurePosixPath(root).is_absolute(), "a relative root would depend on the image's working folder"

    (init,) = spec["initContainers"]
    image = init["image"]
    assert image.split(":")[0] == TASKS_IMAGE, image
    assert re.fullmatch(r"[^:]+:[\w][\w.-]*", image) and not image.endswith(":latest"), image

    volumes = {v["name"]: v for v in spec["volumes"]}
    (init_mount,) = init["volumeMounts"]
    volume = volumes[init_mount["name"]]
    assert volume == {"name": init_mount["name"], "emptyDir": {}}
    assert not init_mount.get("readOnly", False), "the init container fills the volume"
    # The image's entrypoint copies its task sets into the folder given as its argument.
    assert "command" not in init, "the image's entrypoint does the copy"
    assert [PurePosixPath(a) for a in init["args"]] == [PurePosixPath(init_mount["mountPath"])]

    (orchestrator,) = spec["containers"]
    mounts = [m for m in orchestrator["volumeMounts"] if m["name"] == init_mount["name"]]
    assert mounts == [{"name": init_mount["name"], "mountPath": root, "readOnly": True}]


def test_the_tasks_init_container_is_hardened(objects: list[K8sObject]) -> None:
    spec = find(objects, "Deployment", "orchestrator")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    (init,) = spec["initContainers"]
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(init["resources"][kind]), kind


def test_only_the_orchestrator_gets_a_task_catalog(objects: list[K8sObject]) -> None:
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet") or obj["metadata"]["name"] == "orchestrator":
            continue
        assert "initContainers" not in obj["spec"]["template"]["spec"], obj["metadata"]["name"]


# --- the task-set image -------------------------------------------------------------------------


def bundled_copies() -> list[tuple[str, str]]:
    """``(source, destination)`` of each COPY of the default (last) stage, read with Docker's parser."""
    df = parse_dockerfile(TASKS_DOCKERFILE)
    stage = df.stages[-1]
    assert stage.name == dockerfiles.TASKS_BUNDLED_TARGET, "the bundled sets are the default target"
    copies = []
    for instr in stage.commands("COPY"):
        assert not any(f.startswith("--from=") for f in instr.flags)
        assert "--chown=10001:10001" in instr.flags, instr.original
        (source, dest) = instr.value
        copies.append((source, dest))
    return copies


def test_the_tasks_dockerfile_passes_every_static_check() -> None:
    assert TASKS_DOCKERFILE in dockerfiles.all_dockerfiles()
    assert dockerfiles.tasks_image_problems() == []
    status, report = dockerfiles.hadolint([TASKS_DOCKERFILE])
    assert status == 0, report


def test_the_image_copies_each_bundled_folder_of_tasks_to_a_set_of_its_own() -> None:
    copies = bundled_copies()
    assert {PurePosixPath(dest).name: source.rstrip("/") for source, dest in copies} == BUNDLED
    for source, dest in copies:
        assert PurePosixPath(dest).parent == PurePosixPath(TASKS_IMAGE_DIR), dest
        folder = ROOT / source
        assert folder.is_dir(), source
        tasks = [p for p in folder.iterdir() if p.is_dir()]
        assert tasks, f"{source} holds no task"
        for task in tasks:
            # <root>/<set>/<id>/task.toml once copied.
            assert (task / "task.toml").is_file(), task
            assert (task / "tests" / "test.sh").is_file(), task
            # Every file reaches the builder: .dockerignore keeps other tests/ out, not these.
            for file in task.rglob("*"):
                if file.is_file() and "__pycache__" not in file.parts:
                    assert dockerfiles.in_context(str(file.relative_to(ROOT)), ROOT), file


def test_the_image_entrypoint_copies_its_sets_into_the_folder_it_is_given() -> None:
    df = parse_dockerfile(TASKS_DOCKERFILE)
    for target in (dockerfiles.TASKS_BUNDLED_TARGET, dockerfiles.TASKS_CUSTOM_TARGET):
        assert dockerfiles.run_as_problems(df, target) == []
    base = df.stage("base")
    (entrypoint,) = base.commands("ENTRYPOINT")
    assert entrypoint.json and list(entrypoint.value) == ["cp", "-R", f"{TASKS_IMAGE_DIR}/."]
    (user,) = base.commands("USER")
    assert user.value == ("10001:10001",)
    (custom_copy,) = df.stage(dockerfiles.TASKS_CUSTOM_TARGET).commands("COPY")
    assert custom_copy.value == (".", f"{TASKS_IMAGE_DIR}/")
    assert "BASE_IMAGE" in df.global_args


def test_the_copied_catalog_loads_in_the_orchestrator(tmp_path: Path) -> None:
    """What the bundled image holds under /openforge/tasks, as the init container copies it."""
    for source, dest in bundled_copies():
        shutil.copytree(
            ROOT / source, tmp_path / PurePosixPath(dest).name, ignore=shutil.ignore_patterns("__pycache__")
        )
    catalog = TaskCatalog(tmp_path)
    assert catalog.sets() == sorted(BUNDLED)
    for task_set, source in BUNDLED.items():
        ids = catalog.ids(task_set)
        assert ids == sorted(p.parent.name for p in (ROOT / source).glob("*/task.toml"))
        for task_id in ids:
            assert catalog.get(task_set, task_id).task_set == task_set


BROKEN_TASKS = {
    "a set with no task.toml": (
        "examples/demo/tasks/test/ /openforge/tasks/demo-test/",
        "examples/demo/tasks/ /openforge/tasks/demo-test/",
        r"examples/demo/tasks/(train|test): no task.toml",
    ),
    "a set copied twice": (
        "/openforge/tasks/demo-test/",
        "/openforge/tasks/test/",
        "task set test is copied more than once",
    ),
    "a missing folder": (
        "examples/demo/tasks/test/",
        "examples/demo/tasks/tset/",
        "COPY source examples/demo/tasks/tset/ is not in the context",
    ),
    "sets merged into the root": (
        "/openforge/tasks/demo-test/",
        "/openforge/tasks/",
        "is copied to /openforge/tasks, not to a task set",
    ),
    "a root user": ("USER 10001:10001", "USER root", "runs as root"),
}


@pytest.mark.parametrize("case", BROKEN_TASKS)
def test_the_static_checks_catch_a_broken_tasks_image(case: str, tmp_path: Path) -> None:
    old, new, expected = BROKEN_TASKS[case]
    text = TASKS_DOCKERFILE.read_text()
    assert old in text, old
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(old, new))
    problems = dockerfiles.tasks_image_problems(path)
    assert any(re.search(expected, p) for p in problems), problems


def test_the_static_checks_catch_a_verifier_left_out_of_the_context(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    text = (ROOT / ".dockerignore").read_text()
    (tmp_path / ".dockerignore").write_text(re.sub(r"(?m)^!examples/.*/tests\n", "", text))
    problems = dockerfiles.tasks_image_problems(context=tmp_path)
    assert any(
        re.search(r"examples/tasks/train/[^/]+/tests/test.sh: left out of the build context", p) for p in problems
    )


# --- Tilt ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[{}, {"gpu": True}], ids=["tilt-up", "tilt-up-gpu"])
def run(request: pytest.FixtureRequest) -> TiltRun:
    flags: dict[str, Any] = request.param
    return tilt_check.run_tiltfile(flags=flags)


def test_tilt_builds_the_bundled_task_sets_from_just_their_folders(run: TiltRun) -> None:
    (img,) = [i for i in run.images if i.ref == TASKS_IMAGE]
    assert (run.root / img.dockerfile).resolve() == TASKS_DOCKERFILE
    assert img.context == "."
    assert img.target == dockerfiles.TASKS_BUNDLED_TARGET
    assert sorted(img.only) == sorted(source.rstrip("/") for source, _ in bundled_copies())
    assert not img.live_update
    users = [
        c["image"]
        for o in run.yaml_objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "orchestrator"
        for c in o["spec"]["template"]["spec"].get("initContainers", [])
    ]
    assert [u.split(":")[0] for u in users] == [TASKS_IMAGE]


def test_tilt_builds_a_folder_of_task_sets_given_with_the_tasks_flag() -> None:
    assert {"tasks": "examples/tasks"} in tilt_check.FLAG_SETS
    run = tilt_check.run_tiltfile(flags={"tasks": "examples/tasks"})
    (img,) = [i for i in run.images if i.ref == TASKS_IMAGE]
    assert (img.context, img.target, img.only) == ("examples/tasks", dockerfiles.TASKS_CUSTOM_TARGET, [])
    assert tilt_check.analyze(run) == []


def test_tilt_reports_a_folder_that_holds_no_task_sets(tmp_path: Path) -> None:
    (tmp_path / "train" / "one").mkdir(parents=True)
    run = tilt_check.run_tiltfile(flags={"tasks": str(tmp_path)})
    problems = "\n".join(tilt_check.analyze(run))
    assert "train/one: no task.toml" in problems
