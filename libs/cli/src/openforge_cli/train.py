"""``openforge train CONFIG``: a whole training run on one machine, on the embedded defaults.

A train config (YAML or JSON) names the model, the harness, the task set and its splits, the
trainer's run config and, optionally, a warm start and an evaluation::

    run_id: demo
    model: {path: .openforge/models/tiny-10m, init_tiny: 10m}   # built here if missing
    harness: mini-swe-agent          # or claude-code, codex, openclaw
    split: train                     # task set the run trains on (a folder of the task root)
    tasks: [count-lines, ...]        # empty: every task of the split
    stack: {engine: vllm, fallback_engine: transformers, tasks_root: examples/tasks}
    warm_start:                      # SFT on demonstrations, recorded through the same path
      engine: scripted-oracle
      run: {steps: 4, learning_rate: 1.0e-3, ...}
    run: {steps: 3, group_size: 2, learning_rate: 1.0e-4, max_tokens: 96, ...}  # the RL run
    eval: {split: test, k: 1}

The config is checked before anything starts (:func:`check_config`): unknown or misspelled
fields, bad values, unknown harness or engine names, missing splits or task ids, a missing model
without ``init_tiny``, and the trainer run configs (``run``, ``warm_start.run``) each give one line
naming the field.

The phases, each on a stack of NATS and the five services started as local processes
(:mod:`openforge_cli.local`) in the state folder (SQLite store, checkpoints, logs, bubblewrap
sandboxes), with the phase's engine serving the phase's model:

1. warm start (if configured): inference runs the ``scripted-oracle`` engine, which replays each
   task's oracle ``solve.sh`` as tool calls inside the real harness; the trainer runs an SFT run
   (``mode: sft``) on those rollouts; its last checkpoint becomes the policy;
2. on a fresh stack serving the policy with the configured engine (vLLM; the transformers
   reference engine if vLLM fails to start and ``fallback_engine`` is set): evaluation on the
   held-out split (before RL), the RL run, evaluation again (after RL);
3. the rewards before and after RL are printed.

Progress is drawn live (rollouts running/finished, step, reward, time remaining). Ctrl-C (or
SIGTERM) asks the trainer to stop the run (``StopRun``; the step in progress is abandoned, the
last checkpoint stays), stops the services, and exits 130; running the same command again
skips the phases already done (``<state>/phases.json``) and resumes the run from its last
checkpoint (``StartRun`` of an existing run id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click
import grpc
from google.protobuf import json_format, struct_pb2
from pydantic import Field, ValidationError
from rich.console import Console
from rich.table import Table

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_cli import local
from openforge_cli.eval import EvalReport, RolloutSpec, evaluate, report_table, split_tasks, stack_port_options
from openforge_cli.progress import RunProgress
from openforge_core.engine_names import ENGINE_NAMES
from openforge_core.rpc.client import open_channel, wait_serving
from openforge_core.run_config import RunConfig
from openforge_core.settings import SettingsSection

TRAINER_SERVICE = "openforge.trainer.v1.TrainerService"
PHASES_FILE = "phases.json"
#: The evaluations around the RL run: (key, label); recorded under :func:`eval_run_id`.
EVAL_PHASES = (("before", "before RL"), ("after", "after RL"))
#: Harnesses that take a ``harness_config`` (the orchestrator's ``harness.config_files``).
HARNESS_CONFIG_FILES = ("mini-swe-agent",)
#: Files of a trainer checkpoint that are not part of the model.
_TRAINER_ONLY = {"optimizer.pt", "trainer_state.json"}


class ModelSpec(SettingsSection):
    """The model the run starts from.

    Attributes:
        path: HF model directory (safetensors, config.json, tokenizer.json, chat template).
        init_tiny: Build a random-init tiny model of this size at ``path`` when it is missing
            (``openforge model init-tiny``; nothing is downloaded).
        seed: Seed of the tiny model.
    """

    path: Path
    init_tiny: Literal["1m", "10m", "50m"] | None = None
    seed: int = 0


class StackSpec(SettingsSection):
    """The local services.

    Attributes:
        engine: Inference engine of the policy (``vllm``; ``transformers`` is the reference).
        fallback_engine: Engine to use when ``engine`` does not start ("" = none).
        tasks_root: Folder of task sets (Harbor task folders per split).
        harness_dir: Where ``openforge harness install`` put the harnesses.
        max_concurrent: Rollouts running at once.
        serving_timeout_s: How long to wait for all services to report SERVING, seconds.
        env: More ``OPENFORGE_*`` settings for every service (see docs/configuration.md).
    """

    engine: str = "vllm"
    fallback_engine: str = "transformers"
    tasks_root: Path = Path("examples/tasks")
    harness_dir: Path = Path(".openforge/harnesses")
    max_concurrent: int = Field(default=2, ge=1)
    serving_timeout_s: float = Field(default=300.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class WarmStartSpec(SettingsSection):
    """SFT on demonstrations recorded through the real path before RL.

    Attributes:
        engine: The engine that produces the demonstrations (``scripted-oracle``).
        error_rate: The ``scripted-oracle`` demonstrator's error rate: the fraction of the
            demonstrations of each command that it gets wrong (within one; which ones is drawn
            with ``run.seed``); 0 = always right.
        error_kind: That error: ``plan`` (a demonstration follows another task's plan) or
            ``unwritten`` (a command that should write its output into a file only prints it).
        run: Run-config fields of the SFT run (``mode: sft`` is set), over ``run``'s.
    """

    engine: str = "scripted-oracle"
    error_rate: float = Field(default=0.0, ge=0, le=1)
    error_kind: Literal["plan", "unwritten"] = "plan"
    run: dict[str, Any] = Field(default_factory=dict)


class EvalSpec(SettingsSection):
    """Evaluation before and after RL on a held-out split.

    Attributes:
        split: Task split evaluated.
        tasks: Task ids (empty: the whole split).
        k: Rollouts per task; pass@1..k and pass^1..k are reported.
        pass_threshold: A rollout passes when its reward is >= this.
    """

    split: str = "test"
    tasks: list[str] = Field(default_factory=list)
    k: int = Field(default=1, ge=1)
    pass_threshold: float = 1.0


class TrainConfig(SettingsSection):
    """A train config (see the module docstring).

    Attributes:
        run_id: Run id of the RL run (the SFT run is ``<run_id>-sft``; evaluations
            ``<run_id>-eval-before`` / ``-after``).
        model: The starting model.
        harness: Harness of every rollout.
        harness_config: A settings file layered over the harness's own defaults (mini-swe-agent:
            ``-c mini.yaml -c FILE``), e.g. a shorter system prompt; None: the defaults.
        split: Task set trained on.
        tasks: Task ids of ``split`` (empty: all of it).
        stack: The local services.
        warm_start: SFT before RL (None: none).
        run: Trainer run-config fields of the RL run (``openforge_core.run_config.RunConfig``);
            ``model``, ``mode``, ``harness``, ``task_split`` and ``tasks`` are filled in.
        eval: Evaluation before and after RL (None: none).
    """

    run_id: str = Field(default="run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=96)
    model: ModelSpec
    harness: str = "mini-swe-agent"
    harness_config: Path | None = None
    split: str = "train"
    tasks: list[str] = Field(default_factory=list)
    stack: StackSpec = StackSpec()
    warm_start: WarmStartSpec | None = None
    run: dict[str, Any] = Field(default_factory=dict)
    eval: EvalSpec | None = EvalSpec()

    @property
    def tasks_root_path(self) -> Path:
        """Absolute task root."""
        return self.stack.tasks_root.resolve()

    def train_tasks(self) -> list[str]:
        """The task ids trained on."""
        return list(self.tasks) or split_tasks(self.tasks_root_path, self.split)

    def eval_tasks(self) -> list[str]:
        """The task ids evaluated (empty without ``eval``)."""
        if self.eval is None:
            return []
        return list(self.eval.tasks) or split_tasks(self.tasks_root_path, self.eval.split)

    def rollout_spec(self) -> RolloutSpec:
        """Harness, sampling and limits of the RL run, for evaluation rollouts."""
        r = self.run
        return RolloutSpec(
            harness=self.harness,
            model_name=str(r.get("model_name", "policy")),
            temperature=float(r.get("temperature", 1.0)),
            max_tokens=int(r.get("max_tokens", 0)),
            max_turns=int(r.get("max_turns", 0)),
            max_total_tokens=int(r.get("max_total_tokens", 0)),
            timeout_s=float(r.get("rollout_timeout_s", 0.0)),
        )

    def rl_run_config(self, model: Path) -> dict[str, Any]:
        """The RL run's trainer config."""
        return {
            **self.run,
            "model": str(model),
            "mode": "rl",
            "harness": self.harness,
            "task_split": self.split,
            "tasks": self.train_tasks(),
        }

    def sft_run_config(self, model: Path) -> dict[str, Any]:
        """The warm start's trainer config (SFT on the demonstrations that pass)."""
        assert self.warm_start is not None
        return {**self.rl_run_config(model), **self.warm_start.run, "mode": "sft"}


