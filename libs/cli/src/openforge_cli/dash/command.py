"""The ``openforge dash`` command."""

from __future__ import annotations

from pathlib import Path

import click

from openforge_core.settings import ServiceAddresses

#: Where ``openforge up`` serves the trajectory store with its default ``--base-port`` (127.0.0.1:50053).
DEFAULT_STORE = ServiceAddresses().trajectory_store


@click.command()
@click.option(
    "--store",
    default=DEFAULT_STORE,
    show_default=True,
    envvar="OPENFORGE_SERVICES__TRAJECTORY_STORE",
    help="host:port of the trajectory store's gRPC server (what `openforge up` started).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface the page is served on.")
@click.option("--port", default=8265, show_default=True, help="TCP port of the page.")
@click.option(
    "--model-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Model folder whose tokenizer.json decodes token ids (default: the run manifest's model when it is a "
    "local folder; else ids are shown).",
)
def dash(store: str, host: str, port: int, model_dir: Path | None) -> None:
    """Serve the dashboard: runs, metric curves, rollouts and trajectories from the trajectory store."""
    from openforge_cli.dash.server import serve

    if model_dir is not None and not (model_dir / "tokenizer.json").is_file():
        raise click.BadParameter(f"no tokenizer.json in {model_dir}", param_hint="--model-dir")
    try:
        serve(store, host, port, model_dir)
    except OSError as exc:  # the port is taken, or the interface does not exist
        raise click.ClickException(f"cannot serve on {host}:{port}: {exc}") from exc
