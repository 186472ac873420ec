"""``openforge``: start, stop and inspect OpenForgeRL on one machine."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from openforge_cli import local
from openforge_cli.dash.command import dash
from openforge_cli.eval import eval_command
from openforge_cli.harness import harness
from openforge_cli.model import model
from openforge_cli.task_family import tasks
from openforge_cli.train import train_command

STATE_DIR_HELP = "Folder for logs, NATS data and the process list."


@click.group()
def main() -> None:
    """OpenForgeRL: RL for LLM agents inside the real harnesses they are deployed with."""


@main.command()
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path(".openforge"),
    show_default=True,
    envvar="OPENFORGE_STATE_DIR",
    help=STATE_DIR_HELP,
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface the services bind.")
@click.option("--base-port", default=50051, show_default=True, help="gRPC port of the first service.")
@click.option("--nats-port", default=4322, show_default=True, help="Port of the embedded NATS server.")
@click.option("--http-port", default=8080, show_default=True, help="The proxy's port for harnesses.")
@click.option("--nats-url", default=None, help="Use this NATS server instead of starting one.")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, help="Seconds to wait for SERVING.")
@click.option("--detach", is_flag=True, help="Return once SERVING; stop later with `openforge down`.")
def up(
    state_dir: Path,
    host: str,
    base_port: int,
    nats_port: int,
    http_port: int,
    nats_url: str | None,
    timeout_s: float,
    detach: bool,
) -> None:
    """Start NATS and the five services as local processes; Ctrl-C stops them all.

    In the foreground a process that exits is started again with backoff; one that keeps
    exiting stops everything with a message (logs/supervisor.log records every restart).
    """
    stop = threading.Event()
    given_up: list[str] = []

    def on_failure(why: str) -> None:
        given_up.append(why)
        stop.set()

    try:
        state = local.up(
            state_dir,
            host=host,
            base_port=base_port,
            nats_port=nats_port,
            http_port=http_port,
            nats_url=nats_url,
            timeout_s=timeout_s,
            supervise=not detach,
            on_failure=on_failure,
        )
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"OpenForgeRL is up ({len(state.processes)} processes, all SERVING):")
    for p in state.processes:
        click.echo(f"  {p.name:<17} {p.address:<24} pid {p.pid:<8} log {p.log}")
    click.echo(f"Harness base URL (the proxy): {state.harness_base_url}")
    if detach:
        click.echo("Stop with: openforge down")
        return
    click.echo("Press Ctrl-C to stop.")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        if local.stopping(state_dir):  # `openforge down` from another terminal
            done = local.wait_down(state_dir, timeout_s=300, cancel=stop)  # the supervisor reaps what it stops
            supervisor = local.supervisor_of(state_dir)
            if supervisor is not None:
                supervisor.stop()
            click.echo("stopped by `openforge down`" if done else "`openforge down` is still stopping the services")
            return
    click.echo(f"stopping: {given_up[0]}" if given_up else "stopping...", err=bool(given_up))
    stopped = local.down(state_dir)
    click.echo(f"stopped {', '.join(stopped) or 'nothing'}")
    if given_up:
        raise SystemExit(1)


@main.command()
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path(".openforge"),
    show_default=True,
    envvar="OPENFORGE_STATE_DIR",
    help=STATE_DIR_HELP,
)
def down(state_dir: Path) -> None:
    """Stop everything `openforge up` started (no process is left behind)."""
    stopped = local.down(state_dir)
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")


@main.command()
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path(".openforge"),
    show_default=True,
    envvar="OPENFORGE_STATE_DIR",
    help=STATE_DIR_HELP,
)
def status(state_dir: Path) -> None:
    """Show each local process, its health and its CPU and memory use; exits 1 unless all are
    SERVING."""
    rows = local.status(state_dir)
    if not rows:
        click.echo("not up (no process list); start with `openforge up`")
        sys.exit(1)
    healthy = True
    for row in rows:
        use = f"  {row.resources}" if row.resources is not None else ""
        click.echo(f"  {row.name:<17} {row.address:<24} pid {row.pid:<8} {row.health:<12}{use}")
        healthy = healthy and row.alive and row.health in ("SERVING", "RUNNING")
    sys.exit(0 if healthy else 1)


main.add_command(harness)
main.add_command(model)
main.add_command(tasks)
main.add_command(train_command)
main.add_command(eval_command)
main.add_command(dash)

if __name__ == "__main__":
    main()
