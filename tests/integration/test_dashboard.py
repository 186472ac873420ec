"""``openforge dash`` shows a finished run, checked in Debian's headless Chromium.

A run is recorded the way the services record one: the orchestrator's ``RunRegistered`` and
``RolloutsSubmitted`` on a real NATS server; the calls of two rollouts made over HTTP to the real
proxy process (which serves them from a fake engine — a test double that samples scripted token
ids — and publishes ``CallRecorded``); ``RolloutFinished`` with the verifier's output; the
trainer's ``StepCompleted`` per step. The real trajectory store process ingests it all. The
dashboard then runs as its own process (``openforge dash``) against the store's gRPC, and
Chromium loads its pages:

* the run page draws a reward curve with one point per training step and lists the rollouts,
  and its filters narrow the table;
* a rollout page shows each call (the harness's request, the model's answer decoded with the
  run's tokenizer, the splice report), the verifier output, and the assembled sample with every
  token coloured by its loss mask — as many trained tokens as the store's sample has;
* a rollout whose second call started a new conversation shows its second sample's fork cause.

A screenshot of the trajectory page is saved under the test's tmp dir (its path is printed).

``openforge dash --state-dir`` shows a finished run: the real store records a run into a SQLite
file in a state folder and is stopped; the dashboard process then starts its own NATS and store
on that file, answers ``/api/`` with the run, and leaves no process behind after SIGTERM.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from openforge_core.events import EventBus, subject_for
from openforge_core.rpc.client import open_channel
from openforge_core.settings import NatsSettings
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir, final_text, tool_call_text
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import wait_samples
from openforge_testing.servers import NatsServer, free_port, stop_process

RUN = "dash-run"
TASK = "hello-file"
STEPS = 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "exec",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant that runs shell commands."}
USER = {"role": "user", "content": "Create hello.txt containing hello-from-harness."}
VERIFIER_PASS = "PASS test_hello_file: hello.txt contains hello-from-harness\n1 passed in 0.02s"
VERIFIER_FAIL = "FAIL test_hello_file: hello.txt is missing\n1 failed in 0.02s"


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    return path


def _rollout(rollout_id: str, index: int, harness: str = "openclaw") -> common_pb2.Rollout:
    r = common_pb2.Rollout(
        rollout_id=rollout_id, run_id=RUN, task_id=TASK, group_id="g-hello", group_index=index, harness=harness
    )
    r.create_time.FromSeconds(1_790_000_000 + index)
    r.status = common_pb2.ROLLOUT_STATUS_PENDING
    return r


def _ended(r: common_pb2.Rollout, status: int, reward: float | None, verifier: str, failure: str = "") -> Any:
    done = common_pb2.Rollout()
    done.CopyFrom(r)
    done.status = status  # type: ignore[assignment]
    if reward is not None:
        done.reward = reward
    done.verifier_output = verifier
    done.failure_reason = failure
    done.start_time.FromSeconds(r.create_time.seconds + 1)
    done.end_time.FromSeconds(r.create_time.seconds + 9)
    done.sandbox_usage.cpu_time.FromMilliseconds(3500)
    done.sandbox_usage.peak_memory_bytes = (100 + 10 * r.group_index) * 2**20
    return done


async def _publish(nats_url: str, items: list[tuple[str, str, Any]]) -> None:
    bus = EventBus(NatsSettings(url=nats_url))
    await bus.connect()
    try:
        for subject, event_id, msg in items:
            await bus.publish(subject, msg, event_id=event_id)
    finally:
        await bus.close()


async def _chat(proxy_grpc: str, http_port: int, rollout_id: str, conversations: list[list[dict[str, Any]]]) -> int:
    """Posts each conversation's requests as a Chat Completions harness does; returns the calls made.

    Each conversation is a list of messages; after each answer the assistant message is appended
    with a tool result, and the next request carries the whole history.
    """
    async with open_channel(proxy_grpc) as ch:
        created = await proxy_pb2_grpc.ProxyServiceStub(ch).CreateSession(
            proxy_pb2.CreateSessionRequest(
                request_id=rollout_id, rollout_id=rollout_id, run_id=RUN, ttl=Duration(seconds=600)
            )
        )
    calls = 0
    async with aiohttp.ClientSession() as http:
        for turns in conversations:
            messages = list(turns[:2])
            for follow in turns[2:]:
                body = {"model": "fake-model", "messages": messages, "tools": TOOLS, "stream": False}
                async with http.post(
                    f"http://127.0.0.1:{http_port}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {created.api_key}"},
                ) as resp:
                    answer = await resp.json()
                    assert resp.status == 200, answer
                calls += 1
                message = answer["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                call_id = (message.get("tool_calls") or [{"id": "none"}])[0]["id"]
                messages.append({"role": "tool", "tool_call_id": call_id, "content": follow["content"]})
    return calls


def _record_run(nats_url: str, proxy: Any, fake: ScriptedInferenceServer, model_dir: Path) -> None:
    # ro-timeout ran under another harness: the run page compares the two
    a, b, c = _rollout("ro-pass", 0), _rollout("ro-fork", 1), _rollout("ro-timeout", 2, harness="codex")
    tokenizer_hash = "sha256:" + hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).hexdigest()
    manifest = common_pb2.RunManifest(
        run_id=RUN,
        harness="openclaw",
        harness_version="2026.9.6",
        tokenizer_hash=tokenizer_hash,
        parsers=["hermes"],
        model=str(model_dir),
        verifier_version="examples/tasks@1",
    )
    asyncio.run(
        _publish(
            nats_url,
            [
                (
                    subject_for("orchestrator", "run_registered"),
                    f"run/{RUN}",
                    orch.RunRegistered(event_id=f"run/{RUN}", manifest=manifest),
                ),
                (
                    subject_for("orchestrator", "rollouts_submitted"),
                    "submitted/dash",
                    orch.RolloutsSubmitted(event_id="submitted/dash", rollouts=[a, b, c]),
                ),
            ],
        )
    )
    done = "hello.txt written"
    # ro-pass: one conversation of two calls (a tool call, then the final answer) -> one sample.
    fake.script(
        tool_call_text("exec", {"command": "echo hello-from-harness > hello.txt"}, text="I'll create the file."),
        final_text("Done: hello.txt now contains hello-from-harness."),
    )
    calls_a = asyncio.run(
        _chat(proxy.address, proxy.http_port, a.rollout_id, [[SYSTEM, USER, {"content": done}, {"content": "ok"}]])
    )
    # ro-fork: the second call starts a new conversation (a summary instead of the history) -> two samples.
    fake.script(
        tool_call_text("exec", {"command": "cat hello.txt"}),
        final_text("The file is missing."),
    )
    summary = {"role": "user", "content": "Summary of earlier work: cat hello.txt failed. Check the file again."}
    calls_b = asyncio.run(
        _chat(
            proxy.address,
            proxy.http_port,
            b.rollout_id,
            [[SYSTEM, USER, {"content": "No such file"}], [SYSTEM, summary, {"content": "still missing"}]],
        )
    )
    steps = []
    for n in range(1, STEPS + 1):
        ev = trainer_events.StepCompleted(
            event_id=f"step/{RUN}/{n}",
            run_id=RUN,
            step=n,
            policy_version=n,
            metrics={"reward/mean": 0.1 * n + (0.05 if n % 2 else 0.0), "loss/policy": 1.0 / n},
        )
        ev.time.FromSeconds(1_790_000_100 + n)
        steps.append((subject_for("trainer", "step_completed"), f"step/{RUN}/{n}", ev))
    succeeded, timed_out = common_pb2.ROLLOUT_STATUS_SUCCEEDED, common_pb2.ROLLOUT_STATUS_TIMED_OUT
    finished = subject_for("orchestrator", "rollout_finished")
    # The held-out evaluation `openforge train` records before the RL run, under its own run id.
    evals = [_rollout(f"ro-eval-{i}", i) for i in range(2)]
    for r in evals:  # a run and a group of their own (a group id is unique across runs)
        r.run_id, r.group_id = f"{RUN}-eval-before", "g-eval-before"
    asyncio.run(
        _publish(
            nats_url,
            [
                (
                    subject_for("orchestrator", "rollouts_submitted"),
                    "submitted/eval-before",
                    orch.RolloutsSubmitted(event_id="submitted/eval-before", rollouts=evals),
                ),
                *[
                    (
                        finished,
                        f"finished/{r.rollout_id}",
                        orch.RolloutFinished(
                            event_id=f"finished/{r.rollout_id}", rollout=_ended(r, succeeded, 0.5 * i, ""), calls=0
                        ),
                    )
                    for i, r in enumerate(evals)
                ],
                (
                    finished,
                    "finished/ro-pass",
                    orch.RolloutFinished(
                        event_id="finished/ro-pass", rollout=_ended(a, succeeded, 1.0, VERIFIER_PASS), calls=calls_a
                    ),
                ),
                (
                    finished,
                    "finished/ro-fork",
                    orch.RolloutFinished(
                        event_id="finished/ro-fork", rollout=_ended(b, succeeded, 0.0, VERIFIER_FAIL), calls=calls_b
                    ),
                ),
                (
                    finished,
                    "finished/ro-timeout",
                    orch.RolloutFinished(
                        event_id="finished/ro-timeout",
                        rollout=_ended(c, timed_out, None, "", "task timeout (600 s) reached"),
                        calls=0,
                    ),
                ),
                *steps,
            ],
        )
    )


async def _wait_steps(store: str, n: int, timeout_s: float = 30.0, finished: int = 3) -> None:
    async with open_channel(store) as ch:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(ch)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                run = (await stub.GetRun(trajectory_pb2.GetRunRequest(run_id=RUN))).run
                if run.steps == n and run.finished_rollouts == finished:
                    return
            except grpc.aio.AioRpcError as exc:  # NOT_FOUND until the first event is ingested
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            await asyncio.sleep(0.1)
    raise AssertionError(f"the store did not record {n} steps of {RUN}")


@pytest.fixture
def dash_url(
    tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory
) -> Iterator[tuple[str, str, Path]]:
    """A recorded run in a real store and ``openforge dash`` in front of it: (page URL, store address, model dir)."""
    model_dir = build_fake_model_dir(tmp_path / "model")
    fake = ScriptedInferenceServer(model_dir, tokens_per_message=3)
    fake.start_in_thread()
    try:
        env = {"OPENFORGE_NATS__URL": nats_server_fn.url}
        proxy = service_process("openforge_proxy", {**env, "OPENFORGE_SERVICES__INFERENCE": fake.address})
        store = service_process(
            "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp_path / 'store.db'}"}
        )
        _record_run(nats_server_fn.url, proxy, fake, model_dir)
        asyncio.run(_wait_steps(store.address, STEPS))
        up_state = tmp_path / "up"  # the state folder of a running `openforge up`, its resource log
        up_state.mkdir()
        _resource_log(up_state)
        port = free_port()
        log = (tmp_path / "dash.log").open("wb")
        dash = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "openforge_cli.main",
                "dash",
                *("--store", store.address, "--port", str(port)),
                *("--model-dir", str(model_dir)),
                *("--up-state-dir", str(up_state)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "api/runs", timeout=2) as resp:
                        assert resp.status == 200
                        break
                except OSError:
                    assert dash.poll() is None, (tmp_path / "dash.log").read_text()
                    assert time.monotonic() < deadline, "openforge dash did not answer"
                    time.sleep(0.2)
            yield url, store.address, model_dir
        finally:
            stop_process(dash)
            log.close()
    finally:
        fake.stop_thread()


def _headless(chromium: str, tmp: Path, *args: str) -> bytes:
    """Runs headless Chromium (its own profile under ``tmp``) with ``args``; returns its stdout."""
    profile = f"--user-data-dir={tmp / 'chromium-profile'}"
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", profile, "--virtual-time-budget=20000", *args],
        capture_output=True,
        timeout=120,
        check=True,
    ).stdout


def _dom(chromium: str, url: str, tmp: Path) -> str:
    """The page's DOM after its scripts ran (headless Chromium, virtual time)."""
    dom = _headless(chromium, tmp, "--dump-dom", url).decode()
    assert 'data-ready="1"' in dom, dom[-2000:]
    return dom