def eval_run_id(run_id: str, key: str) -> str:
    """Run id of the evaluation ``key`` (``before``/``after``) of RL run ``run_id``."""
    return f"{run_id}-eval-{key}"


def load_train_config(path: Path) -> TrainConfig:
    """Reads and validates a train config (``.yaml``/``.yml`` or JSON).

    Raises:
        click.ClickException: Unreadable, not a mapping, or invalid (every bad field named).
    """
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise click.ClickException(f"cannot parse {path}: {where}{exc.problem or exc.context}") from None
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise click.ClickException(f"{path} must hold a mapping of config fields")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise click.ClickException(f"{path} does not validate: {lines}") from None


def check_split(
    cfg: TrainConfig, split: str, tasks: list[str], *, fields: tuple[str, str] = ("split", "tasks")
) -> None:
    """Checks that ``split`` is a folder of the task root holding every task of ``tasks`` (or,
    with none given, at least one task).

    Raises:
        click.ClickException: One line naming the field (``fields``: the split's, the tasks').
    """
    root = cfg.tasks_root_path
    if not root.is_dir():
        raise click.ClickException(f"stack.tasks_root: no folder {root}")
    folder = root / split
    if not folder.is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise click.ClickException(f"{fields[0]}: no task split {split!r} in {root} (splits: {known})")
    for task in tasks:
        if not (folder / task / "task.toml").is_file():
            raise click.ClickException(f"{fields[1]}: no task {task!r} in split {split!r} ({folder / task}/task.toml)")
    if not tasks:
        split_tasks(root, split)


