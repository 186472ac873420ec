"""The local stack of ``openforge train``: NATS and the five services as local processes in one
state folder, one phase at a time (:mod:`openforge_cli.local` starts each process)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console

from openforge_cli import local
from openforge_cli.train_config import TrainConfig


class LocalStack:
    """NATS and the five services as local processes in one state folder, one phase at a time.

    Args:
        state_dir: Logs, JetStream data, the SQLite store, checkpoints, sandboxes.
        base_port: gRPC port of the first service (the others follow).
        nats_port: Port of the embedded NATS server.
        http_port: The proxy's port for harnesses.
    """

    def __init__(self, state_dir: Path, *, base_port: int, nats_port: int, http_port: int) -> None:
        self.state_dir = state_dir.resolve()
        self.base_port = base_port
        self.nats_port = nats_port
        self.http_port = http_port
        self.addresses: dict[str, str] = {}
        self.engine = ""
        self.attached = False

    def attach(self, trainer: str, orchestrator: str) -> None:
        """Uses running services (their own engine and model) instead of starting any."""
        self.addresses = {"trainer": trainer, "orchestrator": orchestrator}
        self.attached = True
        self.engine = "attached"

    def failure(self) -> str:
        """Why the supervisor of the started services gave one up ("" while all run)."""
        supervisor = local.supervisor_of(self.state_dir)
        return supervisor.failure if supervisor is not None else ""

    def env(self, cfg: TrainConfig, engine: str, model: Path) -> dict[str, str]:
        """The ``OPENFORGE_*`` settings of every service for a phase."""
        s = self.state_dir
        env = {
            "OPENFORGE_MODEL_PATH": str(model),
            "OPENFORGE_ENGINE": engine,
            "OPENFORGE_SCRIPTED_TASKS_ROOT": str(cfg.tasks_root_path),
            "OPENFORGE_TASKS__ROOT": str(cfg.tasks_root_path),
            "OPENFORGE_HARNESS__INSTALL_DIR": str(cfg.stack.harness_dir.resolve()),
            "OPENFORGE_SANDBOX__LOCAL__ROOT": str(s / "sandboxes"),
            "OPENFORGE_SANDBOX__LOCAL__CACHE": str(s / "task-cache"),
            "OPENFORGE_SANDBOX__LOCAL__ARTIFACTS": str(s / "rollouts"),
            "OPENFORGE_SCHEDULER__MAX_CONCURRENT": str(cfg.stack.max_concurrent),
            "OPENFORGE_CHECKPOINT_DIR": str(s / "checkpoints"),
            "OPENFORGE_RESUME_ON_START": "false",
            "OPENFORGE_STORE__DSN": f"sqlite:///{s / 'trajectories.db'}",
        }
        if cfg.warm_start is not None and engine == cfg.warm_start.engine:
            env["OPENFORGE_SCRIPTED_ERROR_RATE"] = str(cfg.warm_start.error_rate)
            env["OPENFORGE_SCRIPTED_ERROR_KIND"] = cfg.warm_start.error_kind
            env["OPENFORGE_SEED"] = str(cfg.run.get("seed", 0))
        if cfg.harness_config is not None:
            env["OPENFORGE_HARNESS__CONFIG_FILES"] = json.dumps({cfg.harness: str(cfg.harness_config.resolve())})
        env.update(cfg.stack.env)
        return env

    @contextlib.contextmanager
    def running(self, cfg: TrainConfig, *, engine: str, model: Path, console: Console | None = None) -> Iterator[None]:
        """Starts the stack serving ``model`` on ``engine`` (or the fallback engine); stops it on exit.

        Raises:
            click.ClickException: The stack did not become SERVING (the message names the logs).
        """
        console = console or Console()
        if self.attached:
            console.print(f"using the running services: {self.addresses}")
            yield
            return
        engines = [engine]
        if cfg.stack.fallback_engine and cfg.stack.fallback_engine != engine and engine == cfg.stack.engine:
            engines.append(cfg.stack.fallback_engine)
        state: local.UpState | None = None
        for i, name in enumerate(engines):
            console.print(f"starting NATS and the five services (engine {name}, model {model}) ...")
            t0 = time.monotonic()
            try:
                state = local.up(
                    self.state_dir,
                    base_port=self.base_port,
                    nats_port=self.nats_port,
                    http_port=self.http_port,
                    timeout_s=cfg.stack.serving_timeout_s,
                    extra_env=self.env(cfg, name, model),
                    supervise=True,
                )
            except RuntimeError as exc:
                if i + 1 < len(engines):
                    console.print(f"[yellow]engine {name} did not start ({exc}); falling back to {engines[i + 1]}")
                    continue
                raise click.ClickException(str(exc)) from exc
            self.engine = name
            console.print(f"all SERVING in {time.monotonic() - t0:.0f}s (logs in {self.state_dir / 'logs'})")
            break
        assert state is not None
        self.addresses = {p.name: p.address for p in state.processes}
        try:
            yield
        finally:
            local.down(self.state_dir)
