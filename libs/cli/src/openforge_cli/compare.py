"""Harness comparison: one policy evaluated on the same tasks under several harnesses.

``openforge eval CONFIG --checkpoint DIR --harness claude-code,codex,mini-swe-agent`` runs each
harness's rollouts (one group of ``k`` per task, harness after harness, under one evaluation run
id, so the store holds them as one evaluation with each rollout's harness on it) and reports,
per harness, the evaluation's pass@k and pass^k (:class:`~openforge_cli.eval.EvalReport`) beside
what the harness cost, read back from the trajectory store per rollout:

* *turns*: model calls (distinct call ids; a retried attempt is the same call);
* *tokens*: the rollout's sample tokens (prompt + response of every sample: what training on it
  would process), and of those the *sampled* ones (loss mask 1: what the policy generated);
* *samples*: trained samples the store assembled (more than one where the conversation broke:
  compaction, sub-agents, a template that re-renders history);
* *seconds*: the rollout's wall time, its harness start to its terminal status;
* *sandbox CPU* and *peak memory*: what the harness's sandbox used, from its cgroup
  (``Rollout.sandbox_usage``; unknown where the sandbox backend accounts nothing).

Why: the harness changes how hard a task is to learn (the Orchard paper's finding) and what a
rollout costs; a researcher picking one compares them on the same checkpoint and tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from rich.table import Table

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_cli.eval import EvalReport
from openforge_core.backoff import doubling_delay
from openforge_core.rpc.client import open_channel

if TYPE_CHECKING:
    from openforge.trajectory.v1.trajectory_pb2_grpc import TrajectoryServiceAsyncStub

TRAJECTORY_SERVICE = "openforge.trajectory.v1.TrajectoryService"


@dataclass(frozen=True)
class RolloutCost:
    """What one rollout cost (see the module docstring).

    Attributes:
        turns: Model calls.
        tokens: Sample tokens (prompt + response, every sample).
        sampled: Sample tokens with loss mask 1.
        samples: Samples assembled.
    """

    turns: int
    tokens: int
    sampled: int
    samples: int


def rollout_seconds(r: common_pb2.Rollout) -> float | None:
    """Wall time from the harness's start (its creation when it never started) to the terminal
    status, seconds; None before it ended."""
    start = r.start_time if r.HasField("start_time") else r.create_time
    if not r.HasField("end_time") or not (start.seconds or start.nanos):
        return None
    return (r.end_time.ToNanoseconds() - start.ToNanoseconds()) / 1e9


def sandbox_usage(r: common_pb2.Rollout) -> tuple[float | None, float | None]:
    """The rollout's sandbox CPU time, seconds, and peak memory, MiB (``Rollout.sandbox_usage``);
    None where not accounted."""
    u = r.sandbox_usage
    cpu_s = u.cpu_time.ToNanoseconds() / 1e9 if u.HasField("cpu_time") else None
    peak_mib = u.peak_memory_bytes / 2**20 if u.HasField("peak_memory_bytes") else None
    return cpu_s, peak_mib


def cost_of(calls: Sequence[common_pb2.CallRecord], samples: Sequence[trajectory_pb2.Sample]) -> RolloutCost:
    """A rollout's :class:`RolloutCost` from its stored calls (every attempt) and samples."""
    return RolloutCost(
        turns=len({c.call_id for c in calls}),
        tokens=sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples),
        sampled=sum(sum(s.loss_mask) for s in samples),
        samples=len(samples),
    )


async def rollout_cost(stub: TrajectoryServiceAsyncStub, rollout_id: str) -> RolloutCost:
    """One rollout's :class:`RolloutCost` from the store (its samples, then its calls).

    Raises:
        grpc.aio.AioRpcError: The store refused a read (FAILED_PRECONDITION: not assembled yet).
    """
    samples = await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id=rollout_id))
    calls = await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=rollout_id))
    return cost_of(calls.calls, samples.samples)