def check_run_config(field: str, data: dict[str, Any]) -> None:
    """Validates a trainer run config against the trainer's ``RunConfig``
    (:mod:`openforge_core.run_config`).

    Raises:
        click.ClickException: One line, every bad field named as ``<field>.<name>``.
    """
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = "; ".join(".".join([field, *(str(p) for p in e["loc"])]) + f": {e['msg']}" for e in exc.errors())
        raise click.ClickException(lines) from None


def check_config(cfg: TrainConfig) -> None:
    """Checks what the schema cannot before anything starts: the harness and engine names, the
    task root, splits and task ids, the model (or ``init_tiny``), and the trainer run configs of
    the RL run and the warm start (against the trainer's ``RunConfig``).

    Raises:
        click.ClickException: The first problem, one line naming the field and value.
    """
    check_names(cfg)
    check_split(cfg, cfg.split, cfg.tasks)
    if cfg.eval is not None:
        check_split(cfg, cfg.eval.split, cfg.eval.tasks, fields=("eval.split", "eval.tasks"))
    model = cfg.model.path.resolve()
    if not (model / "config.json").is_file() and cfg.model.init_tiny is None:
        raise click.ClickException(
            f"model.path: no model at {model} (config.json missing); set model.init_tiny to build one"
        )
    check_run_config("run", cfg.rl_run_config(model))
    if cfg.warm_start is not None:
        check_run_config("warm_start.run", cfg.sft_run_config(model))


