"""The Tiltfile, evaluated with starlark-pyo3 and stubs that have Tilt's parameter names."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
import starlark as sl

from tools.deploy import dockerfiles, tilt_check
from tools.deploy.tilt_stubs import FallBackOnStep, RunStep, SyncStep, TiltRun, TiltStubs, evaluate

SERVICES = {
    "proxy": "openforge_proxy",
    "orchestrator": "openforge_orchestrator",
    "trajectory-store": "openforge_trajectory_store",
    "inference": "openforge_inference",
    "trainer": "openforge_trainer",
}
GPU_SERVICES = ("inference", "trainer")


@pytest.fixture(scope="module", params=[{}, {"gpu": True}], ids=["tilt-up", "tilt-up-gpu"])
def run(request: pytest.FixtureRequest) -> TiltRun:
    flags: dict[str, Any] = request.param
    return tilt_check.run_tiltfile(flags=flags)


def test_the_tiltfile_passes_every_check() -> None:
    assert tilt_check.check_tiltfile() == []


def test_the_gpu_flag_switches_overlay_and_images(run: TiltRun) -> None:
    gpu = bool(run.flags.get("gpu"))
    assert run.kustomized == ["deploy/k8s/overlays/gpu" if gpu else "deploy/k8s/overlays/dev"]
    refs = {img.ref: img for img in run.images if img.base_of is None}
    for service in SERVICES:
        ref = f"openforge/{service}-gpu" if gpu and service in GPU_SERVICES else f"openforge/{service}"
        assert ref in refs, ref
        base = next(img for img in run.images if img.base_of == ref)
        variant = "gpu" if gpu and service in GPU_SERVICES else "cpu"
        # The one service Dockerfile, told which image by the arguments dockerfiles.py checks.
        assert base.build_args == dockerfiles.service_build_args(service, variant)


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_image_live_updates_with_sync_and_restart(run: TiltRun, service: str) -> None:
    child = next(img for img in run.images if img.base_of is None and img.ref.startswith(f"openforge/{service}"))
    base = next(img for img in run.images if img.base_of == child.ref)
    # Built from the repo root, from the services' one Dockerfile, dev stage.
    assert base.context == "."
    assert base.dockerfile == "services/Dockerfile"
    assert base.target == "dev"
    assert {"uv.lock", "libs/api", "libs/core", f"services/{service}"} <= set(base.only)
    if service in GPU_SERVICES:
        assert base.build_args["ENGINE_REQUIREMENTS"] in base.only
    steps = child.live_update
    # A lock or project file change falls back to a full build...
    assert isinstance(steps[0], FallBackOnStep)
    assert {"uv.lock", "pyproject.toml", f"services/{service}/pyproject.toml"} <= set(steps[0].files)
    # ...any other source edit is synced into the editable install...
    syncs = {s.local_path: s.remote_path for s in steps if isinstance(s, SyncStep)}
    assert syncs == {
        "libs/api/src": "/app/libs/api/src",
        "libs/core/src": "/app/libs/core/src",
        f"services/{service}/src": f"/app/services/{service}/src",
    }
    # ...and the process restarts (the restart_process extension's last step).
    assert isinstance(steps[-1], RunStep) and str(steps[-1].cmd).startswith("date > /app/")
    assert child.entrypoint[-3:] == ["python", "-m", SERVICES[service]]
    assert SERVICES[service] == dockerfiles.service_module(service)  # what the image runs, too


def test_codegen_is_a_local_resource_the_services_wait_for(run: TiltRun) -> None:
    protos = next(r for r in run.local_resources if r.name == "protos")
    assert protos.cmd == "make protos"  # the Makefile's codegen target: tools/gen_protos.py
    assert "protos" in protos.deps
    for res in run.k8s_resources:
        if res.workload in SERVICES:
            assert "protos" in res.resource_deps, res.workload


def test_every_resource_has_labels_and_services_have_port_forwards(run: TiltRun) -> None:
    for res in run.k8s_resources:
        assert res.labels, res.workload or res.new_name
        if res.workload in SERVICES:
            assert res.port_forwards, res.workload
    assert all(r.labels for r in run.local_resources)


def test_every_path_the_tiltfile_names_exists(run: TiltRun) -> None:
    root = run.root
    for img in run.images:
        assert (root / img.context).is_dir()
        if img.dockerfile:
            assert (root / img.dockerfile).is_file()
        for path in img.only:
            assert (root / img.context / path).exists(), path
    for local in run.local_resources:
        for dep in local.deps:
            assert (root / dep).exists(), dep
    for folder in run.kustomized:
        assert (root / folder / "kustomization.yaml").is_file()


def test_the_analysis_reads_each_dockerfile_with_the_images_build_args(tmp_path: Path) -> None:
    """What `docker build` would miss: an ARG the target needs, a source outside `only`."""
    (tmp_path / "src").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "Dockerfile").write_text(
        "ARG NAME\nFROM scratch AS app\nARG NAME\nCOPY ${NAME}/ /app/\nCOPY other/ /other/\n"
    )
    run = evaluate_snippet(
        tmp_path,
        """\
        docker_build('openforge/a', '.', target='app', only=['src'])
        docker_build('openforge/b', '.', target='app', build_args={'NAME': 'src'}, only=['src'])
        """,
    )
    problems = "\n".join(tilt_check.analyze(run))
    assert "image openforge/a: " in problems and "ARG NAME has no value: pass it" in problems
    assert "image openforge/b: " in problems and "COPY source other/ is not in the context" in problems
    assert "COPY source src/" not in problems


def test_what_tilt_builds_is_inside_the_docker_build_context(run: TiltRun) -> None:
    """Each `only` path is admitted by the root .dockerignore allow-list."""
    allowed = [
        line[1:].rstrip("/") for line in (run.root / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    for img in run.images:
        for path in img.only:
            assert any(path == a or path.startswith(a + "/") for a in allowed), path


# --- the stubs behave like Tilt ------------------------------------------------------------------


def evaluate_snippet(tmp_path: Path, source: str) -> TiltRun:
    (tmp_path / "Tiltfile").write_text(textwrap.dedent(source))
    stubs = TiltStubs(tmp_path, {}, lambda folder: "")
    return evaluate(tmp_path / "Tiltfile", stubs)


def test_a_misspelled_keyword_fails(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(sl.StarlarkError, match="unexpected keyword argument 'dockerfle'"):
        evaluate_snippet(tmp_path, "docker_build('x', '.', dockerfle='Dockerfile')\n")


def test_a_missing_argument_fails(tmp_path: Path) -> None:
    with pytest.raises(sl.StarlarkError, match="missing 1 required positional argument"):
        evaluate_snippet(tmp_path, "sync('a')\n")


def test_a_missing_file_fails(tmp_path: Path) -> None:
    with pytest.raises(sl.StarlarkError, match=r"missing\.yaml does not exist"):
        evaluate_snippet(tmp_path, "k8s_yaml(['missing.yaml'])\n")


def test_an_unknown_dockerfile_stage_or_build_arg_fails(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("ARG A=1\nFROM scratch AS one\n")
    with pytest.raises(sl.StarlarkError, match="target 'two' is not a stage"):
        evaluate_snippet(tmp_path, "docker_build('x', '.', target='two')\n")
    with pytest.raises(sl.StarlarkError, match="build arg 'B' is not an ARG"):
        evaluate_snippet(tmp_path, "docker_build('x', '.', target='one', build_args={'B': '2'})\n")


def test_sync_after_run_fails(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "src").mkdir()
    with pytest.raises(sl.StarlarkError, match=r"sync\(\) may not follow run\(\)"):
        evaluate_snippet(
            tmp_path,
            "docker_build('x', '.', live_update=[run('true'), sync('src', '/app/src')])\n",
        )


def test_an_undefined_builtin_fails(tmp_path: Path) -> None:
    with pytest.raises(sl.StarlarkError, match="not_a_tilt_builtin"):
        evaluate_snippet(tmp_path, "not_a_tilt_builtin()\n")


def test_syntax_that_tilt_rejects_fails(tmp_path: Path) -> None:
    with pytest.raises(sl.StarlarkError):
        evaluate_snippet(tmp_path, 'x = 1\ny = f"{x}"\n')


def test_analysis_reports_unknown_workloads_images_and_dependencies(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "app.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: apps/v1
            kind: Deployment
            metadata: {name: app}
            spec:
              selector: {matchLabels: {a: b}}
              template:
                metadata: {labels: {a: b}}
                spec:
                  containers:
                    - {name: app, image: "openforge/app:1", ports: [{containerPort: 80}]}
            """
        )
    )
    run = evaluate_snippet(
        tmp_path,
        """\
        k8s_yaml('app.yaml')
        docker_build('openforge/other', '.')
        k8s_resource('app', port_forwards=['8080:81'], resource_deps=['db'])
        k8s_resource('ghost')
        """,
    )
    problems = "\n".join(tilt_check.analyze(run))
    assert "openforge/other is built but no workload uses it" in problems
    assert "openforge/app (used by app) is deployed but never built" in problems
    assert "depends on unknown resource 'db'" in problems
    assert "k8s_resource('ghost'): no such workload" in problems
    assert "reaches port 81, which no container declares" in problems


