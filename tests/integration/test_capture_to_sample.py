"""Recorded harness conversations become exactly one training sample per rollout.

Each captured run of a real harness (Claude Code, Codex, OpenClaw,
mini-swe-agent; ``shared/cases/harness-captures``) is replayed, request by
request, through the proxy running as its own process, against a fake engine
(a test double that samples scripted token ids). The proxy records every call
on a real NATS server; the trajectory store, also its own process, ingests
them. The test then announces the rollout's end as the orchestrator would and
reads the assembled samples back over gRPC:

* exactly one sample per rollout;
* its tokens are, position by position, the last prompt the engine saw and the
  tokens it sampled;
* every position with loss mask 1 holds a token the engine sampled, with the
  logprob and policy version the engine reported, and only those positions do.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.rpc.client import open_channel
from openforge_core.settings import NatsSettings
from openforge_testing.captures import CAPTURES, completion_for, headers_of, load_run
from openforge_testing.fakes import ScriptedInferenceServer, SeenRequest, build_fake_model_dir
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer

RUNS = [
    "claude-code/normal",
    "claude-code/err-429x2",
    "codex/custom-model",
    "codex/default-model-code-mode-think",
    "openclaw/anthropic-messages",
    "openclaw/chat-completions",
    "openclaw/responses",
    "mini-swe-agent/chat-toolcall",
    "mini-swe-agent/responses",
]


@pytest.fixture(scope="module")
def captures() -> Path:
    if not CAPTURES.is_dir():
        pytest.skip(f"harness captures not found at <repo>/../shared/cases/harness-captures ({CAPTURES})")
    return CAPTURES


async def _replay(proxy_grpc: str, http_port: int, rollout_id: str, docs: list[dict[str, Any]]) -> None:
    async with open_channel(proxy_grpc) as ch:
        created = await proxy_pb2_grpc.ProxyServiceStub(ch).CreateSession(
            proxy_pb2.CreateSessionRequest(
                request_id=rollout_id, rollout_id=rollout_id, run_id="run", ttl=Duration(seconds=600)
            )
        )
    async with aiohttp.ClientSession() as http:
        for d in docs:
            headers, bearer = headers_of(d)
            headers = {k: v for k, v in headers.items() if k.lower() != "content-encoding"}
            headers["Authorization" if bearer else "x-api-key"] = (
                f"Bearer {created.api_key}" if bearer else created.api_key
            )
            headers["Content-Type"] = "application/json"
            url = f"http://127.0.0.1:{http_port}{d['path']}"
            async with http.post(url, data=json.dumps(d["body"]).encode(), headers=headers) as resp:
                body = await resp.read()
                assert resp.status == 200, body[:300]


async def _finish(nats_url: str, rollout_id: str, calls: int) -> None:
    rollout = common_pb2.Rollout(
        rollout_id=rollout_id, run_id="run", task_id=rollout_id, group_id="g-" + rollout_id, harness="replay"
    )
    done = common_pb2.Rollout()
    done.CopyFrom(rollout)
    done.status = common_pb2.ROLLOUT_STATUS_SUCCEEDED
    done.reward = 1.0
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


async def _samples(store_grpc: str, rollout_id: str) -> list[trajectory_pb2.Sample]:
    async with open_channel(store_grpc) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        for _ in range(300):
            try:
                resp = await stub.GetSamples(trajectory_pb2.GetSamplesRequest(rollout_id=rollout_id))
                return list(resp.samples)
            except Exception:  # NOT_FOUND / FAILED_PRECONDITION until the events are ingested
                await asyncio.sleep(0.1)
    raise AssertionError(f"no samples for {rollout_id}")


def _check(sample: trajectory_pb2.Sample, seen: list[SeenRequest], policy_version: int) -> None:
    last = seen[-1]
    tokens = list(sample.prompt_token_ids) + list(sample.response_token_ids)
    assert tokens == last.prompt_ids + last.sampled_ids
    offset = len(sample.prompt_token_ids)
    expected: dict[int, tuple[int, float]] = {}
    for s in seen:  # retried attempts are re-sampled identically, so any attempt describes the position
        start = len(s.prompt_ids) - offset
        if tokens[: len(s.prompt_ids)] != s.prompt_ids:
            continue  # an attempt the harness did not continue with
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


def test_each_captured_rollout_assembles_into_one_exact_sample(
    captures: Path, tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    model = build_fake_model_dir(tmp_path / "model")
    fake = ScriptedInferenceServer(model, tokens_per_message=3)
    fake.start_in_thread()
    try:
        env = {"OPENFORGE_NATS__URL": nats_server_fn.url}
        proxy = service_process("openforge_proxy", {**env, "OPENFORGE_SERVICES__INFERENCE": fake.address})
        store = service_process(
            "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp_path / 'store.db'}"}
        )
        checked = 0
        for name in RUNS:
            run = captures / name
            if not run.is_dir():
                continue
            docs, _ = load_run(run)
            rollout_id = name.replace("/", "-")
            before = len(fake.seen)
            fake.script(*[completion_for(d["plan"]) for d in docs])
            asyncio.run(_replay(proxy.address, proxy.http_port, rollout_id, docs))
            seen = fake.seen[before:]
            calls = len({json.dumps(s.prompt_ids) for s in seen})  # a retried request is the same call
            asyncio.run(_finish(nats_server_fn.url, rollout_id, calls))
            samples = asyncio.run(_samples(store.address, rollout_id))
            assert len(samples) == 1, (name, [common_pb2.BreakCause.Name(s.break_cause) for s in samples])
            _check(samples[0], seen, fake.policy_version)
            checked += 1
        assert checked >= 5
    finally:
        fake.stop_thread()