def check_names(cfg: TrainConfig) -> None:
    """Checks the harness name and the engine names (:data:`openforge_core.engine_names.ENGINE_NAMES`).

    Raises:
        click.ClickException: One line naming the field and the unknown name.
    """
    from openforge_cli.harness import PINS

    harnesses = sorted([*PINS, "command"])
    if cfg.harness not in harnesses:
        raise click.ClickException(f"harness: unknown harness {cfg.harness!r} (one of {harnesses})")
    engines = [
        ("stack.engine", cfg.stack.engine),
        ("stack.fallback_engine", cfg.stack.fallback_engine),
        ("warm_start.engine", cfg.warm_start.engine if cfg.warm_start else ""),
    ]
    for field, name in engines:
        if name and name not in ENGINE_NAMES:
            raise click.ClickException(f"{field}: unknown engine {name!r} (one of {list(ENGINE_NAMES)})")
    if cfg.harness_config is not None:
        if cfg.harness not in HARNESS_CONFIG_FILES:
            raise click.ClickException(
                f"harness_config: {cfg.harness} takes no settings file (only {', '.join(HARNESS_CONFIG_FILES)})"
            )
        if not cfg.harness_config.is_file():
            raise click.ClickException(f"harness_config: {cfg.harness_config} is not a file")


def check_installed(cfg: TrainConfig) -> None:
    """Checks that the config's harness is installed where the local orchestrator looks for it.

    Raises:
        click.ClickException: Not installed; the message gives the install command.
    """
    from openforge_cli.harness import MANIFEST

    if cfg.harness != "command" and not (cfg.stack.harness_dir / cfg.harness / MANIFEST).is_file():
        raise click.ClickException(
            f"harness: {cfg.harness} is not installed in {cfg.stack.harness_dir}: "
            f"run `openforge harness install {cfg.harness}`"
        )


# ---- the local stack -------------------------------------------------------------------------


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


