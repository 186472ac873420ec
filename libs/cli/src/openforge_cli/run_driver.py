"""Drives one trainer run to its end: ``StartRun`` (or resume), progress while it runs,
``StopRun`` on a stop signal; the outcome as :class:`RunOutcome`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import grpc
from google.protobuf import json_format, struct_pb2
from rich.console import Console

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from openforge_cli.progress import RunProgress
from openforge_cli.stop_signals import StopSignal
from openforge_core.rpc.client import open_channel, wait_serving

TRAINER_SERVICE = "openforge.trainer.v1.TrainerService"


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
