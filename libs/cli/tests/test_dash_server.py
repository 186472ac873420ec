"""The dashboard's JSON endpoints against an in-process gRPC server.

The server hosts ``FakeTrajectoryStore``, a **fake** ``TrajectoryService`` (a test double that
answers canned messages and records the requests it got), so each endpoint's translation —
query parameters to the store's request, the store's messages and errors to JSON — is checked
exactly. The real store behind the real dashboard process is covered by
``tests/integration/test_dashboard.py``. ``openforge dash --state-dir``'s refusals and its choice
of the run's model folder are checked here without starting processes.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from openforge.common.v1 import common_pb2
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_cli import local
from openforge_cli.dash.command import dash
from openforge_cli.dash.local_store import run_model_dir
from openforge_cli.dash.server import build_app
from openforge_cli.dash.views import TokenDecoder
from openforge_testing.fakes import build_fake_model_dir
from openforge_testing.servers import free_port

REQUEST_BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


class FakeTrajectoryStore(trajectory_pb2_grpc.TrajectoryServiceServicer):
    """A fake store: one run ``r1`` with rollout ``ro1`` (two calls, one sample), ``ro2`` unfinished."""

    def __init__(self, model_dir: Path) -> None:
        self.requests: list[Message] = []
        self.tok = TokenDecoder(model_dir)
        self.tokenizer_hash = self.tok.sha256
        self.steps = [
            trajectory_pb2.StepMetrics(step=n, policy_version=n, metrics={"reward/mean": n / 10, "loss/policy": 1 / n})
            for n in range(1, 6)
        ]

    def _manifest(self) -> common_pb2.RunManifest:
        return common_pb2.RunManifest(
            run_id="r1", harness="codex", harness_version="0.171.0", tokenizer_hash=self.tokenizer_hash
        )

    async def ListRuns(self, request: Any, context: Any) -> trajectory_pb2.ListRunsResponse:
        self.requests.append(request)
        run = trajectory_pb2.RunSummary(run_id="r1", manifest=self._manifest(), rollouts=2, finished_rollouts=1)
        run.mean_reward = 0.75
        run.create_time.FromSeconds(1_790_000_000)
        bare = trajectory_pb2.RunSummary(run_id="r0", rollouts=1)
        return trajectory_pb2.ListRunsResponse(runs=[run, bare], next_page_token="next")

    async def GetRun(self, request: Any, context: Any) -> trajectory_pb2.GetRunResponse:
        self.requests.append(request)
        if request.run_id != "r1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no run {request.run_id!r}")
        return trajectory_pb2.GetRunResponse(run=trajectory_pb2.RunSummary(run_id="r1", manifest=self._manifest()))

    async def ListStepMetrics(self, request: Any, context: Any) -> trajectory_pb2.ListStepMetricsResponse:
        self.requests.append(request)
        start = int(request.page_token or 0)
        page = self.steps[start : start + 3]  # pages of 3 whatever the size asked, to exercise paging
        token = str(start + 3) if start + 3 < len(self.steps) else ""
        return trajectory_pb2.ListStepMetricsResponse(steps=page, next_page_token=token)

    async def ListRollouts(self, request: Any, context: Any) -> trajectory_pb2.ListRolloutsResponse:
        self.requests.append(request)
        r = common_pb2.Rollout(
            rollout_id="ro1",
            run_id="r1",
            task_id="t1",
            harness="mini-swe-agent",
            status=common_pb2.ROLLOUT_STATUS_SUCCEEDED,
        )
        r.reward = 1.0
        r.start_time.FromSeconds(100)
        r.end_time.FromSeconds(112)
        r.sandbox_usage.cpu_time.FromMilliseconds(2500)
        r.sandbox_usage.peak_memory_bytes = 96 * 2**20
        if request.page_size == 1000 and request.page_token == "p2":  # the outcomes endpoint's second page
            return trajectory_pb2.ListRolloutsResponse(rollouts=self.failed)
        return trajectory_pb2.ListRolloutsResponse(
            rollouts=[r], next_page_token="p2" if request.page_size == 1000 else ""
        )

    failed: ClassVar[list[common_pb2.Rollout]] = [
        common_pb2.Rollout(
            rollout_id=rid,
            harness=harness,
            status=status,
            failure_reason=reason,
            # ro2 ended but is not assembled yet (GetSamples: FAILED_PRECONDITION): no cost
            end_time=Timestamp(seconds=200) if rid == "ro2" else None,
        )
        for rid, harness, status, reason in (
            (
                "ro2",
                "codex",
                common_pb2.ROLLOUT_STATUS_TIMED_OUT,
                "harness timed out after 120s; verifier: no reward file",
            ),
            ("ro3", "codex", common_pb2.ROLLOUT_STATUS_TIMED_OUT, "harness timed out after 95s"),
            (
                "ro4",
                "mini-swe-agent",
                common_pb2.ROLLOUT_STATUS_FAILED,
                "infrastructure: harness exited 1 before its first model call",
            ),
        )
    ]

    async def GetRollout(self, request: Any, context: Any) -> trajectory_pb2.GetRolloutResponse:
        self.requests.append(request)
        if request.rollout_id not in ("ro1", "ro2"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no rollout {request.rollout_id!r}")
        r = common_pb2.Rollout(rollout_id=request.rollout_id, run_id="r1", verifier_output="1 passed")
        return trajectory_pb2.GetRolloutResponse(rollout=r)

    async def GetCalls(self, request: Any, context: Any) -> trajectory_pb2.GetCallsResponse:
        prompt = self.tok._tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").ids
        answer = self.tok._tok.encode("hello world<|im_end|>").ids
        c = common_pb2.CallRecord(
            rollout_id=request.rollout_id,
            call_id="c1",
            attempt=1,
            wire_api=common_pb2.WIRE_API_OPENAI_CHAT_COMPLETIONS,
            prompt_token_ids=prompt,
            completion_token_ids=answer,
            completion_policy_versions=[4] * len(answer),
            request_json=REQUEST_BODY,
            response_body=b"data: {}\n\ndata: [DONE]\n\n",
            http_status=200,
        )
        c.splice.break_cause = common_pb2.BREAK_CAUSE_NONE
        c.splice.rendered.add(start=0, end=len(prompt))
        return trajectory_pb2.GetCallsResponse(calls=[c])

    async def GetSamples(self, request: Any, context: Any) -> trajectory_pb2.GetSamplesResponse:
        if request.rollout_id == "ro2":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "rollout ro2 is not assembled yet")
        s = trajectory_pb2.Sample(
            sample_id="ro1/0",
            rollout_id="ro1",
            prompt_token_ids=[1, 2],
            response_token_ids=[3, 4, 5],
            loss_mask=[1, 1, 0],
            rollout_logprobs=[-0.5, -0.25, 0.0],
            policy_versions=[4, 4, 0],
            break_cause=common_pb2.BREAK_CAUSE_COMPACTION,
            break_detail="first diverging token at 12",
            call_ids=["c1"],
            reward=1.0,
        )
        return trajectory_pb2.GetSamplesResponse(samples=[s])

    async def WatchCompletedGroups(
        self, request: Any, context: Any
    ) -> AsyncIterator[trajectory_pb2.WatchCompletedGroupsResponse]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the dashboard does not watch groups")
        yield trajectory_pb2.WatchCompletedGroupsResponse()  # pragma: no cover (abort raises)

    async def Export(self, request: Any, context: Any) -> trajectory_pb2.ExportResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the dashboard does not export")
        return trajectory_pb2.ExportResponse()  # pragma: no cover (abort raises)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return build_fake_model_dir(tmp_path / "model")


@pytest.fixture
async def store(model_dir: Path) -> AsyncIterator[tuple[FakeTrajectoryStore, str]]:
    fake = FakeTrajectoryStore(model_dir)
    server = grpc.aio.server()
    trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield fake, f"127.0.0.1:{port}"
    await server.stop(None)


async def _client(store: str, model_dir: Path | None) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(store, model_dir)))
    await client.start_server()
    return client


async def _get(client: TestClient[Any, Any], path: str, status: int = 200) -> Any:
    resp = await client.get(path)
    body = await resp.json()
    assert resp.status == status, body
    return body


async def test_runs_and_run(store: tuple[FakeTrajectoryStore, str], model_dir: Path) -> None:
    fake, address = store
    client = await _client(address, None)
    try:
        body = await _get(client, "/api/runs?page_token=abc&page_size=20")
        assert fake.requests[-1] == trajectory_pb2.ListRunsRequest(page_size=20, page_token="abc")
        r1, r0 = body["runs"]
        assert body["next_page_token"] == "next"
        assert (r1["run_id"], r1["mean_reward"], r1["rollouts"], r1["finished_rollouts"]) == ("r1", 0.75, 2, 1)
        assert r1["create_time"] == "2026-09-21T14:13:20.000Z"
        assert r1["manifest"]["harness_version"] == "0.171.0"
        assert r1["manifest"]["sandbox_image_digest"] == ""  # every manifest field is present
        assert (r0["manifest"], r0["mean_reward"], r0["create_time"]) == (None, None, "")
        assert (await _get(client, "/api/runs/r1"))["run"]["manifest"]["harness"] == "codex"
        missing = await _get(client, "/api/runs/nope", 404)
        assert missing == {"error": {"code": "NOT_FOUND", "message": "no run 'nope'"}}
    finally:
        await client.close()


async def test_outcomes_count_every_rollout_by_status_failure_cause_and_harness(
    store: tuple[FakeTrajectoryStore, str],
) -> None:
    _, address = store
    client = await _client(address, None)
    try:
        body = await _get(client, "/api/runs/r1/outcomes")
    finally:
        await client.close()
    assert body == {
        "statuses": {"FAILED": 1, "SUCCEEDED": 1, "TIMED_OUT": 2},
        "causes": [
            {"status": "TIMED_OUT", "cause": "harness timed out after Ns", "rollouts": 2, "example": "ro2"},
            {
                "status": "FAILED",
                "cause": "infrastructure: harness exited N before its first model call",
                "rollouts": 1,
                "example": "ro4",
            },
        ],
        "harnesses": [
            {
                "harness": "codex",
                "rollouts": 2,
                "statuses": {"TIMED_OUT": 2},
                "rewarded": 0,
                "reward_mean": None,
                "passed": 0,
                "mean_s": None,
                "peak_mib": None,
                "turns": None,
                "tokens": None,
                "samples": None,
            },
            {
                "harness": "mini-swe-agent",
                "rollouts": 2,
                "statuses": {"FAILED": 1, "SUCCEEDED": 1},
                "rewarded": 1,
                "reward_mean": 1.0,
                "passed": 1,
                "mean_s": 12.0,
                "peak_mib": 96.0,
                "turns": 1.0,  # ro1 (ended): one call, one sample of 2 + 3 tokens; ro4 never ended
                "tokens": 5.0,
                "samples": 1.0,
            },
        ],
    }


async def test_metrics_read_every_page(store: tuple[FakeTrajectoryStore, str]) -> None:
    fake, address = store
    client = await _client(address, None)
    try:
        body = await _get(client, "/api/runs/r1/metrics")
        assert [s["step"] for s in body["steps"]] == [1, 2, 3, 4, 5]
        assert body["steps"][1]["metrics"] == {"loss/policy": 0.5, "reward/mean": 0.2}
        assert body["metric_names"] == ["loss/policy", "reward/mean"]
        pages = [r for r in fake.requests if isinstance(r, trajectory_pb2.ListStepMetricsRequest)]
        assert [p.page_token for p in pages] == ["", "3"]
    finally:
        await client.close()


async def test_rollout_filters_become_the_store_request(store: tuple[FakeTrajectoryStore, str]) -> None:
    fake, address = store
    client = await _client(address, None)
    try:
        body = await _get(client, "/api/runs/r1/rollouts?task=t1&status=succeeded&min_reward=0.5&page_size=10")
        req = fake.requests[-1]
        assert isinstance(req, trajectory_pb2.ListRolloutsRequest)
        assert (req.run_id, req.task_id, req.status, req.page_size) == (
            "r1",
            "t1",
            common_pb2.ROLLOUT_STATUS_SUCCEEDED,
            10,
        )
        assert req.HasField("min_reward") and req.min_reward == 0.5 and not req.HasField("max_reward")
        [r] = body["rollouts"]
        assert (r["status"], r["reward"], r["duration_s"]) == ("SUCCEEDED", 1.0, 12.0)
        assert (r["sandbox_cpu_s"], r["sandbox_peak_mib"]) == (2.5, 96.0)

        before = len(fake.requests)
        bad = await _get(client, "/api/runs/r1/rollouts?status=DONE", 400)
        assert bad["error"]["code"] == "INVALID_ARGUMENT" and "SUCCEEDED" in bad["error"]["message"]
        assert (await _get(client, "/api/runs/r1/rollouts?min_reward=high", 400))["error"]["code"] == (
            "INVALID_ARGUMENT"
        )
        assert (await _get(client, "/api/runs/r1/rollouts?max_reward=nan", 400))["error"]["code"] == (
            "INVALID_ARGUMENT"
        )
        assert (await _get(client, "/api/runs/r1/rollouts?page_size=-1", 400))["error"]["code"] == "INVALID_ARGUMENT"
        assert len(fake.requests) == before  # bad parameters never reach the store
    finally:
        await client.close()


async def test_trajectory_with_tokenizer(store: tuple[FakeTrajectoryStore, str], model_dir: Path) -> None:
    fake, address = store
    client = await _client(address, model_dir)
    try:
        body = await _get(client, "/api/rollouts/ro1")
        assert body["rollout"]["verifier_output"] == "1 passed"
        [call] = body["calls"]
        assert call["request"] == {
            "json": {"messages": [{"role": "user", "content": "hi"}]},
            "text": None,
            "bytes": len(REQUEST_BODY),
            "truncated": False,
        }
        assert call["response"]["json"] is None and call["response"]["text"].endswith("data: [DONE]\n\n")
        assert call["completion_text"] == "hello world<|im_end|>"
        assert (call["wire_api"], call["policy_versions"]) == ("OPENAI_CHAT_COMPLETIONS", [4])
        assert call["splice"]["break_cause"] == "NONE"
        assert call["splice"]["rendered"] == [{"start": 0, "end": call["prompt_tokens"], "source_call_id": ""}]
        [s] = body["samples"]
        assert (s["break_cause"], s["break_detail"]) == ("COMPACTION", "first diverging token at 12")
        assert (s["loss_mask"], s["trained_tokens"], s["logprobs"]) == ([1, 1, 0], 2, [-0.5, -0.25, 0.0])
        assert s["response_text"] == [fake.tok.piece(i) for i in (3, 4, 5)] and len(s["prompt_text"]) == 2
        assert body["tokenizer"] == {"model_dir": str(model_dir), "source": "--model-dir", "matches_manifest": True}
        fake.tokenizer_hash = "sha256:0000"
        assert (await _get(client, "/api/rollouts/ro1"))["tokenizer"]["matches_manifest"] is False
    finally:
        await client.close()


async def test_trajectory_without_tokenizer_and_errors(store: tuple[FakeTrajectoryStore, str]) -> None:
    _, address = store
    client = await _client(address, None)
    try:
        body = await _get(client, "/api/rollouts/ro2")
        assert body["samples"] == [] and body["samples_note"] == "rollout ro2 is not assembled yet"
        assert body["calls"][0]["completion_text"] is None  # ids only: the manifest names no local model
        assert body["tokenizer"] == {"model_dir": None, "source": None, "matches_manifest": None}
        assert (await _get(client, "/api/rollouts/nope", 404))["error"]["code"] == "NOT_FOUND"
    finally:
        await client.close()


async def test_store_down_is_503_and_the_page_is_served() -> None:
    client = await _client(f"127.0.0.1:{free_port()}", None)
    try:
        body = await _get(client, "/api/runs", 503)
        assert body["error"]["code"] == "UNAVAILABLE"
        page = await client.get("/")
        assert page.status == 200 and 'src="/static/app.js"' in await page.text()
        for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
            resp = await client.get(f"/static/{name}")
            assert resp.status == 200 and resp.content_type == kind and len(await resp.read()) > 1000
        assert (await client.get("/static/secret.txt")).status == 404
    finally:
        await client.close()


def test_state_dir_refusals(tmp_path: Path) -> None:
    runner = CliRunner()
    empty = runner.invoke(dash, ["--state-dir", str(tmp_path)])
    assert empty.exit_code == 2 and f"no trajectories.db in {tmp_path}" in empty.output
    (tmp_path / "trajectories.db").touch()
    both = runner.invoke(dash, ["--state-dir", str(tmp_path), "--store", "127.0.0.1:50053"])
    assert both.exit_code == 2 and "give --state-dir or --store, not both" in both.output
    # The run's own services are up (this process stands in for its store): read that store instead.
    store = local.ProcessInfo("trajectory-store", os.getpid(), "127.0.0.1:50153", "")
    local.UpState("nats://127.0.0.1:1", [store]).save(tmp_path)
    running = runner.invoke(dash, ["--state-dir", str(tmp_path)])
    assert running.exit_code == 2 and "use --store 127.0.0.1:50153" in running.output


def test_run_model_dir(tmp_path: Path) -> None:
    assert run_model_dir(tmp_path) is None
    build_fake_model_dir(tmp_path / "models" / "base")
    (tmp_path / "models" / "empty").mkdir()
    assert run_model_dir(tmp_path) == tmp_path / "models" / "base"
    checkpoint = build_fake_model_dir(tmp_path / "checkpoints" / "run" / "step_00000002")
    (tmp_path / "phases.json").write_text(
        json.dumps({"warm_start": {"model": str(tmp_path / "gone")}, "rl": {"checkpoint_uri": str(checkpoint)}})
    )
    assert run_model_dir(tmp_path) == checkpoint  # the warm start's folder is gone: the RL checkpoint
