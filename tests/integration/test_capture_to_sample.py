"""Recorded harness conversations become the training samples they should, exactly.

Each captured run of a real harness (Claude Code, Codex, OpenClaw,
mini-swe-agent; every ``<harness>/<run>`` folder of
``shared/cases/harness-captures`` is one case, and without any the one case
fails) is replayed, request by request, through the proxy running as its own
process, against a fake engine (a test double that samples scripted token
ids). The proxy records every call on a real NATS server; the trajectory
store, also its own process, ingests them. The test then announces the
rollout's end as the orchestrator would and reads the assembled samples back
over gRPC:

* one sample per conversation the run's requests make up
  (:func:`openforge_testing.captures.samples_of`): one per rollout, unless the
  harness rewrote its history after an injected fault (the call the fault hit,
  answered in full by the replay, is in no later history); a retry of the
  same conversation stays in the sample;
* each sample's tokens are, position by position, its conversation's last
  prompt the engine saw and the tokens it sampled;
* every position with loss mask 1 holds a token the engine sampled, with the
  logprob and policy version the engine reported, and only those positions do;
* the first sample starts the rollout (no break); a later one is a break whose
  cause says the history changed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_testing.captures import completion_for, headers_of, load_run, run_dir, run_names, samples_of
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir
from openforge_testing.rollouts import check_exact_sample, finish_rollout, wait_samples
from openforge_testing.servers import NatsServer, ServiceProcess

#: The causes that say a sample starts because the harness changed its history: which one is the
#: proxy's reading of how (a conversation that opens unlike the earlier one reads as SUB_AGENT,
#: as OpenClaw's re-queued user message after a cut stream does; COMPACTION and OTHER when earlier
#: turns are kept or dropped) — never NONE, a RETRY (a retry is the same call) or TEMPLATE_DRIFT.
_HISTORY_CHANGED = {common_pb2.BREAK_CAUSE_SUB_AGENT, common_pb2.BREAK_CAUSE_COMPACTION, common_pb2.BREAK_CAUSE_OTHER}


@dataclass
class _Stack:
    fake: ScriptedInferenceServer
    nats_url: str
    proxy: ServiceProcess
    store: ServiceProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Stack]:
    """A fake engine, NATS, and the proxy and the store in their own processes, for all runs."""
    tmp = tmp_path_factory.mktemp("capture-to-sample")
    fake = ScriptedInferenceServer(build_fake_model_dir(tmp / "model"), tokens_per_message=3)
    fake.start_in_thread()
    try:
        with NatsServer(tmp / "nats") as nats:
            env = {"OPENFORGE_NATS__URL": nats.url}
            proxy_env = {**env, "OPENFORGE_SERVICES__INFERENCE": fake.address}
            store_env = {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'store.db'}"}
            with (
                ServiceProcess("openforge_proxy", proxy_env, tmp / "proxy.log") as proxy,
                ServiceProcess("openforge_trajectory_store", store_env, tmp / "store.log") as store,
            ):
                yield _Stack(fake, nats.url, proxy, store)
    finally:
        fake.stop_thread()


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


@pytest.mark.parametrize("run_name", run_names())
def test_captured_rollout_assembles_into_its_exact_samples(run_name: str, stack: _Stack) -> None:
    docs, _ = load_run(run_dir(run_name))
    rollout_id = run_name.replace("/", "-")
    fake = stack.fake
    before = len(fake.seen)
    fake.script(*[completion_for(d["plan"]) for d in docs])
    asyncio.run(_replay(stack.proxy.address, stack.proxy.http_port, rollout_id, docs))
    seen = fake.seen[before:]
    assert len(seen) == len(docs)  # one engine request per request
    calls = len({json.dumps(s.prompt_ids) for s in seen})  # a retried request is the same call
    asyncio.run(finish_rollout(stack.nats_url, rollout_id, calls))
    samples = asyncio.run(wait_samples(stack.store.address, rollout_id))
    groups = samples_of(docs)
    causes = [common_pb2.BreakCause.Name(s.break_cause) for s in samples]
    assert len(samples) == len(groups), (causes, [len(g) for g in groups])
    start = 0
    for k, (sample, group) in enumerate(zip(samples, groups, strict=True)):
        check_exact_sample(sample, seen[start : start + len(group)], fake.policy_version, retries=True)
        if k == 0:
            assert sample.break_cause == common_pb2.BREAK_CAUSE_NONE, causes
        else:
            assert sample.break_cause in _HISTORY_CHANGED, causes
        start += len(group)
