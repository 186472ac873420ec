"""``openforge eval``: pass@k and pass^k of a checkpoint on a task split.

Each task of the split gets one group of ``n`` rollouts (``n`` >= every k asked for) under an
evaluation run id, through the same path as training rollouts (orchestrator → sandbox → harness →
proxy → inference → verifier); the trajectory store records them, so the per-task results stay
queryable (``ListRollouts`` by run id). A rollout passes when its reward is >= the threshold.

With ``c`` passing rollouts out of ``n`` for a task (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", the unbiased estimator; and τ-bench's pass^k, Yao et al. 2024):

* pass@k = 1 - C(n - c, k) / C(n, k): the chance that at least one of k rollouts passes;
* pass^k = C(c, k) / C(n, k): the chance that all k pass (reliability).

Both are averaged over tasks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import grpc
from google.protobuf.duration_pb2 import Duration
from rich.console import Console
from rich.table import Table

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_cli.progress import TERMINAL, RunProgress
from openforge_core.passk import check_counts, pass_at_k, pass_hat_k
from openforge_core.rpc.client import open_channel

ORCHESTRATOR_SERVICE = "openforge.orchestrator.v1.OrchestratorService"


@dataclass(frozen=True)
class TaskResult:
    """One task's evaluation.

    Attributes:
        task_id: The task.
        rewards: Reward of each rollout (0.0 where the verifier gave none), in group order.
        statuses: Final status name of each rollout (``SUCCEEDED``, ``TIMED_OUT``, ...).
        passed: Rollouts with reward >= the threshold.
    """

    task_id: str
    rewards: tuple[float, ...]
    statuses: tuple[str, ...]
    passed: int

    @property
    def n(self) -> int:
        """Rollouts of the task."""
        return len(self.rewards)


@dataclass(frozen=True)
class EvalReport:
    """An evaluation of one policy on one task split.

    Attributes:
        run_id: Run id the rollouts are recorded under.
        task_set: The split.
        ks: The k values reported.
        tasks: Per-task results, in task order.
        seconds: Wall time of the evaluation.
        rollouts: The terminal rollouts, in submission order.
    """

    run_id: str
    task_set: str
    ks: tuple[int, ...]
    tasks: tuple[TaskResult, ...]
    seconds: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    rollouts: tuple[common_pb2.Rollout, ...] = ()

    @property
    def reward_mean(self) -> float:
        """Mean reward over every rollout (0.0 when there is none)."""
        rewards = [r for t in self.tasks for r in t.rewards]
        return sum(rewards) / len(rewards) if rewards else 0.0

    def pass_at(self, k: int) -> float:
        """pass@k averaged over tasks."""
        return _mean([pass_at_k(t.n, t.passed, k) for t in self.tasks])

    def pass_hat(self, k: int) -> float:
        """pass^k averaged over tasks."""
        return _mean([pass_hat_k(t.n, t.passed, k) for t in self.tasks])

    def summary(self) -> dict[str, float]:
        """``reward/mean``, ``pass@k`` and ``pass^k`` for every k."""
        out = {"reward/mean": self.reward_mean}
        for k in self.ks:
            out[f"pass@{k}"] = self.pass_at(k)
            out[f"pass^{k}"] = self.pass_hat(k)
        return out

    def to_json(self) -> dict[str, object]:
        """A JSON-ready record (summary and per-task rewards)."""
        return {
            "run_id": self.run_id,
            "task_set": self.task_set,
            "summary": self.summary(),
            "tasks": {t.task_id: {"rewards": list(t.rewards), "statuses": list(t.statuses)} for t in self.tasks},
            "seconds": self.seconds,
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def report_table(report: EvalReport, title: str = "") -> Table:
    """A ``rich`` table: one row per task (rewards, passes, pass@k, pass^k), then the means."""
    table = Table(title=title or f"evaluation {report.run_id} on {report.task_set}")
    table.add_column("task")
    table.add_column("rewards")
    table.add_column("passed", justify="right")
    for k in report.ks:
        table.add_column(f"pass@{k}", justify="right")
        table.add_column(f"pass^{k}", justify="right")
    for t in report.tasks:
        cells = [t.task_id, " ".join(f"{r:.2f}" for r in t.rewards), f"{t.passed}/{t.n}"]
        for k in report.ks:
            cells += [f"{pass_at_k(t.n, t.passed, k):.2f}", f"{pass_hat_k(t.n, t.passed, k):.2f}"]
        table.add_row(*cells)
    means = ["mean", f"{report.reward_mean:.3f}", ""]
    for k in report.ks:
        means += [f"{report.pass_at(k):.3f}", f"{report.pass_hat(k):.3f}"]
    table.add_row(*means, style="bold")
    return table


@dataclass(frozen=True)
class RolloutSpec:
    """How rollouts are requested (the run's harness, sampling and limits).

    Attributes:
        harness: Harness name.
        model_name: Model name written into the harness's config.
        temperature: Sampling temperature the proxy enforces.
        max_tokens: Most tokens per model call (0 = the proxy's default).
        max_turns: Most model calls per rollout (0 = no limit).
        max_total_tokens: Most tokens per rollout (0 = no limit).
        timeout_s: Rollout time limit, seconds (0 = the task's own).
        seed: Sampling seed of the submission (the orchestrator derives one per rollout from
            it, the proxy one per call); None = unseeded.
    """

    harness: str
    model_name: str = "policy"
    temperature: float = 1.0
    max_tokens: int = 0
    max_turns: int = 0
    max_total_tokens: int = 0
    timeout_s: float = 0.0
    seed: int | None = None


async def run_rollouts(
    orchestrator: str,
    *,
    request_id: str,
    run_id: str,
    task_set: str,
    tasks: Sequence[str],
    group_size: int,
    spec: RolloutSpec,
    on_update: Callable[[common_pb2.Rollout], None] | None = None,
    min_policy_version: int = 0,
) -> list[common_pb2.Rollout]:
    """Submits one group per task and waits until every rollout is terminal.

    Args:
        orchestrator: ``host:port`` of the orchestrator.
        request_id: Idempotency key of the submission (a retry returns the same rollouts).
        run_id: Run id the rollouts are recorded under.
        task_set: Task set (a folder under the orchestrator's task root).
        tasks: Task ids.
        group_size: Rollouts per task.
        spec: Harness, sampling and limits.
        on_update: Called with every rollout update (for progress).
        min_policy_version: Calls need at least this policy version.

    Returns:
        The terminal rollouts, in submission order.

    Raises:
        grpc.aio.AioRpcError: The orchestrator refused the submission (e.g. INVALID_ARGUMENT
            for an unknown task) or went away.
    """
    async with open_channel(
        orchestrator, service=ORCHESTRATOR_SERVICE, idempotent_methods=["SubmitRollouts"], default_timeout_s=60
    ) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        req = orchestrator_pb2.SubmitRolloutsRequest(
            request_id=request_id,
            run_id=run_id,
            tasks=[orchestrator_pb2.TaskRef(task_id=t, task_set=task_set) for t in tasks],
            group_size=group_size,
            harness=spec.harness,
            model_name=spec.model_name,
            min_policy_version=min_policy_version,
            sampling=common_pb2.SamplingParams(temperature=spec.temperature, max_tokens=spec.max_tokens),
        )
        if spec.seed is not None:
            req.sampling.seed = spec.seed
        if spec.max_turns or spec.max_total_tokens:
            req.limits.CopyFrom(
                orchestrator_pb2.RolloutLimits(max_turns=spec.max_turns, max_total_tokens=spec.max_total_tokens)
            )
        if spec.timeout_s > 0:
            req.timeout.CopyFrom(Duration(seconds=int(spec.timeout_s)))
        resp = await stub.SubmitRollouts(req)
        ids = [r.rollout_id for r in resp.rollouts]
        done: dict[str, common_pb2.Rollout] = {}
        call = stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id=run_id), timeout=None)
        try:
            async for ev in call:
                r = ev.rollout
                if r.rollout_id not in ids:
                    continue
                if on_update is not None:
                    on_update(r)
                if r.status in TERMINAL:
                    done[r.rollout_id] = r
                    if len(done) == len(ids):
                        break
        finally:
            call.cancel()
        return [done[i] for i in ids]


def summarize(
    run_id: str,
    task_set: str,
    tasks: Sequence[str],
    rollouts: Sequence[common_pb2.Rollout],
    ks: Sequence[int],
    pass_threshold: float,
) -> EvalReport:
    """Groups terminal rollouts by task into an :class:`EvalReport` (tasks in the given order)."""
    by_task: dict[str, list[common_pb2.Rollout]] = {t: [] for t in tasks}
    for r in rollouts:
        by_task.setdefault(r.task_id, []).append(r)
    results = []
    for task_id, rs in by_task.items():
        rs.sort(key=lambda r: r.group_index)
        rewards = tuple(r.reward if r.HasField("reward") else 0.0 for r in rs)
        results.append(
            TaskResult(
                task_id=task_id,
                rewards=rewards,
                statuses=tuple(common_pb2.RolloutStatus.Name(r.status).removeprefix("ROLLOUT_STATUS_") for r in rs),
                passed=sum(1 for x in rewards if x >= pass_threshold),
            )
        )
    return EvalReport(run_id=run_id, task_set=task_set, ks=tuple(ks), tasks=tuple(results), rollouts=tuple(rollouts))


async def evaluate(
    orchestrator: str,
    *,
    run_id: str,
    task_set: str,
    tasks: Sequence[str],
    n: int,
    ks: Sequence[int],
    spec: RolloutSpec,
    pass_threshold: float = 1.0,
    title: str = "eval",
    console: Console | None = None,
    request_id: str = "",
) -> EvalReport:
    """Runs ``n`` rollouts per task under ``run_id`` with live progress; returns the report.
    ``request_id``: the submission's idempotency key (default ``<run_id>/eval``).

    Raises:
        ValueError: A k is outside [1, n], or there are no tasks.
    """
    if not tasks:
        raise ValueError(f"no tasks to evaluate in {task_set!r}")
    for k in ks:
        check_counts(n, 0, k)
    started = time.monotonic()
    with RunProgress(title, console=console) as progress:
        rollouts = await run_rollouts(
            orchestrator,
            request_id=request_id or f"{run_id}/eval",
            run_id=run_id,
            task_set=task_set,
            tasks=tasks,
            group_size=n,
            spec=spec,
            on_update=progress.rollout,
        )
    report = summarize(run_id, task_set, tasks, rollouts, ks, pass_threshold)
    return dataclasses.replace(report, seconds=time.monotonic() - started)


def split_tasks(tasks_root: Path, split: str) -> list[str]:
    """Task ids of a split: the sub-folders of ``<tasks_root>/<split>`` holding ``task.toml``.

    Raises:
        click.ClickException: The split folder does not exist or holds no task.
    """
    folder = tasks_root / split
    tasks = sorted(p.parent.name for p in folder.glob("*/task.toml"))
    if not tasks:
        raise click.ClickException(f"no tasks in {folder} (expected <task>/task.toml folders)")
    return tasks


_F = TypeVar("_F", bound=Callable[..., Any])


def stack_port_options(*, base_port: int, nats_port: int, http_port: int) -> Callable[[_F], _F]:
    """``--base-port``, ``--nats-port`` and ``--http-port`` of a command that starts its own stack,
    with that command's defaults (each command has its own, so they can run side by side)."""

    def decorate(f: _F) -> _F:
        for name, default, top, help_ in (
            ("--http-port", http_port, 65535, "The proxy's port for harnesses."),
            ("--nats-port", nats_port, 65535, "Port of the embedded NATS server."),
            ("--base-port", base_port, 65530, "gRPC port of the first service."),
        ):
            f = click.option(name, default=default, type=click.IntRange(1, top), show_default=True, help=help_)(f)
        return f

    return decorate


@click.command("eval")
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="HF model directory to evaluate (a run's step_N checkpoint or any model).",
)
@click.option("--split", default="test", show_default=True, help="Task split (a folder under the task root).")
@click.option("-k", "k", default=1, show_default=True, help="Rollouts per task; pass@1..k and pass^1..k are reported.")
@click.option(
    "--tasks",
    "task_ids",
    default="",
    help="Comma-separated task ids (default: the config's eval.tasks when --split is its eval.split, else the "
    "whole split).",
)
@click.option(
    "--harness",
    "harness_names",
    default="",
    help="Comma-separated harnesses to compare on the same tasks, one after another under one run id "
    "(default: the config's harness); prints one row per harness with what its rollouts cost.",
)
@click.option(
    "--engine",
    default="",
    help="Engine serving CHECKPOINT (default: the config's stack.engine); `scripted-oracle` replays each "
    "task's oracle solution (no demonstrator errors), a reference for what a harness can reach.",
)
@click.option("--run-id", default="", help="Run id of the evaluation rollouts (default: derived from the time).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None, help="Default: .openforge/eval/<run id>.")
@stack_port_options(base_port=50251, nats_port=4342, http_port=8280)
@click.option("--orchestrator", default="", help="Attach to this orchestrator (host:port) instead of starting a stack.")
@click.option(
    "--store",
    default="",
    help="With --orchestrator: the trajectory store (host:port) the comparison reads each rollout's turns, "
    "tokens and samples from (without it those columns are empty).",
)
def eval_command(
    config: Path,
    checkpoint: Path,
    split: str,
    k: int,
    task_ids: str,
    harness_names: str,
    engine: str,
    run_id: str,
    state_dir: Path | None,
    base_port: int,
    nats_port: int,
    http_port: int,
    orchestrator: str,
    store: str,
) -> None:
    """pass@k and pass^k of CHECKPOINT on a task split, with the run config's harness and limits.

    Starts NATS and the five services serving CHECKPOINT (or attaches to a running
    orchestrator whose inference already serves it), runs k rollouts per task under an
    evaluation run id (recorded in the trajectory store), prints a per-task table and writes
    it as JSON to <state dir>/eval.json. With --harness naming several harnesses, each runs the
    same tasks in turn and one table compares them (pass@k, pass^k, turns, tokens, samples and
    seconds per rollout; ``openforge_cli.compare``).
    """
    import json

    from openforge_cli.compare import HarnessResult, harness_table, read_costs
    from openforge_cli.stack import LocalStack
    from openforge_cli.train_config import (
        check_installed,
        check_names,
        check_run_config,
        check_split,
        load_train_config,
    )

    cfg = load_train_config(config)
    if engine:
        # the engine asked for or nothing (no fallback); the oracle with no imperfect demonstrator
        stack_spec = cfg.stack.model_copy(update={"engine": engine, "fallback_engine": ""})
        cfg = cfg.model_copy(update={"stack": stack_spec, "warm_start": None})
    harnesses = list(dict.fromkeys(h.strip() for h in harness_names.split(",") if h.strip())) or [cfg.harness]
    if store and not orchestrator:
        raise click.BadParameter("only with --orchestrator (a started stack's store is read)", param_hint="--store")
    if k < 1:
        raise click.BadParameter("must be >= 1", param_hint="-k")
    if not (checkpoint / "config.json").is_file():
        raise click.BadParameter(f"no model in {checkpoint} (config.json missing)", param_hint="--checkpoint")
    tasks = [t.strip() for t in task_ids.split(",") if t.strip()]
    check_split(cfg, split, tasks, fields=("--split", "--tasks"))
    if not tasks and cfg.eval is not None and split == cfg.eval.split:
        tasks = list(cfg.eval.tasks)
    tasks = tasks or split_tasks(cfg.tasks_root_path, split)
    model = str(checkpoint.resolve())
    each = [
        cfg.model_copy(update={"harness": name, "harness_config": cfg.harness_config if name == cfg.harness else None})
        for name in harnesses
    ]
    for one in each:  # every name first, then what is installed
        check_names(one)
    for one in each:
        if not orchestrator:
            check_installed(one)
        check_run_config(
            "run", {**cfg.run, "model": model, "harness": one.harness, "task_split": split, "tasks": tasks}
        )
    run_id = run_id or f"{cfg.run_id}-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    state = state_dir or Path(".openforge") / "eval" / run_id
    spec = cfg.rollout_spec()
    ks = tuple(range(1, k + 1))
    compare = len(harnesses) > 1

    console = Console()

    async def go(address: str, store_address: str) -> list[HarnessResult]:
        results = []
        for name in harnesses:
            report = await evaluate(
                address,
                run_id=run_id,
                task_set=split,
                tasks=tasks,
                n=k,
                ks=ks,
                spec=dataclasses.replace(spec, harness=name),
                pass_threshold=cfg.eval.pass_threshold if cfg.eval else 1.0,
                title=f"eval {name}" if compare else "eval",
                request_id=f"{run_id}/eval/{name}" if compare else "",
            )
            costs = {}
            if compare and store_address:
                try:
                    costs = await read_costs(store_address, [r.rollout_id for r in report.rollouts])
                except grpc.aio.AioRpcError as exc:  # the evaluation stands; its cost columns stay empty
                    console.print(f"[yellow]{name}: cannot read the rollouts' costs from the store: {exc.details()}")
            results.append(HarnessResult(name, report, costs))
        return results

    if orchestrator:
        results = asyncio.run(go(orchestrator, store))
    else:
        stack = LocalStack(state, base_port=base_port, nats_port=nats_port, http_port=http_port)
        with stack.running(cfg, engine=cfg.stack.engine, model=checkpoint.resolve()):
            results = asyncio.run(go(stack.addresses["orchestrator"], stack.addresses["trajectory-store"]))
    state.mkdir(parents=True, exist_ok=True)
    if compare:
        for r in results:
            console.print(report_table(r.report, title=f"{r.harness}: evaluation {run_id} on {split}"))
        console.print(harness_table(results, ks, title=f"harness comparison {run_id} on {split}"))
        record: dict[str, object] = {
            "run_id": run_id,
            "task_set": split,
            "harnesses": {r.harness: r.to_json() for r in results},
        }
    else:
        console.print(report_table(results[0].report))
        record = results[0].report.to_json()
    (state / "eval.json").write_text(json.dumps(record, indent=2))
    console.print(f"rollouts recorded under run id {run_id}; results in {state / 'eval.json'}")
