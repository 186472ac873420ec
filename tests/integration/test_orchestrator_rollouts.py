"""Real harnesses in real local sandboxes, against the real proxy and a fake (scripted) engine.

Processes: NATS, the proxy, the trajectory store and the orchestrator, each as users start
them; a ``ScriptedInferenceServer`` (a **fake** engine: it samples scripted completions, not a
model) answers the proxy. The fake replays a task's oracle solution as the harness's tool
calls: mini-swe-agent runs it in its bubblewrap sandbox, the task's verifier scores it.

Needs ``bwrap`` (Debian ``bubblewrap``) and mini-swe-agent installed with
``openforge harness install mini-swe-agent`` (``.openforge/harnesses`` or
``OPENFORGE_TEST_HARNESS_DIR``); skips with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf.duration_pb2 import Duration
from tokenizers import Tokenizer

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_cli.dash.server import build_app
from openforge_core.rpc.client import open_channel
from openforge_orchestrator.backends import cgroups
from openforge_orchestrator.backends.local import SANDBOX_DESCRIPTION
from openforge_orchestrator.domain.tasks import TaskCatalog
from openforge_testing.fakes import FAMILY_FORMATS, ScriptedInferenceServer, build_fake_model_dir
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import check_exact_sample, require_sandboxed_harness, wait_samples
from openforge_testing.servers import NatsServer, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
HARNESS_DIR = Path(os.environ.get("OPENFORGE_TEST_HARNESS_DIR", ROOT / ".openforge" / "harnesses"))
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

pytestmark = pytest.mark.slow


class OracleReplay:
    """What the fake engine answers: per task, the tool commands to replay, then submit, in the
    output format of the model directory's family (token ids, the end token included).

    The task is found by its instruction in the prompt; the step by the number of tool results
    the prompt already holds. Safe with concurrent rollouts.
    """

    def __init__(self, model_dir: Path, tool: str = "bash", arg: str = "command", family: str = "hermes") -> None:
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._plans: dict[str, list[str]] = {}
        self._format = FAMILY_FORMATS[family]
        self.tool = tool
        self.arg = arg

    def plan(self, instruction: str, commands: list[str]) -> None:
        self._plans[instruction.strip()] = commands

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        text = self._tok.decode(prompt_ids, skip_special_tokens=False)
        fmt = self._format
        done = fmt.results(text)
        for instruction, commands in self._plans.items():
            if instruction in text:
                steps = [*commands, SUBMIT]
                if done < len(steps):
                    return fmt.call_ids(self._tok, f"Step {done + 1}.", [(self.tool, {self.arg: steps[done]})])
                return fmt.answer_ids(self._tok, "Done.")
        return fmt.answer_ids(self._tok, "I do not know this task.")


def oracle_command(task_set: str, task_id: str) -> str:
    """The task's ``solution/solve.sh`` as one shell command."""
    return "bash -c " + shlex.quote((TASKS / task_set / task_id / "solution" / "solve.sh").read_text())


class Stack:
    """NATS, the fake engine, proxy, store and orchestrator processes of one test."""

    def __init__(
        self, tmp: Path, nats: NatsServer, start: ServiceFactory, family: str = "hermes", **orch_env: str
    ) -> None:
        self.model = build_fake_model_dir(tmp / "model", template=FAMILY_FORMATS[family].template)
        self.replay = OracleReplay(self.model, family=family)
        self.fake = ScriptedInferenceServer(self.model, default=self.replay, tokens_per_message=8)
        self.fake.start_in_thread()
        env = {"OPENFORGE_NATS__URL": nats.url, "OPENFORGE_SERVICES__INFERENCE": self.fake.address}
        self.proxy = start("openforge_proxy", env)
        self.store = start(
            "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'store.db'}"}
        )
        self.artifacts = tmp / "artifacts"
        self.orch_sandboxes = tmp / "sandboxes"
        self.orch: ServiceProcess = start(
            "openforge_orchestrator",
            {
                **env,
                "OPENFORGE_SERVICES__PROXY": self.proxy.address,
                "OPENFORGE_HARNESS__PROXY_HTTP": f"127.0.0.1:{self.proxy.http_port}",
                "OPENFORGE_HARNESS__INSTALL_DIR": str(HARNESS_DIR),
                "OPENFORGE_TASKS__ROOT": str(TASKS),
                "OPENFORGE_SANDBOX__LOCAL__ROOT": str(tmp / "sandboxes"),
                "OPENFORGE_SANDBOX__LOCAL__CACHE": str(tmp / "cache"),
                "OPENFORGE_SANDBOX__LOCAL__ARTIFACTS": str(self.artifacts),
                **orch_env,
            },
        )

    def close(self) -> None:
        self.fake.stop_thread()


