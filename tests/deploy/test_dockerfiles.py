"""The service and harness images, read with Docker's own parser and linted with hadolint."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from tools.deploy import dockerfiles
from tools.deploy.dockerfiles import ParsedDockerfile, Stage, parse_dockerfile

ROOT = dockerfiles.ROOT
SERVICES = {
    "proxy": ("openforge_proxy", "openforge-proxy"),
    "orchestrator": ("openforge_orchestrator", "openforge-orchestrator"),
    "trajectory-store": ("openforge_trajectory_store", "openforge-trajectory-store"),
    "inference": ("openforge_inference", "openforge-inference"),
    "trainer": ("openforge_trainer", "openforge-trainer"),
}
GPU_SERVICES = ("inference", "trainer")
NON_ROOT_USER = "10001:10001"

#: The harness CLIs and the versions observed in shared/reference/harness-protocols.md.
HARNESSES = {
    "claude-code": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.171.0"),
    "openclaw": ("openclaw", "2026.9.6"),
    "mini-swe-agent": ("mini-swe-agent", "2.4.6"),
}


def service_dockerfile(service: str) -> ParsedDockerfile:
    return parse_dockerfile(ROOT / "services" / service / "Dockerfile")


def runs(stage: Stage) -> str:
    return "\n".join(" ".join(i.value) for i in stage.commands("RUN"))


def test_every_dockerfile_is_lint_clean() -> None:
    files = dockerfiles.all_dockerfiles()
    assert len(files) == len(SERVICES) + len(HARNESSES)
    status, report = dockerfiles.hadolint(files)
    assert status == 0, report


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_image_has_the_dependency_dev_and_runtime_stages(service: str) -> None:
    df = service_dockerfile(service)
    assert {"deps", "dev", "build", "runtime"} <= set(df.stage_names)
    # The last stage is what a plain `docker build` produces.
    assert df.stages[-1].name == "runtime"
    assert df.chain("dev")[1] == "deps"


@pytest.mark.parametrize("service", SERVICES)
def test_the_dependency_layer_comes_from_the_lock_alone(service: str) -> None:
    _, dist = SERVICES[service]
    deps = service_dockerfile(service).stage("deps")
    assert not deps.commands("COPY") or all(
        "libs/" not in i.original and "services/" not in i.original for i in deps.commands("COPY")
    ), "no source is copied before the dependencies are installed"
    first_run = deps.commands("RUN")[0]
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
    df = service_dockerfile(service)
    dev = runs(df.stage("dev"))
    assert f"--inexact --package {dist}" in dev and "--no-editable" not in dev
    assert "--no-editable" in runs(df.stage("build"))
    copies = [i.original for i in df.stage("dev").commands("COPY")]
    for src in ("libs/api/", "libs/core/", f"services/{service}/"):
        assert any(src in c and "--chown=10001:10001" in c for c in copies), src


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("stage_name", ["dev", "runtime"])
def test_the_service_runs_non_root_as_pid_1_in_exec_form(service: str, stage_name: str) -> None:
    package, _ = SERVICES[service]
    stage = service_dockerfile(service).stage(stage_name)
    users = stage.commands("USER")
    assert users and users[-1].value == (NON_ROOT_USER,)
    entrypoint = stage.commands("ENTRYPOINT")[-1]
    assert entrypoint.json, "exec form: Python is PID 1 and receives SIGTERM"
    assert list(entrypoint.value) == ["python", "-m", package]
    assert (ROOT / "services" / service / "src" / package).is_dir()


@pytest.mark.parametrize("service", SERVICES)
def test_the_runtime_stage_has_no_build_tools(service: str) -> None:
    df = service_dockerfile(service)
    runtime = df.stage("runtime")
    assert [i.original for i in runtime.instructions if i.cmd in ("RUN", "ADD")] == []
    assert [i.flags for i in runtime.commands("COPY")] == [("--from=build",)]
    # Neither the runtime nor what it is built on gets uv.
    for name in df.chain("runtime")[:-1]:
        stage = df.stage(name)
        assert not any("--from=uv" in i.flags for i in stage.commands("COPY")), name
    if service not in GPU_SERVICES:
        assert "pip uninstall" in runs(df.stage("base"))


@pytest.mark.parametrize("service", GPU_SERVICES)
def test_the_gpu_variant_is_built_on_cuda(service: str) -> None:
    df = service_dockerfile(service)
    assert df.chain("runtime")[-1].startswith("python:3.11")
    gpu_base = df.chain("runtime", {"VARIANT": "gpu"})[-1]
    assert gpu_base.startswith("nvidia/cuda:"), gpu_base
    assert df.chain("dev", {"VARIANT": "gpu"})[-1] == gpu_base
    deps = df.stage("deps")
    default = next(w for i in deps.commands("ARG") for w in i.value if w.startswith("ENGINE_REQUIREMENTS="))
    assert default == f"ENGINE_REQUIREMENTS=requirements/{service}-${{VARIANT}}.txt"
    assert "-c /tmp/lock-constraints.txt" in runs(deps), "the engine stack may not move locked versions"


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
    assert pins["mini-swe-agent"] == "2.4.6"
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


def test_the_build_script_knows_every_harness_and_its_version() -> None:
    script = (ROOT / "tools" / "deploy" / "build-harness-images.sh").read_text()
    for name, (_, version) in HARNESSES.items():
        assert f"[{name}]={version}" in script
        header = (ROOT / "deploy" / "harness" / name / "Dockerfile").read_text().splitlines()[:4]
        assert any(f"openforge/harness-{name}:{version}" in line for line in header)
