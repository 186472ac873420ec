"""The ``openforge dash`` command."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import click

from openforge_core.settings import ServiceAddresses

#: Where ``openforge up`` serves the trajectory store with its default ``--base-port`` (127.0.0.1:50053).
DEFAULT_STORE = ServiceAddresses().trajectory_store


def _exit_once(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C/SIGTERM before or after serving: leave through the cleanup, ignoring a second signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@click.command()
@click.option(
    "--store",
    default=DEFAULT_STORE,
    show_default=True,
    envvar="OPENFORGE_SERVICES__TRAJECTORY_STORE",
    help="host:port of the trajectory store's gRPC server (what `openforge up` started).",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Show a finished run: the state folder of `openforge train` (e.g. .openforge/train/demo) or `up`. "
    "Starts NATS and a trajectory store of its own on its trajectories.db (free ports, stopped on exit); "
    "not with --store.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface the page is served on.")
@click.option("--port", default=8265, type=click.IntRange(0, 65535), show_default=True, help="TCP port of the page.")
@click.option(
    "--model-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Model folder whose tokenizer.json decodes token ids (default: with --state-dir, the run's model "
    "under it; else the run manifest's model when it is a local folder; else ids are shown).",
)
@click.option(
    "--up-state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".openforge"),
    show_default=True,
    envvar="OPENFORGE_STATE_DIR",
    help="With --store: the state folder of the running `openforge up` (its --state-dir), whose resource log "
    "(resources.jsonl, written by a foreground `up`) the run page draws as it grows; nothing drawn without one.",
)
@click.pass_context
def dash(
    ctx: click.Context,
    store: str,
    state_dir: Path | None,
    host: str,
    port: int,
    model_dir: Path | None,
    up_state_dir: Path,
) -> None:
    """Serve the dashboard: runs, metric curves, rollouts and trajectories from the trajectory store."""
    from openforge_cli.dash.local_store import StateDirError, check_state_dir, run_model_dir, run_store
    from openforge_cli.dash.server import serve

    if model_dir is not None and not (model_dir / "tokenizer.json").is_file():
        raise click.BadParameter(f"no tokenizer.json in {model_dir}", param_hint="--model-dir")
    if state_dir is None:
        try:
            serve(store, host, port, model_dir, up_state_dir)
        except OSError as exc:  # the port is taken, or the interface does not exist
            raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from exc
        return

    if ctx.get_parameter_source("store") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--state-dir starts a store of its own: give --state-dir or --store, not both")
    try:
        db = check_state_dir(state_dir)
    except StateDirError as exc:
        raise click.BadParameter(str(exc), param_hint="--state-dir") from exc
    if model_dir is None:
        model_dir = run_model_dir(state_dir)
    previous = signal.signal(signal.SIGTERM, _exit_once), signal.signal(signal.SIGINT, _exit_once)
    try:
        click.echo(f"starting a trajectory store on {db} ...")
        with run_store(state_dir) as address:
            click.echo(f"tokens decoded with {model_dir / 'tokenizer.json'}" if model_dir else "token ids shown")
            try:
                serve(address, host, port, model_dir, state_dir)
            except OSError as exc:
                raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from exc
            finally:  # serving stopped (its signal handlers are gone): stop the store undisturbed
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        for sig, handler in zip((signal.SIGTERM, signal.SIGINT), previous, strict=True):
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