def _element(dom: str, tag: str, elem_id: str) -> str:
    """The element with this id, for tags that do not nest in this page (svg, table, dl, pre)."""
    m = re.search(rf'<{tag}[^>]*\bid="{re.escape(elem_id)}"[^>]*>.*?</{tag}>', dom, re.S)
    assert m, f"no <{tag} id={elem_id}> in the page"
    return m.group(0)


async def _store_samples(store: str, rollout_id: str) -> list[trajectory_pb2.Sample]:
    return await wait_samples(store, rollout_id)


def test_dashboard_shows_the_curves_rollouts_and_a_trajectory(
    chromium: str, dash_url: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, store, _ = dash_url

    runs = _dom(chromium, url, tmp_path)
    assert f'data-run="{RUN}"' in _element(runs, "table", "runs")

    page = _dom(chromium, f"{url}#/run/{RUN}", tmp_path)
    reward = _element(page, "svg", "curve-reward-mean")
    assert len(re.findall(r'<circle class="pt"', reward)) == STEPS
    assert [int(s) for s in re.findall(r'data-step="(\d+)"', reward)] == list(range(1, STEPS + 1))
    assert len(re.findall(r'<circle class="pt"', _element(page, "svg", "curve-loss-policy"))) == STEPS
    # The held-out evaluation before RL (mean reward 0.25 of its two rollouts) is marked on the reward curve only.
    assert re.findall(r'<circle class="eval"[^>]*data-label="before RL" data-value="0.25"', reward)
    assert '<circle class="eval"' not in _element(page, "svg", "curve-loss-policy")
    manifest = _element(page, "dl", "manifest")
    assert '<dd data-field="harness">openclaw</dd>' in manifest
    # live (--store), the resource curves come from the running `up`'s log (--up-state-dir)
    cpu = re.findall(r'<polyline class="line s\d" data-series="([a-z]+)"', _element(page, "svg", "curve-cpu"))
    assert cpu == ["machine", "proxy", "trainer"], cpu
    assert '<dd data-field="harness_version">2026.9.6</dd>' in manifest
    table = _element(page, "table", "rollouts")
    assert sorted(re.findall(r'data-rollout="([^"]+)"', table)) == ["ro-fork", "ro-pass", "ro-timeout"]
    assert 'data-status="TIMED_OUT"' in table
    outcomes = page[page.index('<div class="card" id="outcomes">') :]
    assert re.findall(r'data-status="([A-Z_]+)" data-count="(\d+)"', _element(outcomes, "p", "outcome-statuses")) == [
        ("SUCCEEDED", "2"),
        ("TIMED_OUT", "1"),
    ]
    causes = _element(outcomes, "table", "failure-causes")
    assert '<tr data-status="TIMED_OUT" data-count="1">' in causes
    assert '<td class="cause">task timeout (N s) reached</td>' in causes
    # per harness: rollouts, mean reward, passed, duration, peak sandbox memory, and per rollout
    # the model calls, sample tokens and samples, read back from the store
    harnesses = _element(page, "table", "harnesses")
    rows = re.findall(r'<tr data-harness="([^"]+)" data-rollouts="(\d+)">(.*?)</tr>', harnesses)
    assert [(name, n) for name, n, _ in rows] == [("codex", "1"), ("openclaw", "2")]
    cells = {name: re.findall(r'<td class="num">([^<]*)</td>', row) for name, _, row in rows}
    tokens = [
        sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in asyncio.run(_store_samples(store, rid)))
        for rid in ("ro-pass", "ro-fork")
    ]
    mean_tokens = f"{sum(tokens) / 2:.0f}"
    # each of the two made 2 calls; ro-pass gave 1 sample, ro-fork 2
    assert cells["openclaw"] == ["2", "0.500", "1 (50%)", "8.0 s", "110 MiB", "2.0", mean_tokens, "1.50"]
    assert cells["codex"] == ["1", "–", "0 (0%)", "8.0 s", "120 MiB", "0.0", "0", "0.00"]  # no call made

    filtered = _dom(chromium, f"{url}#/run/{RUN}?status=SUCCEEDED&min_reward=0.5&task={TASK}", tmp_path)
    assert re.findall(r'data-rollout="([^"]+)"', _element(filtered, "table", "rollouts")) == ["ro-pass"]

    [sample] = asyncio.run(_store_samples(store, "ro-pass"))
    traj = _dom(chromium, f"{url}#/rollout/ro-pass", tmp_path)
    calls = traj[traj.index('<div id="calls">') : traj.index('id="samples"')]
    assert len(re.findall(r'<details class="call"', calls)) == 2
    assert "Create hello.txt containing hello-from-harness." in calls  # the harness's request
    assert "echo hello-from-harness &gt; hello.txt" in calls  # the model's answer, decoded
    assert "Done: hello.txt now contains hello-from-harness." in calls
    assert 'class="break-cause">NONE<' in calls  # the splice report of the second call
    assert VERIFIER_PASS.splitlines()[0] in _element(traj, "pre", "verifier")
    assert '<dd id="sandbox-usage">3.5 s / 100 MiB</dd>' in _element(traj, "dl", "rollout-summary")
    samples = traj[traj.index('id="samples"') :]
    trained = re.findall(r'<span class="tok mask-1"', samples)
    assert len(trained) == sum(sample.loss_mask) > 0
    assert len(re.findall(r'<span class="tok mask-0"', samples)) == len(sample.loss_mask) - sum(sample.loss_mask)
    assert len(re.findall(r'<span class="tok prompt"', samples)) == len(sample.prompt_token_ids)
    assert ">&lt;|im_start|&gt;</span>" in samples  # token text from the run's tokenizer, not ids

    fork = asyncio.run(_store_samples(store, "ro-fork"))
    assert len(fork) == 2 and fork[1].break_cause not in (
        common_pb2.BREAK_CAUSE_NONE,
        common_pb2.BREAK_CAUSE_UNSPECIFIED,
    )
    cause = common_pb2.BreakCause.Name(fork[1].break_cause).removeprefix("BREAK_CAUSE_")
    forked = _dom(chromium, f"{url}#/rollout/ro-fork", tmp_path)
    assert len(re.findall(r'class="card sample"', forked)) == 2
    assert f"fork: {cause}" in forked
    assert VERIFIER_FAIL.splitlines()[0] in forked

    shots = {
        "dashboard-trajectory.png": f"{url}#/rollout/ro-pass",
        "dashboard-fork.png": f"{url}#/rollout/ro-fork",
        "dashboard-run.png": f"{url}#/run/{RUN}",
    }
    for name, page_url in shots.items():
        shot = tmp_path / name
        _headless(chromium, tmp_path, "--hide-scrollbars", "--window-size=1400,2200", f"--screenshot={shot}", page_url)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print("dashboard screenshots:", *(str(tmp_path / n) for n in shots))


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: {pid: command line}."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # it ended meanwhile
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            out[int(entry.name)] = cmdline
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _resource_log(state: Path) -> None:
    """A run folder's resource log as ``openforge train`` writes it (``resource_log``: one sample
    every 5 s; here 13 over a minute, the trainer's CPU time and memory rising)."""
    lines = []
    for i in range(13):
        services = {
            "proxy": {"cpu_s": 1.0 + 0.2 * i, "rss_bytes": 120 * 2**20},
            "trainer": {"cpu_s": 5.0 + 4.0 * i, "rss_bytes": (300 + 20 * i) * 2**20},
        }
        machine = {"cpu_cores": 0.5 + 0.1 * i, "cores": 2, "memory_bytes": 6 * 2**30, "memory_total_bytes": 24 * 2**30}
        lines.append(json.dumps({"t": 1_790_000_000 + 5 * i, "machine": machine, "services": services}))
    (state / "resources.jsonl").write_text("\n".join(lines) + "\n")


