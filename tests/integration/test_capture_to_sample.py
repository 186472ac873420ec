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
from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_testing.captures import CAPTURES, completion_for, headers_of, load_run
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import check_exact_sample, finish_rollout, wait_samples
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
            asyncio.run(finish_rollout(nats_server_fn.url, rollout_id, calls))
            samples = asyncio.run(wait_samples(store.address, rollout_id))
            assert len(samples) == 1, (name, [common_pb2.BreakCause.Name(s.break_cause) for s in samples])
            check_exact_sample(samples[0], seen, fake.policy_version, retries=True)
            checked += 1
        assert checked >= 5
    finally:
        fake.stop_thread()