@pytest.fixture
def stack(tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory) -> Iterator[Stack]:
    require_sandboxed_harness(HARNESS_DIR, "mini-swe-agent")
    s = Stack(tmp_path, nats_server_fn, service_process)
    yield s
    s.close()


async def _run(
    orch: str,
    task_id: str,
    *,
    harness: str = "mini-swe-agent",
    task_set: str = "train",
    timeout_s: int = 0,
    group_size: int = 1,
    command: tuple[str, ...] = (),
    request_id: str = "",
    min_policy_version: int = 0,
) -> list[common_pb2.Rollout]:
    """Submits rollouts and waits until all are terminal."""
    async with open_channel(orch) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        req = orchestrator_pb2.SubmitRolloutsRequest(
            request_id=request_id or f"{task_id}-{harness}",
            run_id="run-1",
            tasks=[orchestrator_pb2.TaskRef(task_id=task_id, task_set=task_set)],
            group_size=group_size,
            harness=harness,
            model_name="policy-model",
            command=list(command),
            sampling=common_pb2.SamplingParams(temperature=0.7, max_tokens=512),
            min_policy_version=min_policy_version,
        )
        if timeout_s:
            req.timeout.CopyFrom(Duration(seconds=timeout_s))
        resp = await stub.SubmitRollouts(req)
        ids = [r.rollout_id for r in resp.rollouts]
        terminal = {
            common_pb2.ROLLOUT_STATUS_SUCCEEDED,
            common_pb2.ROLLOUT_STATUS_FAILED,
            common_pb2.ROLLOUT_STATUS_TIMED_OUT,
            common_pb2.ROLLOUT_STATUS_CANCELLED,
        }
        done: dict[str, common_pb2.Rollout] = {}
        call = stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id="run-1"), timeout=240)
        async for ev in call:
            if ev.rollout.rollout_id in ids and ev.rollout.status in terminal:
                done[ev.rollout.rollout_id] = ev.rollout
                if len(done) == len(ids):
                    call.cancel()
                    break
        return [done[i] for i in ids]


async def _store_rollout(store: str, rollout_id: str, calls: int) -> trajectory_pb2.GetRolloutResponse:
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        for _ in range(200):
            try:
                got = await stub.GetRollout(trajectory_pb2.GetRolloutRequest(rollout_id=rollout_id))
                if (
                    got.rollout.status != common_pb2.ROLLOUT_STATUS_PENDING
                    and len((await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=rollout_id))).calls) >= calls
                ):
                    return got
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"the store never recorded {rollout_id} with {calls} calls")


def _instruction(task_id: str, task_set: str = "train") -> str:
    return (TASKS / task_set / task_id / "instruction.md").read_text()


async def _calls(store: str, rollout_id: str) -> int:
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        return len((await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=rollout_id))).calls)


def test_mini_swe_agent_oracle_earns_1_wrong_answer_0_hang_killed_with_partial_trajectory(stack: Stack) -> None:
    stack.replay.plan(_instruction("count-lines"), [oracle_command("train", "count-lines")])
    stack.replay.plan(_instruction("sort-numbers"), ["sort /app/numbers.txt > /app/sorted.txt"])  # lexicographic
    stack.replay.plan(_instruction("dedupe-lines"), ["ls /app", "sleep 600"])

    async def scenarios() -> tuple[list[common_pb2.Rollout], ...]:
        return await asyncio.gather(
            _run(stack.orch.address, "count-lines"),
            _run(stack.orch.address, "sort-numbers"),
            _run(stack.orch.address, "dedupe-lines", timeout_s=60),
        )

    (oracle,), (wrong,), (hung,) = asyncio.run(scenarios())

    assert oracle.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, (oracle.failure_reason, oracle.verifier_output)
    assert oracle.reward == 1.0 and "PASS" in oracle.verifier_output
    stored = asyncio.run(_store_rollout(stack.store.address, oracle.rollout_id, 2))
    assert stored.rollout.reward == 1.0 and stored.rollout.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED
    usage = stored.rollout.sandbox_usage  # the sandbox's cgroup, read when the harness ended
    if cgroups.detect().kind == "none":  # an unprivileged container: nothing accounted
        assert not stored.rollout.HasField("sandbox_usage")
    else:  # mini-swe-agent is a Python process: over a tenth of a CPU second and 16 MiB
        assert usage.cpu_time.ToNanoseconds() > 10**8 and usage.peak_memory_bytes > 16 * 2**20, usage
    assert (stack.artifacts / oracle.rollout_id / "agent" / "trajectory.json").is_file()

    assert wrong.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, wrong.failure_reason
    assert wrong.reward == 0.0 and "FAIL" in wrong.verifier_output

    assert hung.status == common_pb2.ROLLOUT_STATUS_TIMED_OUT, hung.failure_reason
    assert hung.failure_reason.startswith("harness timed out")
    assert hung.reward == 0.0  # the verifier ran after the kill
    end, start = hung.end_time.ToSeconds(), hung.start_time.ToSeconds()
    assert 60 <= end - start < 120
    stored = asyncio.run(_store_rollout(stack.store.address, hung.rollout_id, 2))
    assert stored.rollout.status == common_pb2.ROLLOUT_STATUS_TIMED_OUT
    assert asyncio.run(_calls(stack.store.address, hung.rollout_id)) == 2  # ls, then the hanging sleep
    assert [p.name for p in stack.orch_sandboxes.iterdir() if p.name != ".static"] == []  # all removed