# Tilt's own signatures (docs.tilt.dev/api.html and the restart_process extension): the stubs
# must accept exactly these parameter names, in this order.
TILT_SIGNATURES = {
    "docker_build": [
        "ref", "context", "build_args", "dockerfile", "dockerfile_contents", "live_update",
        "match_in_env_vars", "ignore", "only", "entrypoint", "target", "ssh", "network", "secret",
        "extra_tag", "container_args", "cache_from", "pull", "platform", "extra_hosts",
    ],
    "k8s_yaml": ["yaml", "allow_duplicates"],
    "kustomize": ["pathToDir", "kustomize_bin", "flags"],
    "k8s_resource": [
        "workload", "new_name", "port_forwards", "extra_pod_selectors", "trigger_mode",
        "resource_deps", "objects", "auto_init", "pod_readiness", "links", "labels",
        "discovery_strategy",
    ],
    "local_resource": [
        "name", "cmd", "deps", "trigger_mode", "resource_deps", "ignore", "auto_init", "serve_cmd",
        "cmd_bat", "serve_cmd_bat", "allow_parallel", "links", "labels", "env", "serve_env",
        "readiness_probe", "dir", "serve_dir",
    ],
    "sync": ["local_path", "remote_path"],
    "run": ["cmd", "trigger", "echo_off"],
    "fall_back_on": ["files"],
    "link": ["url", "name"],
    "port_forward": ["local_port", "container_port", "name", "link_path", "host"],
    "allow_k8s_contexts": ["contexts"],
    "update_settings": [
        "max_parallel_updates", "k8s_upsert_timeout_secs", "suppress_unused_image_warnings",
        "k8s_server_side_apply",
    ],
    "version_settings": ["check_updates", "constraint"],
    "config.define_bool": ["name", "args", "usage"],
    "config.define_string_list": ["name", "args", "usage"],
    "config.parse": [],
    "config.set_enabled_resources": ["resources"],
    "os.path.exists": ["path"],
    "ext://restart_process docker_build_with_restart": [
        "ref", "context", "entrypoint", "live_update", "base_suffix", "restart_file", "trigger", "kwargs",
    ],
}  # fmt: skip


@pytest.mark.parametrize("builtin", TILT_SIGNATURES)
def test_the_stubs_have_tilts_parameter_names(tmp_path: Path, builtin: str) -> None:
    stubs = TiltStubs(tmp_path, {}, lambda folder: "")
    funcs: dict[str, Any] = dict(stubs.builtins())
    for namespace, members in stubs.namespaces().items():
        funcs.update({f"{namespace}.{k}": v for k, v in members.items()})
    for ext, members in stubs.extensions().items():
        funcs.update({f"{ext} {k}": v for k, v in members.items()})
    params = list(inspect.signature(funcs[builtin]).parameters)
    assert params == TILT_SIGNATURES[builtin]