# ---- phases ----------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """How a run ended.

    Attributes:
        state: ``RUN_STATE_*`` name.
        step: Last completed step.
        policy_version: Policy version after the run.
        checkpoint_uri: Last checkpoint directory.
        error: Why it failed.
        metrics: The last step's metrics.
    """

    state: str
    step: int
    policy_version: int
    checkpoint_uri: str
    error: str
    metrics: dict[str, float]


async def drive_run(
    addresses: dict[str, str],
    run_id: str,
    config: dict[str, Any],
    *,
    title: str,
    stop: StopSignal,
    console: Console | None = None,
    failure: Callable[[], str] | None = None,
    trainer_back_s: float = 300.0,
) -> RunOutcome:
    """Starts (or resumes) a run on the trainer and shows its progress until it ends.

    When ``stop`` is set the run is asked to stop (``StopRun``) and this waits for its loop to
    end; the run stays resumable. When the trainer goes away mid-run (its process died and a
    supervisor starts it again), this waits up to ``trainer_back_s`` for it to serve again and
    resumes the run from its last checkpoint (``StartRun`` on the same run).

    Args:
        failure: Polled every second: a non-empty answer (a service given up by the
            supervisor) ends the run with that message.

    Raises:
        click.ClickException: The trainer refused the config (the message lists the fields),
            ``failure`` answered, or the trainer did not come back.
    """
    steps = int(config.get("steps", 1))
    trainer_ch = open_channel(
        addresses["trainer"], service=TRAINER_SERVICE, idempotent_methods=["StartRun", "GetRun", "StopRun"]
    )
    orch_ch = open_channel(addresses["orchestrator"])
    try:
        trainer = trainer_pb2_grpc.TrainerServiceStub(trainer_ch)
        orch = orchestrator_pb2_grpc.OrchestratorServiceStub(orch_ch)

        async def start() -> trainer_pb2.StartRunResponse:
            try:
                return await trainer.StartRun(
                    trainer_pb2.StartRunRequest(
                        request_id=f"{run_id}/{uuid.uuid4().hex[:8]}",
                        run_id=run_id,
                        config=json_format.ParseDict(config, struct_pb2.Struct()),
                    )
                )
            except grpc.aio.AioRpcError as exc:
                raise click.ClickException(f"the trainer refused run {run_id}: {exc.details()}") from exc

        started = await start()
        with RunProgress(title, steps=steps, console=console) as progress:
            if started.run.step:
                progress.resumed(int(started.run.step))

            async def rollouts() -> None:
                call = orch.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id=run_id), timeout=None)
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                    async for ev in call:
                        progress.rollout(ev.rollout)

            async def metrics() -> None:
                seen = int(started.run.step)
                while True:
                    call = trainer.WatchMetrics(
                        trainer_pb2.WatchMetricsRequest(run_id=run_id, from_step=seen + 1), timeout=None
                    )
                    try:
                        async for ev in call:
                            seen = max(seen, int(ev.step))
                            progress.step(int(ev.step), dict(ev.metrics))
                        return
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.UNAVAILABLE:
                            raise
                    # the trainer went away: once it serves again, the run resumes from its checkpoint
                    progress.console.print(f"{title}: the trainer is unreachable; waiting for it to come back ...")
                    try:
                        await wait_serving(addresses["trainer"], timeout_s=trainer_back_s)
                    except TimeoutError:
                        raise click.ClickException(
                            f"{title}: the trainer did not come back within {trainer_back_s:g}s; "
                            "run the same command again to resume from the last checkpoint"
                        ) from None
                    resumed = await start()
                    progress.console.print(f"{title}: {run_id} resumed after step {resumed.run.step}")

            async def given_up() -> str:
                while True:  # polled: the supervisor runs in a thread of its own
                    why = failure() if failure is not None else ""
                    if why:
                        return why
                    await asyncio.sleep(1.0)

            watch_r = asyncio.create_task(rollouts())
            watch_m = asyncio.create_task(metrics())
            stopper = asyncio.create_task(stop.wait())
            watch_f = asyncio.create_task(given_up())
            try:
                await asyncio.wait({watch_m, stopper, watch_f}, return_when=asyncio.FIRST_COMPLETED)
                if watch_f.done() and not watch_m.done():
                    raise click.ClickException(
                        f"{title}: {watch_f.result()}; run the same command again to resume from the last checkpoint"
                    )
                if stop.is_set() and not watch_m.done():
                    progress.console.print(f"{title}: stopping {run_id} (it stays resumable) ...")
                    try:
                        await trainer.StopRun(trainer_pb2.StopRunRequest(run_id=run_id))
                    except grpc.aio.AioRpcError:  # the trainer is gone: its last checkpoint stands
                        progress.console.print(f"{title}: the trainer is unreachable; stopped at its last checkpoint")
                        raise SystemExit(130) from None
                    await asyncio.wait_for(watch_m, timeout=600)
                else:
                    await watch_m
            finally:
                for t in (watch_r, stopper, watch_f, watch_m):
                    t.cancel()
                await asyncio.gather(watch_r, stopper, watch_f, watch_m, return_exceptions=True)
            last = progress.last_metrics
        run = (await trainer.GetRun(trainer_pb2.GetRunRequest(run_id=run_id))).run
        return RunOutcome(
            state=trainer_pb2.RunState.Name(run.state),
            step=int(run.step),
            policy_version=int(run.policy_version),
            checkpoint_uri=run.checkpoint_uri,
            error=run.error,
            metrics=last,
        )
    finally:
        await trainer_ch.close()
        await orch_ch.close()


class Phases:
    """What is done already (``<state>/phases.json``), so a rerun continues where it stopped."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / PHASES_FILE
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read {self.path}: {exc}; run with --fresh to start over") from None
        if not isinstance(self.data, dict):
            raise click.ClickException(f"{self.path} is not a phase record; run with --fresh to start over")

    def get(self, key: str) -> Any:
        """A recorded value, or None."""
        return self.data.get(key)

    def set(self, key: str, value: Any) -> None:
        """Records a value (written at once)."""
        self.data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(PHASES_FILE + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)