@pytest.mark.parametrize("family", sorted(set(FAMILY_FORMATS) - {"hermes"}))
def test_mini_swe_agent_runs_a_task_of_each_model_family_into_one_exact_sample(
    family: str, tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    """mini-swe-agent in its sandbox against a model of each family the proxy parses (hermes,
    the default, is every other test here): the oracle's command, then submit, sampled in the
    family's call format; the verifier gives 1 and the store assembles one exact sample."""
    require_sandboxed_harness(HARNESS_DIR, "mini-swe-agent")
    stack = Stack(tmp_path, nats_server_fn, service_process, family=family)
    try:
        stack.replay.plan(_instruction("count-lines"), [oracle_command("train", "count-lines")])
        (rollout,) = asyncio.run(_run(stack.orch.address, "count-lines"))
        assert rollout.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, (rollout.failure_reason, rollout.verifier_output)
        assert rollout.reward == 1.0
        seen = list(stack.fake.seen)
        assert len(seen) == 2  # the command, then submit
        asyncio.run(_store_rollout(stack.store.address, rollout.rollout_id, len(seen)))
        samples = asyncio.run(wait_samples(stack.store.address, rollout.rollout_id))
        assert len(samples) == 1, [common_pb2.BreakCause.Name(s.break_cause) for s in samples]
        check_exact_sample(samples[0], seen, stack.fake.policy_version)
    finally:
        stack.close()


#: What the proxy's hermes family records.
PARSERS = ["family:hermes", "tool_call:hermes", "reasoning:hermes"]


async def _run_manifest(store: str, run_id: str) -> common_pb2.RunManifest:
    """The run's manifest in the store once it is the complete one (its tokenizer hash set)."""
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        for _ in range(100):
            run = (await stub.GetRun(trajectory_pb2.GetRunRequest(run_id=run_id))).run
            if run.manifest.tokenizer_hash:
                return run.manifest
            await asyncio.sleep(0.1)
    raise AssertionError(f"the store never got the complete manifest of {run_id}: {run.manifest}")


async def _dash_tokenizer(store: str, model_dir: Path, rollout_id: str) -> dict[str, object]:
    """The dashboard's tokenizer note on a rollout's page, decoding with ``model_dir``."""
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(store, model_dir)))
    await client.start_server()
    try:
        resp = await client.get(f"/api/rollouts/{rollout_id}")
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        tokenizer: dict[str, object] = body["tokenizer"]
        return tokenizer
    finally:
        await client.close()


def test_a_rollout_fills_every_run_manifest_field_at_its_source(stack: Stack, tmp_path: Path) -> None:
    """The manifest after one mini-swe-agent rollout through proxy, orchestrator and store: every
    field filled (a field added later and never filled fails the test), each with its source's
    value; the dashboard's tokenizer warning fires for another tokenizer than the served one."""
    stack.replay.plan(_instruction("count-lines"), [oracle_command("train", "count-lines")])
    (done,) = asyncio.run(_run(stack.orch.address, "count-lines", min_policy_version=stack.fake.policy_version))
    assert done.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, done.failure_reason
    manifest = asyncio.run(_run_manifest(stack.store.address, "run-1"))

    filled = {field.name for field, _ in manifest.ListFields()}  # set scalars, messages, lists
    missing = [f.name for f in manifest.DESCRIPTOR.fields if f.name not in filled]
    assert missing == [], manifest
    installed = json.loads((HARNESS_DIR / "mini-swe-agent" / "manifest.json").read_text())
    assert (manifest.run_id, manifest.harness, manifest.model) == ("run-1", "mini-swe-agent", "policy-model")
    assert manifest.harness_version == installed["version"]
    assert manifest.policy_version == stack.fake.policy_version and manifest.sampling.max_tokens == 512
    assert manifest.harness_config_hash.startswith("sha256:")
    tokenizer_bytes = (stack.model / "tokenizer.json").read_bytes()
    assert manifest.tokenizer_hash == "sha256:" + hashlib.sha256(tokenizer_bytes).hexdigest()
    template = (stack.model / "chat_template.jinja").read_text()
    assert manifest.chat_template_hash == "sha256:" + hashlib.sha256(template.encode()).hexdigest()
    assert list(manifest.parsers) == PARSERS
    assert manifest.verifier_version == TaskCatalog(TASKS).verifier_version()
    assert manifest.create_time.seconds > 0
    # local sandboxes run no image: the sandbox program's own version, and what it isolates
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert manifest.sandbox_image_digest == f"{version} ({SANDBOX_DESCRIPTION})"
    assert version.startswith("bubblewrap ")

    # The dashboard compares the tokenizer it decodes with against the manifest's.
    same = asyncio.run(_dash_tokenizer(stack.store.address, stack.model, done.rollout_id))
    assert same["matches_manifest"] is True, same
    other = build_fake_model_dir(tmp_path / "other-model", vocab_size=512)
    differs = asyncio.run(_dash_tokenizer(stack.store.address, other, done.rollout_id))
    assert differs["matches_manifest"] is False, differs


