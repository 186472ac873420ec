"""End-to-end checks shared by cross-service tests: announce a rollout's end as the
orchestrator does, read its samples back from the store, and check a sample token by token
against what the (fake) engine saw and sampled."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.rpc.client import open_channel
from openforge_core.settings import NatsSettings
from openforge_testing.fakes import SeenRequest


def require_sandboxed_harness(harness_dir: Path, harness: str) -> None:
    """Skips the calling test unless bubblewrap and ``harness`` (installed by ``openforge harness
    install`` into ``harness_dir``) are there."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    if not (harness_dir / harness / "manifest.json").is_file():
        pytest.skip(f"{harness} is not installed in {harness_dir} (openforge harness install {harness})")


#: npm harness → (its npm package, its command).
NPM_PACKAGES = {
    "codex": ("@openai/codex", "codex"),
    "claude-code": ("@anthropic-ai/claude-code", "claude"),
    "openclaw": ("openclaw", "openclaw"),
}


def npm_harness_dir(harness: str, root: Path, harness_dir: Path, into: Path) -> Path | None:
    """A folder holding ``<harness>/manifest.json`` for an npm harness (:data:`NPM_PACKAGES`):
    ``harness_dir`` when ``openforge harness install`` put it there (Node.js on PATH needed), else
    ``into``, with a manifest written here for the ``tools/harness-clis`` install of the repository
    at ``root`` (``make harness-clis``: the same pinned versions, Node 24 first on PATH, the whole
    folder visible read-only in the sandbox); None when neither is installed."""
    if (harness_dir / harness / "manifest.json").is_file():
        return harness_dir if shutil.which("node") is not None else None
    clis = root / "tools" / "harness-clis"
    package, command = NPM_PACKAGES[harness]
    executable = clis / "node_modules" / ".bin" / command
    node_bin = clis / "node" / "node_modules" / ".bin"
    if not executable.exists() or not (node_bin / "node").exists():
        return None
    version = json.loads((root / "deploy" / "harness" / harness / "package.json").read_text())["dependencies"][package]
    manifest = {
        "name": harness,
        "version": version,
        "executable": str(executable),
        "path": [str(node_bin), str(executable.parent)],
        "roots": [str(clis)],
    }
    (into / harness).mkdir(parents=True, exist_ok=True)
    (into / harness / "manifest.json").write_text(json.dumps(manifest))
    return into


async def finish_rollout(nats_url: str, rollout_id: str, calls: int, reward: float = 1.0) -> None:
    """Publishes RolloutsSubmitted (a group of one) and RolloutFinished (SUCCEEDED, ``calls``
    model calls served) for a rollout, as the orchestrator would."""
    rollout = common_pb2.Rollout(
        rollout_id=rollout_id, run_id="run", task_id=rollout_id, group_id="g-" + rollout_id, harness=rollout_id
    )
    done = common_pb2.Rollout()
    done.CopyFrom(rollout)
    done.status = common_pb2.ROLLOUT_STATUS_SUCCEEDED
    done.reward = reward
    bus = EventBus(NatsSettings(url=nats_url))
    await bus.connect()
    try:
        sub_id, fin_id = f"submitted/{rollout_id}", f"finished/{rollout_id}"
        await bus.publish(
            subject_for("orchestrator", "rollouts_submitted"),
            orch.RolloutsSubmitted(event_id=sub_id, rollouts=[rollout]),
            event_id=sub_id,
        )
        await bus.publish(
            subject_for("orchestrator", "rollout_finished"),
            orch.RolloutFinished(event_id=fin_id, rollout=done, calls=calls),
            event_id=fin_id,
        )
    finally:
        await bus.close()


async def wait_samples(store_grpc: str, rollout_id: str, timeout_s: float = 30.0) -> list[trajectory_pb2.Sample]:
    """The rollout's samples from the store, once its events are ingested and it is assembled.

    Raises:
        AssertionError: No samples within ``timeout_s``.
    """
    async with open_channel(store_grpc) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        for _ in range(int(timeout_s / 0.1)):
            try:
                resp = await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id=rollout_id))
                return list(resp.samples)
            except Exception:  # NOT_FOUND / FAILED_PRECONDITION until the events are ingested
                await asyncio.sleep(0.1)
    raise AssertionError(f"no samples for {rollout_id}")


def check_exact_sample(
    sample: trajectory_pb2.Sample, seen: list[SeenRequest], policy_version: int, *, retries: bool = False
) -> None:
    """Asserts a sample is exactly what the engine saw and sampled.

    Its tokens are the last prompt the engine saw plus what it sampled; every position with loss
    mask 1 holds a sampled token with the engine's logprob and policy version, and no other
    position has mask 1.

    Args:
        sample: The assembled sample.
        seen: The engine's requests for this rollout, in order.
        policy_version: The version the engine reported.
        retries: Whether some requests are attempts the harness did not continue with (their
            prompt is then not a prefix of the sample and they are skipped); otherwise every
            request's prompt must be a prefix.
    """
    last = seen[-1]
    tokens = list(sample.prompt_token_ids) + list(sample.response_token_ids)
    assert tokens == last.prompt_ids + last.sampled_ids
    offset = len(sample.prompt_token_ids)
    expected: dict[int, tuple[int, float]] = {}
    for s in seen:
        if tokens[: len(s.prompt_ids)] != s.prompt_ids:
            assert retries, "a call's prompt is not a prefix of the sample"
            continue
        start = len(s.prompt_ids) - offset
        for k, (tok, lp) in enumerate(zip(s.sampled_ids, s.logprobs, strict=True)):
            expected[start + k] = (tok, lp)
    for pos in range(len(sample.response_token_ids)):
        if pos in expected:
            tok, lp = expected[pos]
            assert sample.loss_mask[pos] == 1
            assert sample.response_token_ids[pos] == tok
            assert sample.rollout_logprobs[pos] == pytest.approx(lp, abs=1e-6)
            assert sample.policy_versions[pos] == policy_version
        else:
            assert sample.loss_mask[pos] == 0, f"position {pos} was not sampled"
    assert sum(sample.loss_mask) == len(expected) > 0
