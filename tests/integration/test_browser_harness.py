"""The browser harness (``openforge-browser``) solves MiniWoB-style tasks through the real proxy.

``openforge tasks miniwob`` writes the task family; for each of a few tasks the harness runs as
its own process: Debian's headless Chromium opens the task's page, the page goes to the model as
an accessibility tree over the proxy's Chat Completions API, and the tool calls are executed in
the browser. The model is a fake engine (a test double that samples scripted token ids) whose
script is a small oracle: it decodes the prompt the proxy rendered, reads the instruction and the
page tree from it, and answers the next action of the plan as a Hermes tool call. The task's own
verifier (``tests/check.py``) then reads the final page state the harness wrote.

* a click task and a form task (type, submit) earn reward 1; the same click task with the wrong
  button clicked earns 0 (the page keeps the first click);
* the proxy recorded every call on NATS (``CallRecorded``), each with the token ids the engine saw
  and sampled, and every call after the first extends the one before it (the harness's history
  only grows, so the episode is one sample);
* the same episode (same scripted completions) with ``--api chat``, ``messages`` and
  ``responses`` earns the same reward and gives the same trainer rows: the same recorded token
  ids per call and, assembled as the trajectory store assembles them, one sample with the same
  prompt, response and loss mask.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest
from click.testing import CliRunner
from google.protobuf.duration_pb2 import Duration
from tokenizers import Tokenizer

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge.proxy.v1 import events_pb2, proxy_pb2, proxy_pb2_grpc
from openforge_cli.main import main as cli
from openforge_core.record_delta import expand_records
from openforge_core.rpc.client import open_channel
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir, final_text, tool_call_text
from openforge_testing.plugin import ServiceFactory
from openforge_testing.servers import NatsServer, free_port
from openforge_trajectory_store.domain.assembly import assemble_records

MODEL = "policy-model"
#: (task id, whether the oracle picks a wrong button instead) → the reward the verifier gives.
CASES = [("click-button-0", False, 1.0), ("enter-text-2", False, 1.0), ("click-button-0", True, 0.0)]


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return path


class Oracle:
    """The fake engine's script: the next action of a fixed plan, read off the decoded prompt."""

    def __init__(self, model_dir: Path) -> None:
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.wrong = False
        #: Instructions the oracle answers with a wrong click.
        self.wrong_for: set[str] = set()

    def __call__(self, prompt_ids: list[int]) -> str:
        prompt = self.tok.decode(prompt_ids, skip_special_tokens=False)
        instruction = re.search(r"Task: (.*)", prompt)
        assert instruction is not None, prompt
        tree = prompt.split("Page:\n")[-1]
        refs = {m.group(2): int(m.group(1)) for m in re.finditer(r'\[(\d+)\] \w+ "([^"]*)"', tree)}
        words = re.findall(r'"([^"]+)"', instruction.group(1))
        wrong = self.wrong or instruction.group(1) in self.wrong_for
        if instruction.group(1).startswith("Click"):
            target = next(w for w in refs if w != words[0]) if wrong else words[0]
            plan = [tool_call_text("click", {"ref": refs[target]}, text=f"I click {target}.")]
        elif instruction.group(1).startswith("Select"):
            plan = [tool_call_text("click", {"ref": refs[w]}) for w in words]
            plan.append(tool_call_text("click", {"ref": refs["Submit"]}))
        else:
            (word,) = words
            plan = [
                tool_call_text("type_text", {"ref": refs["Answer"], "text": word}, text=f"I type {word}."),
                tool_call_text("press_key", {"key": "Tab"}),
                tool_call_text("scroll", {"direction": "down"}),
                tool_call_text("click", {"ref": refs["Submit"]}),
            ]
        plan.append(tool_call_text("done", {"answer": "submitted"}))
        step = prompt.count("<tool_response>")
        return plan[step] if step < len(plan) else final_text("Finished.")


