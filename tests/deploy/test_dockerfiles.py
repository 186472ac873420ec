"""The service and harness images, read with Docker's own parser and linted with hadolint.

The five services share ``services/Dockerfile``; each check runs for every service (and
variant) with the build arguments of ``dockerfiles.service_build_args``, and the checks of
``tools.deploy.dockerfiles`` are shown to catch what they promise on broken copies of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from openforge_core.harness_catalog import HARNESSES as CATALOG
from tools.deploy import dockerfiles
from tools.deploy.dockerfiles import (
    SERVICE_DOCKERFILE,
    SERVICE_IMAGES,
    ParsedDockerfile,
    Stage,
    parse_dockerfile,
    service_build_args,
    service_module,
    service_variants,
)

ROOT = dockerfiles.ROOT
SERVICES = {
    "proxy": ("openforge_proxy", "openforge-proxy"),
    "orchestrator": ("openforge_orchestrator", "openforge-orchestrator"),
    "trajectory-store": ("openforge_trajectory_store", "openforge-trajectory-store"),
    "inference": ("openforge_inference", "openforge-inference"),
    "trainer": ("openforge_trainer", "openforge-trainer"),
}
GPU_SERVICES = ("inference", "trainer")
#: Every service image: (service, variant).
IMAGES = [(s, v) for s in SERVICES for v in service_variants(s)]
NON_ROOT_USER = "10001:10001"
ENTRYPOINT = "/usr/local/bin/openforge-service"

#: The harness CLIs and the versions observed in shared/reference/harness-protocols.md.
#: Harness name → (package, pinned version), from the one catalog.
HARNESSES = {name: (h.package, h.version) for name, h in CATALOG.items()}


def service_dockerfile() -> ParsedDockerfile:
    return parse_dockerfile(SERVICE_DOCKERFILE)


def runs(stage: Stage) -> str:
    return "\n".join(" ".join(i.value) for i in stage.commands("RUN"))


def resolved_runs(df: ParsedDockerfile, stage: str, service: str, variant: str = "cpu") -> list[str]:
    """The stage's RUN commands with the image's build args substituted."""
    instructions, _ = df.resolved(df.stage(stage), service_build_args(service, variant))
    return [" ".join(i.value) for i in instructions if i.cmd == "RUN"]


def test_every_dockerfile_is_lint_clean() -> None:
    files = dockerfiles.all_dockerfiles()
    assert files == sorted(
        [
            SERVICE_DOCKERFILE,
            dockerfiles.TASKS_DOCKERFILE,
            *(ROOT / "deploy" / "harness" / h / "Dockerfile" for h in HARNESSES),
        ]
    )
    assert not list(ROOT.glob("services/*/Dockerfile")), "one Dockerfile for the services: services/Dockerfile"
    status, report = dockerfiles.hadolint(files)
    assert status == 0, report


def test_the_image_table_names_every_service_and_its_package() -> None:
    assert set(SERVICE_IMAGES) == set(SERVICES) == {p.parent.name for p in ROOT.glob("services/*/pyproject.toml")}
    for service, (package, dist) in SERVICES.items():
        assert service_module(service) == package
        assert (ROOT / "services" / service / "src" / package / "__main__.py").is_file()
        project = tomllib.loads((ROOT / "services" / service / "pyproject.toml").read_text())["project"]
        assert project["name"] == dist == f"openforge-{service}"
    assert {s for s, v in IMAGES if v == "gpu"} == set(GPU_SERVICES)


@pytest.mark.parametrize(("service", "variant"), IMAGES)
def test_each_service_image_passes_every_static_check(service: str, variant: str) -> None:
    """Builds from the context, non-root, exec-form entrypoint, no build tools at run time."""
    assert dockerfiles.service_image_problems(service, variant) == []


def test_the_image_has_the_dependency_dev_and_runtime_stages() -> None:
    df = service_dockerfile()
    assert {"deps", "dev", "build", "runtime"} <= set(df.stage_names)
    # The last stage is what a plain `docker build` produces.
    assert df.stages[-1].name == "runtime"
    assert df.chain("dev")[1] == "deps"
    assert df.global_args["SERVICE"] is None, "no default: a build names its service"


@pytest.mark.parametrize("service", SERVICES)
def test_the_dependency_layer_comes_from_the_lock_alone(service: str) -> None:
    _, dist = SERVICES[service]
    df = service_dockerfile()
    deps, _ = df.resolved(df.stage("deps"), service_build_args(service))
    copies = [i for i in deps if i.cmd == "COPY"]
    assert all("libs/" not in i.original and "services/" not in i.original for i in copies), (
        "no source is copied before the dependencies are installed"
    )
    first_run = next(i for i in deps if i.cmd == "RUN")
    assert f"uv sync --frozen --no-dev --no-install-workspace --package {dist}" in " ".join(first_run.value)
    mounts = [f for f in first_run.flags if f.startswith("--mount=type=bind")]
    assert {m.split("source=")[1].split(",")[0] for m in mounts} == {
        "uv.lock",
        "pyproject.toml",
        "libs/api/pyproject.toml",
        "libs/core/pyproject.toml",
        f"services/{service}/pyproject.toml",
    }


@pytest.mark.parametrize("service", SERVICES)
def test_dev_installs_editable_sources_and_runtime_a_built_venv(service: str) -> None:
    _, dist = SERVICES[service]
    df = service_dockerfile()
    dev = "\n".join(resolved_runs(df, "dev", service))
    assert f"--inexact --package {dist}" in dev and "--no-editable" not in dev
    assert f"--no-editable --inexact --package {dist}" in "\n".join(resolved_runs(df, "build", service))
    instructions, _ = df.resolved(df.stage("dev"), service_build_args(service))
    copies = [(i.flags, i.value) for i in instructions if i.cmd == "COPY"]
    for src in ("libs/api/", "libs/core/", f"services/{service}/"):
        assert (("--chown=10001:10001",), (src, src)) in copies, src


@pytest.mark.parametrize("stage_name", ["dev", "runtime"])
def test_the_service_runs_non_root_with_an_exec_form_entrypoint(stage_name: str) -> None:
    stage = service_dockerfile().stage(stage_name)
    users = stage.commands("USER")
    assert users and users[-1].value == (NON_ROOT_USER,)
    entrypoint = stage.commands("ENTRYPOINT")[-1]
    assert entrypoint.json, "exec form: no shell in front of the service"
    assert list(entrypoint.value) == [ENTRYPOINT]


@pytest.mark.parametrize("service", SERVICES)
def test_the_entrypoint_execs_python_on_the_service_module(service: str, tmp_path: Path) -> None:
    """Runs the base stage's RUN that writes the entrypoint (with a temporary path for it): the
    script must `exec` Python on the service's module, so that Python is PID 1."""
    df = service_dockerfile()
    (writer,) = [r for r in resolved_runs(df, "base", service) if ENTRYPOINT in r]
    script = tmp_path / "openforge-service"
    done = subprocess.run(
        ["sh", "-c", writer.replace(ENTRYPOINT, str(script))], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert script.read_text() == f'#!/bin/sh\nexec /app/.venv/bin/python -m {SERVICES[service][0]} "$@"\n'
    assert script.stat().st_mode & 0o755 == 0o755
    # No SERVICE, no image: the same line refuses to write an entrypoint.
    unset = subprocess.run(
        ["sh", "-c", " ".join(next(i for i in df.stage("base").commands("RUN") if ENTRYPOINT in i.original).value)],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "SERVICE": ""},
    )
    assert unset.returncode != 0 and "--build-arg SERVICE=" in unset.stderr