@pytest.fixture
def command_stack(tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory) -> Iterator[Stack]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    s = Stack(tmp_path, nats_server_fn, service_process, OPENFORGE_SCHEDULER__MAX_INFRA_ATTEMPTS="2")
    yield s
    s.close()


#: One Chat Completions call through the proxy, as a harness would make it (no braces: the
#: command template is formatted with str.format).
CURL_ONE_CALL = (
    'python3 -c "import json, os, urllib.request as u; '
    "body = json.dumps(dict(model='policy-model', messages=[dict(role='user', content='hi')])).encode(); "
    "r = u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body, headers=dict("
    "Authorization='Bearer ' + os.environ['OPENAI_API_KEY'], **dict([('Content-Type', 'application/json')]))); "
    'print(u.urlopen(r, timeout=30).read()[:60])"'
)


def test_bypass_crash_retry_and_cancel_with_the_command_harness(command_stack: Stack) -> None:
    s = command_stack
    outside = ("python3", "-c", "import socket; socket.create_connection(('203.0.113.7', 443), timeout=2)")

    async def scenarios() -> tuple[list[common_pb2.Rollout], ...]:
        async def cancel_later() -> list[common_pb2.Rollout]:
            run = asyncio.create_task(
                _run(
                    s.orch.address,
                    "hello-world",
                    harness="command",
                    request_id="cancel",
                    command=("sh", "-c", CURL_ONE_CALL + " && sleep 600"),
                )
            )
            async with open_channel(s.orch.address) as ch:
                stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
                async for ev in stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id="run-1"), timeout=120):
                    r = ev.rollout
                    if r.status == common_pb2.ROLLOUT_STATUS_RUNNING and r.task_id == "hello-world":
                        await asyncio.sleep(8)  # the one model call is made by then
                        await stub.CancelRollout(
                            orchestrator_pb2.CancelRolloutRequest(rollout_id=r.rollout_id, reason="test")
                        )
                        break
            return await run

        return await asyncio.gather(
            _run(s.orch.address, "count-lines", harness="command", command=outside, request_id="outside"),
            _run(s.orch.address, "sort-numbers", harness="command", command=("true",), request_id="nocall"),
            _run(s.orch.address, "dedupe-lines", harness="command", command=("false",), request_id="crash"),
            _run(
                s.orch.address,
                "fibonacci",
                harness="command",
                command=("sh", "-c", CURL_ONE_CALL),
                request_id="onecall",
            ),
            cancel_later(),
        )

    (outside_r,), (nocall,), (crash,), (onecall,), (cancelled,) = asyncio.run(scenarios())
    assert outside_r.status == common_pb2.ROLLOUT_STATUS_FAILED and not outside_r.HasField("reward")
    assert outside_r.failure_reason.startswith("bypass: tried other network destinations: tcp 203.0.113.7:443")
    assert nocall.status == common_pb2.ROLLOUT_STATUS_FAILED and not nocall.HasField("reward")
    assert nocall.failure_reason == "bypass: no model call went through the proxy"
    assert crash.status == common_pb2.ROLLOUT_STATUS_FAILED
    assert crash.failure_reason == "infrastructure: harness exited 1 before its first model call"
    assert onecall.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED and onecall.reward == 0.0, onecall.failure_reason
    assert cancelled.status == common_pb2.ROLLOUT_STATUS_CANCELLED and cancelled.failure_reason == "test"
    assert asyncio.run(_calls(s.store.address, cancelled.rollout_id)) == 1  # its call is kept
    log = s.orch.log()
    assert log.count('"rollout.infra_retry"') >= 1 and crash.rollout_id in log
    assert [p.name for p in s.orch_sandboxes.iterdir() if p.name != ".static"] == []