def ensure_model(spec: ModelSpec, console: Console) -> Path:
    """The model directory, built with ``init-tiny`` first if configured and missing.

    Raises:
        click.ClickException: It is missing and cannot be built.
    """
    path = spec.path.resolve()
    if (path / "config.json").is_file():
        return path
    if spec.init_tiny is None:
        raise click.ClickException(f"no model at {path} (config.json missing); set model.init_tiny to build one")
    console.print(f"building a random-init {spec.init_tiny} model at {path} (nothing is downloaded) ...")
    import subprocess

    cmd = [sys.executable, "-m", "openforge_inference.tiny_model", "--size", spec.init_tiny]
    result = subprocess.run([*cmd, "--out", str(path), "--seed", str(spec.seed)], check=False)
    if result.returncode != 0:
        raise click.ClickException(f"building the tiny model failed (exit {result.returncode})")
    return path


def export_model(checkpoint: Path, out: Path) -> Path:
    """Copies a trainer checkpoint's model files (not the optimizer state) to ``out``."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in checkpoint.iterdir():
        if f.is_file() and f.name not in _TRAINER_ONLY:
            shutil.copy2(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class StopSignal:
    """Whether Ctrl-C/SIGTERM was seen, awaitable in each event loop in turn (one per phase: an
    ``asyncio.Event`` belongs to the loop that first waits on it, so each ``asyncio.run`` binds a
    new one)."""

    def __init__(self) -> None:
        self.requested = False
        self._event: asyncio.Event | None = None

    def bind(self) -> None:
        """Makes a new event for the running loop (set already if a stop was requested)."""
        self._event = asyncio.Event()
        if self.requested:
            self._event.set()

    def set(self) -> None:
        """Requests the stop."""
        self.requested = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self.requested

    async def wait(self) -> None:
        """Returns once a stop is requested (call :meth:`bind` in this loop first)."""
        if self._event is None:
            self.bind()
        assert self._event is not None
        await self._event.wait()


def _own_command() -> str:
    """How this CLI was invoked (``.venv/bin/openforge`` from ``make``), to print commands that work
    as printed; ``openforge`` when that cannot be told."""
    exe = Path(sys.argv[0])
    return str(exe) if exe.name == "openforge" else "openforge"


#: The signals that stop a run cleanly (resumable): Ctrl-C, ``kill``, the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _run_async(coro_fn: Any, stop: StopSignal | None = None) -> Any:
    """Runs a coroutine with SIGINT/SIGTERM/SIGHUP (a closed terminal) setting ``stop`` instead
    of raising: the run stops at a step boundary, resumable, and the services are stopped."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if stop is not None:
            stop.bind()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, stop.set)
        try:
            return await coro_fn()
        finally:
            if stop is not None:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                interrupt_on_stop_signals()  # removing a loop's handler resets the default action

    return asyncio.run(main())


def interrupt_on_stop_signals() -> None:
    """Outside a phase's event loop, every stop signal raises ``KeyboardInterrupt`` as Ctrl-C
    does, so the paths that stop the services run (the default action of SIGHUP and SIGTERM
    would end the process and leave them running)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler)


async def _unless_stopped(coro: Coroutine[Any, Any, None], stop: StopSignal) -> None:
    """Runs ``coro`` unless ``stop`` is set first (then it is cancelled; nothing is recorded)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return
    task.result()


def _check_outcome(console: Console, title: str, outcome: RunOutcome, stopped: bool) -> None:
    if outcome.state == "RUN_STATE_FAILED":
        raise click.ClickException(f"{title} failed: {outcome.error} (trainer log in the state folder's logs/)")
    if stopped or outcome.state != "RUN_STATE_COMPLETED":
        console.print(
            f"[yellow]{title} stopped after step {outcome.step} ({outcome.state}); "
            "run the same command again to resume it from its last checkpoint"
        )
        raise SystemExit(130)