@pytest.mark.parametrize(("service", "variant"), IMAGES)
def test_the_runtime_stage_has_no_build_tools(service: str, variant: str) -> None:
    df = service_dockerfile()
    args = service_build_args(service, variant)
    runtime = df.stage("runtime")
    assert [i.original for i in runtime.instructions if i.cmd in ("RUN", "ADD")] == []
    assert [i.flags for i in runtime.commands("COPY")] == [("--from=build",)]
    # Neither the runtime nor what it is built on gets uv.
    chain = df.chain("runtime", args)
    for name in chain[:-1]:
        assert not any("--from=uv" in i.flags for i in df.stage(name).commands("COPY")), name
    if variant == "cpu":
        assert "pip uninstall" in "\n".join(runs(df.stage(name)) for name in chain[:-1])
        assert dockerfiles.RUNTIME_PACKAGES["cpu"] == frozenset()


@pytest.mark.parametrize("service", GPU_SERVICES)
def test_the_gpu_variant_is_built_on_cuda(service: str) -> None:
    df = service_dockerfile()
    assert df.chain("runtime", service_build_args(service))[-1].startswith("python:3.11")
    gpu_args = service_build_args(service, "gpu")
    gpu_base = df.chain("runtime", gpu_args)[-1]
    assert gpu_base.startswith("nvidia/cuda:"), gpu_base
    assert df.chain("dev", gpu_args)[-1] == gpu_base
    for variant in ("cpu", "gpu"):
        assert service_build_args(service, variant)["ENGINE_REQUIREMENTS"] == f"requirements/{service}-{variant}.txt"
    deps = df.stage("deps")
    assert "-c /tmp/lock-constraints.txt" in runs(deps), "the engine stack may not move locked versions"


