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

The config is checked before anything starts (:func:`openforge_cli.train_config.check_config`):
unknown or misspelled fields, bad values, unknown harness or engine names, missing splits or task
ids, a missing model without ``init_tiny``, and the trainer run configs (``run``,
``warm_start.run``) each give one line naming the field.

The modules of the command: :mod:`.train_config` (the config and its checks), :mod:`.stack` (the
local stack), :mod:`.run_driver` (one trainer run to its end), :mod:`.stop_signals`; this one runs
the phases.

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

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from openforge_cli import local
from openforge_cli.eval import EvalReport, evaluate, report_table, stack_port_options
from openforge_cli.run_driver import RunOutcome, drive_run
from openforge_cli.stack import LocalStack
from openforge_cli.stop_signals import StopSignal, interrupt_on_stop_signals, own_command, run_async, unless_stopped
from openforge_cli.train_config import (
    ModelSpec,
    TrainConfig,
    check_config,
    check_installed,
    eval_run_id,
    load_train_config,
)

PHASES_FILE = "phases.json"
#: Files of a trainer checkpoint that are not part of the model.
_TRAINER_ONLY = {"optimizer.pt", "trainer_state.json"}


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
            outcome = run_async(
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
                    await unless_stopped(do_eval("before", 0), stop)
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
                    await unless_stopped(do_eval("after", int(phases.get("rl")["policy_version"])), stop)
                return outcome

            outcome = run_async(rl_phase, stop)
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
            f"to see the run: {own_command()} dash --state-dir {stack.state_dir}",
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