async def read_costs(
    store: str, rollout_ids: Sequence[str], *, assembly_wait_s: float = 60.0
) -> dict[str, RolloutCost]:
    """Each rollout's :class:`RolloutCost`, read from the trajectory store at ``store`` (``host:port``).

    The store assembles a rollout's samples once it has its end event, shortly after the
    orchestrator reports the end: a rollout not assembled yet (FAILED_PRECONDITION) is asked
    again, with backoff, for up to ``assembly_wait_s`` seconds.

    Raises:
        grpc.aio.AioRpcError: The store refused a read, went away, or had not assembled a rollout
            within ``assembly_wait_s``.
    """
    out: dict[str, RolloutCost] = {}
    deadline = time.monotonic() + assembly_wait_s
    async with open_channel(
        store, service=TRAJECTORY_SERVICE, idempotent_methods=["GetCalls", "GetSamples"], default_timeout_s=60
    ) as channel:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
        for rid in rollout_ids:
            retry = 0
            while True:
                try:
                    out[rid] = await rollout_cost(stub, rid)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() >= deadline:
                        raise
                await asyncio.sleep(doubling_delay(0.1, retry, 2.0))
                retry += 1
    return out


@dataclass(frozen=True)
class HarnessResult:
    """One harness's evaluation and what its rollouts cost.

    Attributes:
        harness: The harness.
        report: Its pass@k / pass^k evaluation.
        costs: Per rollout id, read from the store (empty when no store was read).
    """

    harness: str
    report: EvalReport
    costs: dict[str, RolloutCost]

    def mean_cost(self) -> dict[str, float | None]:
        """Mean ``turns``, ``tokens``, ``sampled``, ``samples``, ``seconds``, sandbox ``cpu_s``
        and sandbox ``peak_mib`` per rollout (None where nothing was measured)."""
        costs = list(self.costs.values())
        usage = [sandbox_usage(r) for r in self.report.rollouts]

        def mean(values: Sequence[float]) -> float | None:
            return sum(values) / len(values) if values else None

        return {
            "turns": mean([c.turns for c in costs]),
            "tokens": mean([c.tokens for c in costs]),
            "sampled": mean([c.sampled for c in costs]),
            "samples": mean([c.samples for c in costs]),
            "seconds": mean([s for r in self.report.rollouts if (s := rollout_seconds(r)) is not None]),
            "cpu_s": mean([cpu for cpu, _ in usage if cpu is not None]),
            "peak_mib": mean([peak for _, peak in usage if peak is not None]),
        }

    def to_json(self) -> dict[str, object]:
        """The evaluation's record (:meth:`EvalReport.to_json`) with ``cost`` (the means)."""
        return {**self.report.to_json(), "harness": self.harness, "cost": self.mean_cost()}


#: (cost key, column, format) of the table's cost columns.
_COST_COLUMNS = (
    ("turns", "turns", ".1f"),
    ("tokens", "tokens", ".0f"),
    ("sampled", "sampled", ".0f"),
    ("samples", "samples", ".2f"),
    ("seconds", "s/rollout", ".1f"),
    ("cpu_s", "sandbox CPU s", ".1f"),
    ("peak_mib", "peak MiB", ".0f"),
)


def harness_table(results: Sequence[HarnessResult], ks: Sequence[int], title: str = "") -> Table:
    """A ``rich`` table: one row per harness (rollouts, mean reward, pass@k and pass^k for each
    k, then the mean cost per rollout)."""
    table = Table(title=title or "harness comparison")
    table.add_column("harness")
    table.add_column("rollouts", justify="right")
    table.add_column("reward", justify="right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
        table.add_column(f"pass^{k}", justify="right")
    for _, column, _ in _COST_COLUMNS:
        table.add_column(column, justify="right")
    for r in results:
        cells = [r.harness, str(sum(t.n for t in r.report.tasks)), f"{r.report.reward_mean:.3f}"]
        for k in ks:
            cells += [f"{r.report.pass_at(k):.3f}", f"{r.report.pass_hat(k):.3f}"]
        cost = r.mean_cost()
        for key, _, fmt in _COST_COLUMNS:
            value = cost[key]
            cells.append("-" if value is None else format(value, fmt))
        table.add_row(*cells)
    return table