def test_browser_harness_through_the_proxy(
    tmp_path: Path, chromium: str, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    generated = CliRunner().invoke(cli, ["tasks", "miniwob", "--out", str(tmp_path / "tasks")])
    assert generated.exit_code == 0, generated.output
    assert "train: 12 tasks" in generated.output and "test: 6 tasks" in generated.output
    model = build_fake_model_dir(tmp_path / "model", template="qwen3")
    oracle = Oracle(model)
    fake = ScriptedInferenceServer(model, default=oracle)
    fake.start_in_thread()
    http_port = free_port()
    try:
        proxy = service_process(
            "openforge_proxy",
            {
                "OPENFORGE_NATS__URL": nats_server_fn.url,
                "OPENFORGE_SERVICES__INFERENCE": fake.address,
                "OPENFORGE_HTTP__PORT": str(http_port),
            },
        )
        calls: dict[str, int] = {}
        for n, (task_id, wrong, reward) in enumerate(CASES):
            oracle.wrong = wrong
            rollout = f"ro-{n}"
            key = asyncio.run(_session(proxy.address, rollout))
            task = tmp_path / "tasks" / "train" / task_id
            workdir = tmp_path / rollout
            shutil.copytree(task / "environment" / "files", workdir)
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "openforge_browser",
                    "--url",
                    (workdir / "index.html").as_uri(),
                    "--instruction-file",
                    str(task / "instruction.md"),
                    "--model",
                    MODEL,
                    "--max-steps",
                    "6",
                    "--out",
                    str(workdir / "page_state.json"),
                ],
                env={
                    "PATH": str(Path(chromium).parent),
                    "HOME": str(tmp_path),
                    "OPENAI_BASE_URL": f"http://127.0.0.1:{http_port}/v1",
                }
                | {"OPENAI_API_KEY": key},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, run.stderr
            episode = json.loads((workdir / "page_state.json").read_text())
            assert episode["finished"] and episode["answer"] == "submitted", episode
            assert all(not a["result"].startswith("error") for a in episode["actions"]), episode
            calls[rollout] = episode["calls"]
            verdict = subprocess.run(
                [
                    sys.executable,
                    str(task / "tests" / "check.py"),
                    str(workdir / "page_state.json"),
                    str(workdir / "r"),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert verdict.returncode == 0, verdict.stderr
            assert json.loads((workdir / "r").read_text())["reward"] == reward, (task_id, wrong, verdict.stdout)
        records = asyncio.run(_recorded(nats_server_fn.url, sum(calls.values())))
    finally:
        fake.stop_thread()
    assert calls == {"ro-0": 2, "ro-1": 5, "ro-2": 2}
    assert len(fake.seen) == sum(calls.values())
    for rec, seen in zip(records, fake.seen, strict=True):
        assert list(rec.prompt_token_ids) == seen.prompt_ids
        assert list(rec.completion_token_ids) == seen.sampled_ids
        assert rec.http_status == 200
        body = json.loads(rec.request_json)
        # the instruction and the page's accessibility tree, as the model sees them
        assert body["messages"][1]["content"].startswith("Task: ") and "\nPage:\n" in body["messages"][1]["content"]
        assert re.search(r'^\[1\] (button|textbox) "', body["messages"][1]["content"], re.M)
        assert body["model"] == MODEL and [t["function"]["name"] for t in body["tools"]] == [
            "click",
            "type_text",
            "press_key",
            "scroll",
            "done",
        ]
    for rollout, n in calls.items():
        mine = [r for r in records if r.rollout_id == rollout]
        assert len(mine) == n
        for before, after in itertools.pairwise(mine):
            assert after.splice.extends_call_id == before.call_id
    assert proxy.stop() == 0


async def _session(grpc_address: str, rollout_id: str) -> str:
    async with open_channel(grpc_address) as ch:
        created = await proxy_pb2_grpc.ProxyServiceStub(ch).CreateSession(
            proxy_pb2.CreateSessionRequest(
                request_id=rollout_id,
                rollout_id=rollout_id,
                run_id="run-browser",
                model_name=MODEL,
                ttl=Duration(seconds=600),
                sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=256),
            )
        )
    key: str = created.api_key
    return key


def _run_harness(
    task: Path, workdir: Path, http_port: int, key: str, api: str, chromium: str, home: Path
) -> dict[str, Any]:
    """One ``openforge-browser`` episode over ``api`` (its endpoint in that API's SDK variables),
    then the task's verifier; returns the episode record with the verifier's ``reward``."""
    base = f"http://127.0.0.1:{http_port}"
    endpoint = (
        {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key}
        if api == "messages"
        else {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": key}
    )
    shutil.copytree(task / "environment" / "files", workdir)
    state = workdir / "page_state.json"
    argv = ["--url", (workdir / "index.html").as_uri(), "--instruction-file", str(task / "instruction.md")]
    run = subprocess.run(
        [sys.executable, "-m", "openforge_browser", *argv, "--api", api, "--model", MODEL, "--out", str(state)],
        env={"PATH": str(Path(chromium).parent), "HOME": str(home)} | endpoint,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    check = [sys.executable, str(task / "tests" / "check.py"), str(state), str(workdir / "r")]
    verdict = subprocess.run(check, capture_output=True, text=True, timeout=30)
    assert verdict.returncode == 0, verdict.stderr
    episode: dict[str, Any] = json.loads(state.read_text())
    episode["reward"] = json.loads((workdir / "r").read_text())["reward"]
    return episode


def test_the_same_episode_over_each_api_gives_the_same_trainer_rows(
    tmp_path: Path, chromium: str, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    apis = ("chat", "messages", "responses")
    generated = CliRunner().invoke(cli, ["tasks", "miniwob", "--out", str(tmp_path / "tasks")])
    assert generated.exit_code == 0, generated.output
    task = tmp_path / "tasks" / "train" / "enter-text-2"
    model = build_fake_model_dir(tmp_path / "model", template="qwen3")
    fake = ScriptedInferenceServer(model, default=Oracle(model))
    fake.start_in_thread()
    http_port = free_port()
    try:
        proxy = service_process(
            "openforge_proxy",
            {
                "OPENFORGE_NATS__URL": nats_server_fn.url,
                "OPENFORGE_SERVICES__INFERENCE": fake.address,
                "OPENFORGE_HTTP__PORT": str(http_port),
            },
        )
        episodes = {}
        for api in apis:
            key = asyncio.run(_session(proxy.address, api))
            episodes[api] = _run_harness(task, tmp_path / api, http_port, key, api, chromium, tmp_path)
        records = asyncio.run(_recorded(nats_url=nats_server_fn.url, count=3 * 5, durable="browser-apis"))
    finally:
        fake.stop_thread()
    assert proxy.stop() == 0
    for api, episode in episodes.items():
        assert episode["reward"] == 1.0 and episode["finished"] and episode["calls"] == 5, (api, episode)
        assert all(not a["result"].startswith("error") for a in episode["actions"]), (api, episode)
        assert episode["actions"] == episodes["chat"]["actions"], api
    by_api = {api: [r for r in records if r.rollout_id == api] for api in apis}
    wires = {api: {(r.wire_api, r.http_status) for r in rows} for api, rows in by_api.items()}
    assert wires == {
        "chat": {(common_pb2.WIRE_API_OPENAI_CHAT_COMPLETIONS, 200)},
        "messages": {(common_pb2.WIRE_API_ANTHROPIC_MESSAGES, 200)},
        "responses": {(common_pb2.WIRE_API_OPENAI_RESPONSES, 200)},
    }
    # the wire bodies differ (tool_result blocks, function_call_output items) ...
    second = {api: json.loads(rows[1].request_json) for api, rows in by_api.items()}
    assert second["messages"]["tools"][0]["input_schema"]["required"] == ["ref"]
    assert second["messages"]["system"] and second["responses"]["instructions"]
    assert [b["type"] for b in second["messages"]["messages"][-1]["content"]] == ["tool_result"]
    assert [i["type"] for i in second["responses"]["input"][-3:]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    # ... the tokens the engine saw and sampled do not
    tokens = {
        api: [(list(r.prompt_token_ids), list(r.completion_token_ids)) for r in rows] for api, rows in by_api.items()
    }
    assert len(tokens["chat"]) == 5 and tokens["messages"] == tokens["chat"] and tokens["responses"] == tokens["chat"]
    rows = {}
    for api in apis:
        rollout = common_pb2.Rollout(rollout_id=api, status=common_pb2.ROLLOUT_STATUS_SUCCEEDED, reward=1.0)
        (sample,) = assemble_records(rollout, by_api[api])  # one sample: every call extends the last
        assert sample.break_cause == common_pb2.BREAK_CAUSE_NONE and len(sample.call_ids) == 5
        rows[api] = (list(sample.prompt_token_ids), list(sample.response_token_ids), list(sample.loss_mask))
        assert sum(sample.loss_mask) == sum(len(c) for _, c in tokens[api])
    assert rows["messages"] == rows["chat"] and rows["responses"] == rows["chat"]


async def _recorded(nats_url: str, count: int, durable: str = "browser-harness") -> list[Any]:
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe("openforge.proxy.v1.call_recorded", durable=durable)
        out: list[Any] = []
        while len(out) < count:
            for m in await sub.fetch(count - len(out), timeout=10):
                out.append(events_pb2.CallRecorded.FromString(m.data).record)
                await m.ack()
        return expand_records(out)
    finally:
        await nc.close()


@pytest.mark.slow
def test_orchestrator_runs_the_browser_harness_in_its_sandbox(
    tmp_path: Path, chromium: str, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> None:
    """The orchestrator runs ``browser`` rollouts in local (bubblewrap) sandboxes, over the wire API
    its settings file names (here Anthropic Messages); the task's own verifier scores each: the
    oracle's clicks earn 1, a wrong click 0."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install -y bubblewrap)")
    runner = CliRunner()
    assert runner.invoke(cli, ["tasks", "miniwob", "--out", str(tmp_path / "tasks")]).exit_code == 0
    installed = runner.invoke(cli, ["harness", "install", "browser", "--dir", str(tmp_path / "harnesses")])
    assert installed.exit_code == 0, installed.output
    model = build_fake_model_dir(tmp_path / "model", template="qwen3")
    oracle = Oracle(model)
    oracle.wrong_for.add((tmp_path / "tasks" / "train" / "click-button-1" / "instruction.md").read_text().strip())
    fake = ScriptedInferenceServer(model, default=oracle, tokens_per_message=8)
    fake.start_in_thread()
    try:
        env = {"OPENFORGE_NATS__URL": nats_server_fn.url, "OPENFORGE_SERVICES__INFERENCE": fake.address}
        proxy = service_process("openforge_proxy", env)
        settings = tmp_path / "browser.json"
        settings.write_text(json.dumps({"api": "messages"}))
        orch = service_process(
            "openforge_orchestrator",
            {
                **env,
                "OPENFORGE_SERVICES__PROXY": proxy.address,
                "OPENFORGE_HARNESS__PROXY_HTTP": f"127.0.0.1:{proxy.http_port}",
                "OPENFORGE_HARNESS__INSTALL_DIR": str(tmp_path / "harnesses"),
                "OPENFORGE_TASKS__ROOT": str(tmp_path / "tasks"),
                "OPENFORGE_SANDBOX__LOCAL__ROOT": str(tmp_path / "sandboxes"),
                "OPENFORGE_SANDBOX__LOCAL__CACHE": str(tmp_path / "cache"),
                "OPENFORGE_SANDBOX__LOCAL__ARTIFACTS": str(tmp_path / "artifacts"),
                "OPENFORGE_HARNESS__CONFIG_FILES": json.dumps({"browser": str(settings)}),
            },
        )
        done = asyncio.run(_submit(orch.address, ["click-checkboxes-0", "click-button-1"]))
        records = asyncio.run(_recorded(nats_server_fn.url, 4 + 2, durable="browser-sandbox"))
    finally:
        fake.stop_thread()
    status = {r.task_id: (r.status, r.reward, r.failure_reason) for r in done}
    assert status == {
        "click-checkboxes-0": (common_pb2.ROLLOUT_STATUS_SUCCEEDED, 1.0, ""),
        "click-button-1": (common_pb2.ROLLOUT_STATUS_SUCCEEDED, 0.0, ""),
    }, [(r.task_id, r.verifier_output) for r in done]
    assert len(fake.seen) == 4 + 2  # 2 checkboxes, Submit, done; a click, done
    assert {(r.wire_api, r.http_status) for r in records} == {(common_pb2.WIRE_API_ANTHROPIC_MESSAGES, 200)}


async def _submit(orch: str, task_ids: list[str]) -> list[common_pb2.Rollout]:
    async with open_channel(orch) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        resp = await stub.SubmitRollouts(
            orchestrator_pb2.SubmitRolloutsRequest(
                request_id="browser",
                run_id="run-browser",
                tasks=[orchestrator_pb2.TaskRef(task_id=t, task_set="train") for t in task_ids],
                group_size=1,
                harness="browser",
                model_name=MODEL,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=256),
            )
        )
        ids = {r.rollout_id for r in resp.rollouts}
        terminal = {
            common_pb2.ROLLOUT_STATUS_SUCCEEDED,
            common_pb2.ROLLOUT_STATUS_FAILED,
            common_pb2.ROLLOUT_STATUS_TIMED_OUT,
            common_pb2.ROLLOUT_STATUS_CANCELLED,
        }
        out: dict[str, common_pb2.Rollout] = {}
        call = stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id="run-browser"), timeout=120)
        async for ev in call:
            if ev.rollout.rollout_id in ids and ev.rollout.status in terminal:
                out[ev.rollout.rollout_id] = ev.rollout
                if len(out) == len(ids):
                    call.cancel()
                    break
        return list(out.values())