@pytest.mark.parametrize("service", [s for s in SERVICES if s not in GPU_SERVICES])
def test_the_light_services_get_no_engine_stack(service: str) -> None:
    assert "ENGINE_REQUIREMENTS" not in service_build_args(service)
    assert (
        next(w for i in service_dockerfile().stage("deps").commands("ARG") for w in i.value if w.startswith("ENGINE_"))
        == 'ENGINE_REQUIREMENTS=""'
    )
    with pytest.raises(ValueError, match="no gpu image"):
        service_build_args(service, "gpu")


# --- the checks catch what they promise ---------------------------------------------------------


def broken_copy(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the build context whose services/Dockerfile has the last ``old`` replaced by ``new``."""
    text = SERVICE_DOCKERFILE.read_text()
    assert old in text, old
    head, _, tail = text.rpartition(old)
    for item in ("uv.lock", "pyproject.toml", "libs", "requirements", ".dockerignore"):
        (tmp_path / item).symlink_to(ROOT / item)
    (tmp_path / "services").mkdir()
    for service in SERVICES:
        (tmp_path / "services" / service).symlink_to(ROOT / "services" / service)
    path = tmp_path / "services" / "Dockerfile"
    path.write_text(head + new + tail)
    return path


RUNTIME_STAGE = "FROM base AS runtime\n"
RUNTIME_TAIL = 'USER 10001:10001\nEXPOSE ${PORTS}\nENTRYPOINT ["/usr/local/bin/openforge-service"]\n'
BROKEN = {
    "a missing COPY source": ("COPY libs/core/ libs/core/", "COPY libs/kore/ libs/core/", "COPY source libs/kore/"),
    "a missing bind-mount source": (
        "source=libs/api/pyproject.toml,",
        "source=libs/ap/pyproject.toml,",
        "bind mount source libs/ap/pyproject.toml",
    ),
    "a shell-form entrypoint": (
        RUNTIME_TAIL,
        "USER 10001:10001\nEXPOSE ${PORTS}\nENTRYPOINT exec /usr/local/bin/openforge-service\n",
        r"--target runtime: line \d+: ENTRYPOINT in shell form",
    ),
    "the root user": (RUNTIME_TAIL, RUNTIME_TAIL.replace("10001:10001", "root"), "--target runtime: .*runs as root"),
    "gid 0": (RUNTIME_TAIL, RUNTIME_TAIL.replace("10001:10001", "10001:0"), "--target runtime: .*runs as root"),
    "no user": (RUNTIME_TAIL, RUNTIME_TAIL.replace("USER 10001:10001\n", ""), r"runtime: runs as root \(no USER\)"),
    "a compiler in the runtime stage": (
        RUNTIME_STAGE,
        RUNTIME_STAGE + "RUN apt-get update && apt-get install --yes --no-install-recommends gcc\n",
        "installs gcc",
    ),
    "a compiler in the base": (
        "RUN groupadd",
        "RUN apt-get install --yes --no-install-recommends build-essential && groupadd",
        r"stage base, line \d+: installs build-essential",
    ),
    "a runtime on the deps stage (uv inside)": (RUNTIME_STAGE, "FROM deps AS runtime\n", "copies uv into the image"),
    "pip in the runtime": (RUNTIME_STAGE, RUNTIME_STAGE + "RUN pip install httpx\n", "runs an installer"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_the_static_checks_catch_a_broken_image(case: str, tmp_path: Path) -> None:
    old, new, expected = BROKEN[case]
    path = broken_copy(tmp_path, old, new)
    problems = dockerfiles.service_image_problems("proxy", "cpu", dockerfile=path)
    assert any(re.search(expected, p) for p in problems), problems


def test_the_static_checks_catch_an_unset_service_and_an_unknown_build_arg(tmp_path: Path) -> None:
    df = service_dockerfile()
    problems = dockerfiles.context_problems(df, "runtime", {"SERVIC": "proxy"})
    assert any("build arg SERVIC is not an ARG" in p for p in problems)
    assert any("ARG SERVICE has no value" in p for p in problems)
    # A SERVICE that is no folder under services/.
    problems = dockerfiles.context_problems(df, "runtime", {"SERVICE": "nope"})
    assert any("COPY source services/nope/ is not in the context" in p for p in problems)
    # An engine lock that is not in the context.
    path = broken_copy(tmp_path, "FROM base AS deps\n", "FROM base AS deps\n")
    (tmp_path / "requirements").unlink()
    problems = dockerfiles.service_image_problems("trainer", "gpu", dockerfile=path)
    assert any("ENGINE_REQUIREMENTS=requirements/trainer-gpu.txt is not a file" in p for p in problems)


def test_gcc_is_allowed_only_in_the_gpu_runtime() -> None:
    df = service_dockerfile()
    gpu = dockerfiles.build_tool_problems(df, "runtime", service_build_args("trainer", "gpu"))
    assert {p.rsplit(": ", 1)[-1] for p in gpu} == {"installs ca-certificates", "installs gcc", "installs libc6-dev"}
    allowed = dockerfiles.RUNTIME_PACKAGES["gpu"]
    assert dockerfiles.build_tool_problems(df, "runtime", service_build_args("trainer", "gpu"), allowed) == []


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_closure(dist: str) -> dict[str, str]:
    """The versions uv.lock gives ``dist`` and everything it depends on (no extras, no dev)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    packages = {normalize(p["name"]): p for p in lock["package"]}
    closure: dict[str, str] = {}
    todo = [normalize(dist)]
    while todo:
        name = todo.pop()
        if name in closure or name not in packages:
            continue
        closure[name] = str(packages[name].get("version", ""))
        todo.extend(normalize(d["name"]) for d in packages[name].get("dependencies", []))
    return closure


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("service", GPU_SERVICES)
def test_the_engine_lock_never_moves_a_locked_version(service: str, variant: str) -> None:
    path = ROOT / "requirements" / f"{service}-{variant}.txt"
    if not path.is_file():
        pytest.skip(f"{path.relative_to(ROOT)} (the pinned engine stack) is not written yet")
    pins = {
        normalize(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", path.read_text(), re.MULTILINE)
    }
    assert pins, "an exact-pinned lock (installed with --no-deps)"
    locked = locked_closure(SERVICES[service][1])
    moved = {name: (locked[name], pins[name]) for name in pins.keys() & locked.keys() if pins[name] != locked[name]}
    assert moved == {}, "the Dockerfile installs it with uv.lock's versions as constraints"


def test_the_build_context_admits_only_what_the_images_need() -> None:
    for path in ("uv.lock", "libs/api/src", "services/proxy/src", "requirements/inference-gpu.txt"):
        assert dockerfiles.in_context(path, ROOT), path
    for path in ("libs/testing", "services/proxy/tests", "tests", "examples", ".venv"):
        assert not dockerfiles.in_context(path, ROOT), path
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list"
    for needed in ("!uv.lock", "!pyproject.toml", "!libs/api/", "!libs/core/", "!services/"):
        assert needed in lines
    for never in ("**/.venv", "**/tests", "**/__pycache__", "**/node_modules"):
        assert never in lines
    assert not any(line.startswith("!libs/testing") for line in lines), "test support never ships"


# --- harness images -------------------------------------------------------------------------------


def harness(name: str) -> ParsedDockerfile:
    return parse_dockerfile(ROOT / "deploy" / "harness" / name / "Dockerfile")


def env_of(df: ParsedDockerfile) -> dict[str, str]:
    env: dict[str, str] = {}
    for stage in df.stages:
        for instr in stage.commands("ENV"):
            env.update(zip(instr.value[::2], instr.value[1::2], strict=True))
    return env


@pytest.mark.parametrize("name", HARNESSES)
def test_each_harness_image_runs_its_cli_as_non_root(name: str) -> None:
    stage = harness(name).stages[-1]
    assert stage.commands("USER")[-1].value == (NON_ROOT_USER,)
    assert stage.commands("ENTRYPOINT")[-1].json


@pytest.mark.parametrize("name", ["claude-code", "codex", "openclaw"])
def test_each_node_harness_is_pinned_by_its_lock(name: str) -> None:
    package, version = HARNESSES[name]
    folder = ROOT / "deploy" / "harness" / name
    manifest = json.loads((folder / "package.json").read_text())
    assert manifest["dependencies"] == {package: version}, "an exact version, no range"
    lock = json.loads((folder / "package-lock.json").read_text())
    entry = lock["packages"][f"node_modules/{package}"]
    assert entry["version"] == version and entry["integrity"].startswith("sha512-")
    assert "npm ci" in runs(harness(name).stages[-1])


def test_the_python_harness_is_pinned_by_hash() -> None:
    folder = ROOT / "deploy" / "harness" / "mini-swe-agent"
    text = (folder / "requirements.txt").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.MULTILINE))
    assert pins["mini-swe-agent"] == HARNESSES["mini-swe-agent"][1]
    assert pins["litellm"] == "1.106.2"
    assert pins["litellm"] not in ("1.82.7", "1.82.8")
    assert all(f"{pkg}=={ver} \\\n    --hash=sha256:" in text for pkg, ver in pins.items())
    assert "--require-hashes" in runs(harness("mini-swe-agent").stages[-1])


