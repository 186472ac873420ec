"""The harness comparison's figures (``openforge_cli.compare``): what a rollout cost, read from its
stored calls and samples, and one row per harness."""

from __future__ import annotations

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2
from openforge_cli.compare import (
    HarnessResult,
    RolloutCost,
    cost_of,
    harness_table,
    rollout_seconds,
    sandbox_usage,
)
from openforge_cli.eval import EvalReport, summarize


def _rollout(
    rid: str, task: str, index: int, reward: float, start: float, end: float, usage: tuple[float, int] | None = None
) -> common_pb2.Rollout:
    r = common_pb2.Rollout(rollout_id=rid, task_id=task, group_index=index, status=common_pb2.ROLLOUT_STATUS_SUCCEEDED)
    r.reward = reward
    r.start_time.FromNanoseconds(int(start * 1e9))
    r.end_time.FromNanoseconds(int(end * 1e9))
    if usage is not None:  # (sandbox CPU seconds, peak memory bytes)
        r.sandbox_usage.cpu_time.FromNanoseconds(int(usage[0] * 1e9))
        r.sandbox_usage.peak_memory_bytes = usage[1]
    return r


def test_a_rollouts_cost_counts_calls_once_per_id_and_every_sample_token() -> None:
    calls = [
        common_pb2.CallRecord(call_id="c1", attempt=1),
        common_pb2.CallRecord(call_id="c1", attempt=2),  # a retry is the same turn
        common_pb2.CallRecord(call_id="c2", attempt=1),
    ]
    samples = [
        trajectory_pb2.Sample(prompt_token_ids=[1, 2, 3], response_token_ids=[4, 5, 6, 7], loss_mask=[1, 1, 0, 1]),
        trajectory_pb2.Sample(prompt_token_ids=[1], response_token_ids=[8, 9], loss_mask=[1, 0]),
    ]
    assert cost_of(calls, samples) == RolloutCost(turns=2, tokens=10, sampled=4, samples=2)
    assert cost_of([], []) == RolloutCost(turns=0, tokens=0, sampled=0, samples=0)


def test_rollout_seconds_run_from_the_harness_start_else_the_creation_and_need_an_end() -> None:
    assert rollout_seconds(_rollout("a", "t", 0, 1.0, 10.0, 12.5)) == 2.5
    created = common_pb2.Rollout()
    created.create_time.FromSeconds(5)
    created.end_time.FromSeconds(9)
    assert rollout_seconds(created) == 4.0
    running = common_pb2.Rollout()
    running.start_time.FromSeconds(5)
    assert rollout_seconds(running) is None


def test_sandbox_usage_reads_seconds_and_mib_and_none_where_not_accounted() -> None:
    assert sandbox_usage(_rollout("a", "t", 0, 1.0, 0, 1, usage=(1.5, 64 * 2**20))) == (1.5, 64.0)
    assert sandbox_usage(_rollout("a", "t", 0, 1.0, 0, 1)) == (None, None)
    only_peak = common_pb2.Rollout()
    only_peak.sandbox_usage.peak_memory_bytes = 0  # explicitly zero is a measurement
    assert sandbox_usage(only_peak) == (None, 0.0)


def test_one_row_per_harness_with_its_pass_rates_and_mean_costs() -> None:
    def report(*rollouts: common_pb2.Rollout) -> EvalReport:
        return summarize("ev", "test", ["t1", "t2"], list(rollouts), ks=(1,), pass_threshold=1.0)

    fast = report(
        _rollout("f1", "t1", 0, 1.0, 100, 102, usage=(1.0, 100 * 2**20)),
        _rollout("f2", "t2", 0, 0.0, 100, 104, usage=(3.0, 300 * 2**20)),
    )
    slow = report(_rollout("s1", "t1", 0, 1.0, 100, 130), _rollout("s2", "t2", 0, 1.0, 100, 120))
    results = [
        HarnessResult(
            "mini-swe-agent",
            fast,
            {"f1": RolloutCost(2, 100, 20, 1), "f2": RolloutCost(4, 300, 40, 2)},
        ),
        HarnessResult("codex", slow, {}),
    ]
    assert results[0].mean_cost() == {
        "turns": 3.0,
        "tokens": 200.0,
        "sampled": 30.0,
        "samples": 1.5,
        "seconds": 3.0,
        "cpu_s": 2.0,
        "peak_mib": 200.0,
    }
    assert results[1].mean_cost() == {
        "turns": None,
        "tokens": None,
        "sampled": None,
        "samples": None,
        "seconds": 25.0,
        "cpu_s": None,
        "peak_mib": None,
    }
    record = results[0].to_json()
    assert record["harness"] == "mini-swe-agent" and record["summary"] == {
        "reward/mean": 0.5,
        "pass@1": 0.5,
        "pass^1": 0.5,
    }
    table = harness_table(results, (1,))
    assert table.row_count == 2
    cells = [list(col.cells) for col in table.columns]
    rows = list(zip(*cells, strict=True))
    assert rows[0] == (
        "mini-swe-agent",
        "2",
        "0.500",
        "0.500",
        "0.500",
        "3.0",
        "200",
        "30",
        "1.50",
        "3.0",
        "2.0",
        "200",
    )
    assert rows[1] == ("codex", "2", "1.000", "1.000", "1.000", "-", "-", "-", "-", "25.0", "-", "-")