def test_dash_state_dir_serves_a_finished_run(
    tmp_path: Path, nats_server_fn: NatsServer, service_process: ServiceFactory, chromium: str
) -> None:
    state = tmp_path / "state"
    model_dir = build_fake_model_dir(state / "models" / "warm-start")
    _resource_log(state)
    store = service_process(
        "openforge_trajectory_store",
        {"OPENFORGE_NATS__URL": nats_server_fn.url, "OPENFORGE_STORE__DSN": f"sqlite:///{state / 'trajectories.db'}"},
    )
    rollout = _rollout("ro-timeout", 0)
    steps = []
    for n in range(1, STEPS + 1):
        ev = trainer_events.StepCompleted(
            event_id=f"step/{RUN}/{n}", run_id=RUN, step=n, policy_version=n, metrics={"reward/mean": 0.1 * n}
        )
        steps.append((subject_for("trainer", "step_completed"), f"step/{RUN}/{n}", ev))
    manifest = common_pb2.RunManifest(run_id=RUN, harness="openclaw", model="policy")  # a served name, as a run records
    asyncio.run(
        _publish(
            nats_server_fn.url,
            [
                (
                    subject_for("orchestrator", "run_registered"),
                    f"run/{RUN}",
                    orch.RunRegistered(event_id=f"run/{RUN}", manifest=manifest),
                ),
                (
                    subject_for("orchestrator", "rollouts_submitted"),
                    "submitted/state",
                    orch.RolloutsSubmitted(event_id="submitted/state", rollouts=[rollout]),
                ),
                (
                    subject_for("orchestrator", "rollout_finished"),
                    "finished/ro-timeout",
                    orch.RolloutFinished(
                        event_id="finished/ro-timeout",
                        rollout=_ended(rollout, common_pb2.ROLLOUT_STATUS_TIMED_OUT, None, "", "timeout"),
                    ),
                ),
                *steps,
            ],
        )
    )
    asyncio.run(_wait_steps(store.address, STEPS, finished=1))
    assert store.stop() == 0  # the run is over: only its SQLite file is left

    port = free_port()
    log_path = tmp_path / "dash-state.log"
    with log_path.open("wb") as log:
        dash = subprocess.Popen(
            [sys.executable, "-m", "openforge_cli.main", "dash", "--state-dir", str(state), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api/"
    children: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                runs = _get_json(url + "runs")["runs"]
                break
            except OSError:
                assert dash.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "openforge dash --state-dir did not answer"
                time.sleep(0.2)
        [run] = runs
        assert (run["run_id"], run["steps"], run["finished_rollouts"]) == (RUN, STEPS, 1)
        metrics = _get_json(f"{url}runs/{RUN}/metrics")
        assert [s["step"] for s in metrics["steps"]] == list(range(1, STEPS + 1))
        [listed] = _get_json(f"{url}runs/{RUN}/rollouts")["rollouts"]
        assert (listed["rollout_id"], listed["status"]) == ("ro-timeout", "TIMED_OUT")
        assert f"tokens decoded with {model_dir / 'tokenizer.json'}" in log_path.read_text()
        resources = _get_json(url + "resources")
        assert [c["label"] for c in resources["cpu"]] == ["machine", "proxy", "trainer"]
        assert resources["cpu"][2]["points"][0] == [0.0833, 0.8]  # 4 s of CPU in 5 s, at 5 s (0.0833 min)

        # the run page draws both resource curves, a line per series, and the outcomes panel
        page = _dom(chromium, f"http://127.0.0.1:{port}/#/run/{RUN}", tmp_path)
        for curve_id, points in (("curve-cpu", ("13", "12", "12")), ("curve-memory", ("13", "13", "13"))):
            lines = re.findall(
                r'<polyline class="line s\d" data-series="([a-z]+)" data-points="(\d+)"',
                _element(page, "svg", curve_id),
            )
            assert lines == list(zip(("machine", "proxy", "trainer"), points, strict=True)), lines
        assert re.findall(r'data-status="([A-Z_]+)" data-count="(\d+)"', _element(page, "p", "outcome-statuses")) == [
            ("TIMED_OUT", "1")
        ]
        shot = tmp_path / "dashboard-resources.png"
        page_url = f"http://127.0.0.1:{port}/#/run/{RUN}"
        _headless(chromium, tmp_path, "--hide-scrollbars", "--window-size=1400,1600", f"--screenshot={shot}", page_url)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        print("dashboard screenshot:", shot)

        children = _children(dash.pid)
        kinds = sorted(
            "nats" if c.split()[0].endswith("nats-server") else "store" if "openforge_trajectory_store" in c else c
            for c in children.values()
        )
        assert kinds == ["nats", "store"], children
        [nats_cmd] = [c for c in children.values() if c.split()[0].endswith("nats-server")]
        jetstream = Path(nats_cmd.split(" -sd ")[1].split()[0])
        assert jetstream.is_dir() and not jetstream.is_relative_to(state)  # not the run's JetStream folder
        assert not (state / "jetstream").exists()

        dash.send_signal(signal.SIGTERM)
        assert dash.wait(30) == 0, log_path.read_text()
        assert [p for p in children if _alive(p)] == []
        assert not jetstream.parent.exists()  # the temporary folder is gone
    finally:
        stop_process(dash)
        for pid in children:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