def test_side_traffic_is_off_by_default() -> None:
    claude = env_of(harness("claude-code"))
    assert claude["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert claude["DISABLE_AUTOUPDATER"] == "1"
    openclaw = env_of(harness("openclaw"))
    assert openclaw["OPENCLAW_NO_AUTO_UPDATE"] == "1"
    assert openclaw["OPENCLAW_OFFLINE"] == "1"
    assert env_of(harness("mini-swe-agent"))["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    codex_df = harness("codex")
    codex_home = env_of(codex_df)["CODEX_HOME"]
    copies = [i.value for i in codex_df.stages[-1].commands("COPY")]
    assert ("config.toml", f"{codex_home}/config.toml") in copies
    config = tomllib.loads((ROOT / "deploy" / "harness" / "codex" / "config.toml").read_text())
    assert config["analytics"]["enabled"] is False
    assert config["features"]["plugins"] is False


def test_the_build_script_reads_every_harness_image_from_the_catalog() -> None:
    script = (ROOT / "tools" / "deploy" / "build-harness-images.sh").read_text()
    assert 'harness_catalog.py" images' in script
    assert not [v for _, v in HARNESSES.values() if v in script], "no version of its own"
    catalog = ROOT / "libs" / "core" / "src" / "openforge_core" / "harness_catalog.py"
    printed = subprocess.run(["python3", str(catalog), "images"], capture_output=True, text=True, check=True).stdout
    images = dict(line.split() for line in printed.splitlines())
    assert images == {name: h.image for name, h in CATALOG.items()}
    for name, image in images.items():
        header = (ROOT / "deploy" / "harness" / name / "Dockerfile").read_text().splitlines()[:4]
        assert any(image in line for line in header)