def comparison_table(before: EvalReport | None, after: EvalReport | None, split: str) -> Table:
    """Reward, pass@k and pass^k before and after RL, one row each."""
    table = Table(title=f"held-out split {split!r}: before and after RL")
    table.add_column("policy")
    reports = [(name, r) for name, r in (("before RL (after warm start)", before), ("after RL", after)) if r]
    keys = list(reports[0][1].summary()) if reports else []
    for key in keys:
        table.add_column(key, justify="right")
    for name, r in reports:
        s = r.summary()
        table.add_row(name, *(f"{s[k]:.3f}" for k in keys))
    return table


def _report_from_json(data: dict[str, Any], ks: tuple[int, ...]) -> EvalReport:
    from openforge_cli.eval import TaskResult

    tasks = tuple(
        TaskResult(
            task_id=tid,
            rewards=tuple(v["rewards"]),
            statuses=tuple(v["statuses"]),
            passed=sum(1 for x in v["rewards"] if x >= data.get("pass_threshold", 1.0)),
        )
        for tid, v in data["tasks"].items()
    )
    return EvalReport(data["run_id"], data["task_set"], ks, tasks, float(data.get("seconds", 0.0)))


def run_train(cfg: TrainConfig, stack: LocalStack, console: Console) -> dict[str, Any]:
    """Runs every phase not yet done; returns the phases record.

    Raises:
        SystemExit: 130 when stopped by Ctrl-C/SIGTERM (resumable).
        click.ClickException: A run failed or the stack did not start.
    """
    t_start = time.monotonic()
    phases = Phases(stack.state_dir)
    if stack.attached and cfg.warm_start is not None and phases.get("warm_start") is None:
        raise click.ClickException(
            "the warm start switches the inference engine, so it needs its own services: "
            "run without --trainer/--orchestrator, or remove warm_start from the config"
        )
    model = ensure_model(cfg.model, console)
    cfg.train_tasks()  # fail early on an empty split
    stop = StopSignal()

    if cfg.warm_start is not None and phases.get("warm_start") is None:
        sft_id = f"{cfg.run_id}-sft"
        sft_cfg = cfg.sft_run_config(model)
        with stack.running(cfg, engine=cfg.warm_start.engine, model=model, console=console):
            outcome = _run_async(
                lambda: drive_run(
                    stack.addresses,
                    sft_id,
                    sft_cfg,
                    title="warm start (SFT)",
                    stop=stop,
                    console=console,
                    failure=stack.failure,
                ),
                stop,
            )
        _check_outcome(console, "warm start", outcome, stop.is_set())
        policy = export_model(Path(outcome.checkpoint_uri), stack.state_dir / "models" / "warm-start")
        phases.set(
            "warm_start",
            {"run_id": sft_id, "checkpoint": outcome.checkpoint_uri, "model": str(policy), "metrics": outcome.metrics},
        )
    policy = Path(phases.get("warm_start")["model"]) if phases.get("warm_start") else model

    ks = tuple(range(1, cfg.eval.k + 1)) if cfg.eval else ()
    spec = cfg.rollout_spec()
    reports: dict[str, EvalReport] = {}

    async def do_eval(key: str, min_version: int) -> None:
        assert cfg.eval is not None
        rep = await evaluate(
            stack.addresses["orchestrator"],
            run_id=eval_run_id(cfg.run_id, key),
            task_set=cfg.eval.split,
            tasks=cfg.eval_tasks(),
            n=cfg.eval.k,
            ks=ks,
            spec=spec,
            pass_threshold=cfg.eval.pass_threshold,
            title=f"eval {key} RL",
            console=console,
        )
        data = rep.to_json()
        data["pass_threshold"] = cfg.eval.pass_threshold
        data["policy_version"] = min_version
        phases.set(f"eval_{key}", data)
        reports[key] = rep
        console.print(report_table(rep, title=f"{cfg.eval.split}: {key} RL"))

    rl_done = phases.get("rl") is not None and phases.get("rl").get("state") == "RUN_STATE_COMPLETED"
    need_after = cfg.eval is not None and phases.get("eval_after") is None
    if not rl_done or need_after:
        # RL done (only the evaluation after it is missing): serve the RL run's last checkpoint.
        serve = Path(phases.get("rl")["checkpoint_uri"]) if rl_done else policy
        with stack.running(cfg, engine=cfg.stack.engine, model=serve, console=console):
            phases.set("engine", stack.engine)

            async def rl_phase() -> RunOutcome | None:
                if cfg.eval is not None and phases.get("eval_before") is None:
                    await _unless_stopped(do_eval("before", 0), stop)
                if stop.is_set():
                    return None
                outcome: RunOutcome | None = None
                if not rl_done:
                    outcome = await drive_run(
                        stack.addresses,
                        cfg.run_id,
                        cfg.rl_run_config(policy),
                        title="RL",
                        stop=stop,
                        console=console,
                        failure=stack.failure,
                    )
                    if outcome.state != "RUN_STATE_COMPLETED" or stop.is_set():
                        return outcome
                    phases.set("rl", outcome.__dict__)
                if cfg.eval is not None and phases.get("eval_after") is None:
                    await _unless_stopped(do_eval("after", int(phases.get("rl")["policy_version"])), stop)
                return outcome

            outcome = _run_async(rl_phase, stop)
        if outcome is not None:
            _check_outcome(console, "RL", outcome, stop.is_set())
        elif stop.is_set():
            console.print("[yellow]stopped; run the same command again to continue")
            raise SystemExit(130)

    if cfg.eval is not None:
        before = reports.get("before") or _report_from_json(phases.get("eval_before"), ks)
        after = reports.get("after") or _report_from_json(phases.get("eval_after"), ks)
        console.print(comparison_table(before, after, cfg.eval.split))
        summary = {"before": before.summary(), "after": after.summary()}
        phases.set("summary", summary)
        console.print(
            f"reward on held-out {cfg.eval.split!r} before RL: {before.reward_mean:.3f}, "
            f"after RL: {after.reward_mean:.3f}"
        )
    console.print(f"done in {time.monotonic() - t_start:.0f}s; state in {stack.state_dir}")
    if (stack.state_dir / "trajectories.db").is_file():  # the services' store (not when attached to others)
        console.print(
            f"to see the run: {_own_command()} dash --state-dir {stack.state_dir}",
            markup=False,
            highlight=False,
            soft_wrap=True,  # one line, so it can be copied
        )
    return phases.data


@click.command("train")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Logs, store, checkpoints and phases of the run (default: .openforge/train/<run_id>).",
)
@stack_port_options(base_port=50151, nats_port=4332, http_port=8180)
@click.option("--fresh", is_flag=True, help="Delete the state folder first (start over instead of resuming).")
@click.option("--trainer", default="", help="Attach to this trainer (host:port) instead of starting services.")
@click.option("--orchestrator", default="", help="With --trainer: the orchestrator of the running services.")
def train_command(
    config: Path,
    state_dir: Path | None,
    base_port: int,
    nats_port: int,
    http_port: int,
    fresh: bool,
    trainer: str,
    orchestrator: str,
) -> None:
    """Run a whole training run from CONFIG: warm start, evaluation, RL, evaluation.

    Starts NATS and the five services as local processes for each phase (or uses running ones
    given --trainer and --orchestrator; their inference must serve the config's model), shows
    live progress, and prints the held-out reward before and after RL. Ctrl-C stops cleanly;
    running the same command again resumes from the last checkpoint.
    """
    cfg = load_train_config(config)
    check_config(cfg)
    if not (trainer or orchestrator):  # the orchestrator started here runs the harness from harness_dir
        check_installed(cfg)
    state = state_dir or Path(".openforge") / "train" / cfg.run_id
    if fresh and state.exists():
        if local.UpState.load(state) is not None:
            local.down(state)
        shutil.rmtree(state)
    console = Console()
    stack = LocalStack(state, base_port=base_port, nats_port=nats_port, http_port=http_port)
    if trainer or orchestrator:
        if not (trainer and orchestrator):
            raise click.UsageError("--trainer and --orchestrator go together")
        stack.attach(trainer, orchestrator)
    interrupt_on_stop_signals()
    run_train(cfg, stack, console)
