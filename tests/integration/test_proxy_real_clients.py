"""The real harness CLIs, unmodified, run a two-turn task through the proxy process, for every
model family the proxy parses.

Claude Code 2.1.332, Codex 0.171.0 and OpenClaw 2026.9.6 (installed from the
npm registry by ``tools/harness-clis/install.sh``; this test skips when they
are not) are each pointed at the proxy only through their documented base-URL
setting, with side traffic off (``shared/reference/harness-protocols.md``).
The engine is a fake (a test double) over a fake model directory of one family
(its template and a tokenizer carrying its special tokens): it samples, in that
family's output format, the tokens of a scripted turn (reasoning where the family
has it, text spelled one token per character, ids its tokenizer would not
produce, then two tool calls: a command that fails and one that writes a file)
while the prompt holds no tool result, and a final text once it does, each
ended with the token that family ends such a turn with. For each CLI and family
the test checks:

* the CLI exits 0 and really ran the tool: the file exists with the content;
* it tried no connection but to the proxy (``HTTPS_PROXY``/``HTTP_PROXY``
  point at a local probe that logs and refuses every request);
* every model call the engine served was recorded (one ``CallRecorded`` on
  NATS per call, with exactly the ids the engine saw and sampled);
* the trajectory store (its own process) assembles the rollout into exactly
  one sample whose tokens are, position by position, the prompt the engine saw
  last and the tokens it sampled, with loss mask 1 exactly on sampled tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from google.protobuf.duration_pb2 import Duration
from tokenizers import Tokenizer

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2, proxy_pb2, proxy_pb2_grpc
from openforge_core.events import subject_for
from openforge_core.record_delta import expand_records
from openforge_core.rpc.client import open_channel
from openforge_testing.fakes import (
    FAMILY_FORMATS,
    Completion,
    FamilyFormat,
    ScriptedInferenceServer,
    build_fake_model_dir,
)
from openforge_testing.plugin import ServiceFactory
from openforge_testing.rollouts import check_exact_sample, finish_rollout, wait_samples
from openforge_testing.servers import NatsServer

pytestmark = pytest.mark.slow

CLIS = Path(__file__).resolve().parents[2] / "tools" / "harness-clis"
BIN = CLIS / "node_modules" / ".bin"
NODE_BIN = CLIS / "node" / "node_modules" / ".bin"
INSTALL = "bash tools/harness-clis/install.sh"

MODEL = "policy-model"
TASK = "Create a file hello.txt containing hello-from-harness, using the shell."
COMMAND = "echo hello-from-harness > hello.txt && cat hello.txt"
CONTENT = "hello-from-harness\n"
FINAL = "Done: hello.txt now contains hello-from-harness."
SAY = "I'll create the file."
THINK = "The file may exist already: I look, and write it."
FAILING = "cat missing.txt"  # exits 1: no such file
KEY_PLACEHOLDER = "<key>"
PORT_PLACEHOLDER = "<port>"


@dataclass(frozen=True)
class Harness:
    """How one CLI is installed, configured and run.

    Attributes:
        name: Test id.
        binary: Its executable under ``node_modules/.bin``.
        tool: The shell tool the fake engine calls and its arguments.
        argv: Command line after the binary (``<port>``/``<key>`` replaced).
        env: Extra environment (placeholders replaced).
        files: Files written under the fresh home before the run (path relative to it: text).
        timeout_s: Wall-clock limit of the run.
    """

    name: str
    binary: str
    tool: tuple[str, dict[str, Any]]
    argv: tuple[str, ...]
    env: dict[str, str]
    files: dict[str, str]
    timeout_s: float = 180.0


CODEX_CONFIG = f"""\
model = "{MODEL}"
model_provider = "openforge"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false

[model_providers.openforge]
name = "OpenForge proxy"
base_url = "http://127.0.0.1:{PORT_PLACEHOLDER}/v1"
env_key = "OPENFORGE_API_KEY"
wire_api = "responses"
"""


def _openclaw_config(api: str) -> str:
    base = f"http://127.0.0.1:{PORT_PLACEHOLDER}" + ("" if api == "anthropic-messages" else "/v1")
    model = {
        "id": MODEL,
        "name": "Policy Model",
        "reasoning": False,
        "input": ["text"],
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "contextWindow": 128000,
        "maxTokens": 8192,
    }
    config = {
        "update": {"checkOnStart": False},
        "models": {
            "mode": "replace",
            "providers": {"openforge": {"baseUrl": base, "apiKey": KEY_PLACEHOLDER, "api": api, "models": [model]}},
        },
        "agents": {"defaults": {"model": {"primary": f"openforge/{MODEL}"}}},
    }
    return json.dumps(config, indent=2)


def _openclaw(api: str) -> Harness:
    return Harness(
        name=f"openclaw-{api}",
        binary="openclaw",
        tool=("exec", {"command": COMMAND}),
        argv=("agent", "exec", "--config", "{home}/openclaw.json5", "--cwd", "{work}", "--json", TASK),
        env={"OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_OFFLINE": "1", "OPENCLAW_HOME": "{home}/.openclaw"},
        files={"openclaw.json5": _openclaw_config(api)},
        timeout_s=240.0,
    )


HARNESSES = [
    Harness(
        name="claude-code",
        binary="claude",
        tool=("Bash", {"command": COMMAND, "description": "Write hello.txt"}),
        argv=("-p", TASK, "--allowedTools", "Bash", "--output-format", "stream-json", "--verbose", "--model", MODEL),
        env={
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{PORT_PLACEHOLDER}",
            "ANTHROPIC_API_KEY": KEY_PLACEHOLDER,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
        files={},
    ),
    Harness(
        name="codex",
        binary="codex",
        tool=("exec_command", {"cmd": COMMAND}),
        argv=("exec", "--skip-git-repo-check", TASK),
        env={"CODEX_HOME": "{home}/.codex", "OPENFORGE_API_KEY": KEY_PLACEHOLDER},
        files={".codex/config.toml": CODEX_CONFIG},
    ),
    _openclaw("openai-completions"),
    _openclaw("openai-responses"),
    _openclaw("anthropic-messages"),
]


class SideTrafficProbe:
    """An HTTP proxy on loopback that logs each request line (``CONNECT host:443 ...``) and refuses it."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, name="side-traffic-probe", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0]
                    self.requests.append(line.decode(errors="replace"))
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    self.requests.append("<connection without a request line>")

    def close(self) -> None:
        self._sock.close()


def _script(model_dir: Path, harness: Harness, family: FamilyFormat) -> Callable[[list[int]], Completion]:
    """The fake engine's answer (token ids, the end token included): the tool call until the
    prompt holds a tool result, then the final text."""
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    name, args = harness.tool

    failing = {k: FAILING if v == COMMAND else v for k, v in args.items()}

    def answer(prompt: list[int]) -> Completion:
        if family.results(tok.decode(prompt, skip_special_tokens=False)):
            return family.answer_ids(tok, FINAL, reasoning="Both calls came back.")
        return family.call_ids(tok, SAY, [(name, failing), (name, args)], reasoning=THINK, odd=True)

    return answer


def _fill(value: str, *, port: int, key: str, home: Path, work: Path) -> str:
    return (
        value.replace(PORT_PLACEHOLDER, str(port))
        .replace(KEY_PLACEHOLDER, key)
        .replace("{home}", str(home))
        .replace("{work}", str(work))
    )


def _run_cli(harness: Harness, tmp: Path, *, port: int, key: str, probe_port: int) -> subprocess.CompletedProcess[str]:
    home = tmp / "home"
    work = tmp / "work"
    home.mkdir()
    work.mkdir()
    for rel, text in harness.files.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_fill(text, port=port, key=key, home=home, work=work))
    probe = f"http://127.0.0.1:{probe_port}"
    env = {
        "PATH": os.pathsep.join([str(NODE_BIN), str(BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": str(tmp),
        "HTTPS_PROXY": probe,
        "HTTP_PROXY": probe,
        "https_proxy": probe,
        "http_proxy": probe,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        **{k: _fill(v, port=port, key=key, home=home, work=work) for k, v in harness.env.items()},
    }
    argv = [str(BIN / harness.binary), *(_fill(a, port=port, key=key, home=home, work=work) for a in harness.argv)]
    return subprocess.run(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=harness.timeout_s,
        check=False,
    )


async def _create_session(proxy_grpc: str, rollout_id: str) -> str:
    async with open_channel(proxy_grpc) as ch:
        created = await proxy_pb2_grpc.ProxyServiceStub(ch).CreateSession(
            proxy_pb2.CreateSessionRequest(
                request_id=rollout_id,
                rollout_id=rollout_id,
                run_id="run",
                model_name=MODEL,
                ttl=Duration(seconds=900),
                sampling=common_pb2.SamplingParams(max_tokens=512),
            )
        )
    return str(created.api_key)


async def _records(nats_url: str, count: int) -> list[common_pb2.CallRecord]:
    """Every ``CallRecorded`` event on the stream (waits until ``count`` arrived, then for stragglers)."""
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe(subject_for("proxy", "call_recorded"), durable="real-clients-test")
        out: list[common_pb2.CallRecord] = []
        for _ in range(20):
            try:
                msgs = await sub.fetch(64, timeout=1 if len(out) >= count else 5)
            except (TimeoutError, nats.errors.TimeoutError):
                if len(out) >= count:
                    break
                continue
            for m in msgs:
                out.append(events_pb2.CallRecorded.FromString(m.data).record)
                await m.ack()
        return out
    finally:
        await nc.close()


@pytest.fixture
def probe() -> Iterator[SideTrafficProbe]:
    p = SideTrafficProbe()
    yield p
    p.close()


@pytest.mark.parametrize("family", sorted(FAMILY_FORMATS))
@pytest.mark.parametrize("harness", HARNESSES, ids=[h.name for h in HARNESSES])
def test_real_cli_runs_a_tool_through_the_proxy_into_one_exact_sample(
    harness: Harness,
    family: str,
    tmp_path: Path,
    nats_server_fn: NatsServer,
    service_process: ServiceFactory,
    probe: SideTrafficProbe,
) -> None:
    if not (BIN / harness.binary).exists():
        pytest.skip(f"the {harness.binary} CLI is not installed (run `{INSTALL}`)")
    if harness.binary == "openclaw" and not (NODE_BIN / "node").exists():
        pytest.skip(f"Node >= 24.16 for OpenClaw is not installed (run `{INSTALL}`)")
    fmt = FAMILY_FORMATS[family]
    model = build_fake_model_dir(tmp_path / "model", template=fmt.template)
    fake = ScriptedInferenceServer(model, default=_script(model, harness, fmt), tokens_per_message=3)
    fake.start_in_thread()
    try:
        env = {"OPENFORGE_NATS__URL": nats_server_fn.url}
        proxy = service_process("openforge_proxy", {**env, "OPENFORGE_SERVICES__INFERENCE": fake.address})
        store = service_process(
            "openforge_trajectory_store", {**env, "OPENFORGE_STORE__DSN": f"sqlite:///{tmp_path / 'store.db'}"}
        )
        rollout_id = f"real-{harness.name}-{family}"
        key = asyncio.run(_create_session(proxy.address, rollout_id))
        run = _run_cli(harness, tmp_path, port=proxy.http_port, key=key, probe_port=probe.port)
        report = f"exit {run.returncode}\n--- stdout ---\n{run.stdout[-4000:]}\n--- stderr ---\n{run.stderr[-4000:]}"
        assert run.returncode == 0, report
        assert (tmp_path / "work" / "hello.txt").read_text() == CONTENT, report
        assert FINAL in run.stdout, report
        assert probe.requests == [], f"side traffic: {probe.requests}"

        seen = list(fake.seen)
        assert len(seen) == 2, [s.request_id for s in seen]
        # both calls ran, the failing one's error included, before the answer was asked for
        last = Tokenizer.from_file(str(model / "tokenizer.json")).decode(seen[1].prompt_ids, skip_special_tokens=False)
        assert fmt.results(last) == 2 and "No such file" in last, last[-3000:]
        sent = asyncio.run(_records(nats_server_fn.url, len(seen)))
        assert len(sent) == len(seen)
        records = expand_records(sent)  # later events are coded against earlier ones (RecordDelta)
        if len(sent[0].request_json) > 20_000:  # a large conversation: the second call is coded against the first
            assert sent[1].HasField("delta") and len(sent[1].request_json) < len(records[1].request_json) // 2
        by_prompt = {tuple(r.prompt_token_ids): r for r in records}
        for s in seen:
            rec = by_prompt[tuple(s.prompt_ids)]
            assert list(rec.completion_token_ids) == s.sampled_ids
            assert list(rec.completion_policy_versions) == [fake.policy_version] * len(s.sampled_ids)
            assert rec.rollout_id == rollout_id and rec.model == MODEL and rec.http_status == 200
            assert key.encode() not in rec.request_json and key not in json.dumps(dict(rec.request_headers))

        asyncio.run(finish_rollout(nats_server_fn.url, rollout_id, len(seen)))
        samples = asyncio.run(wait_samples(store.address, rollout_id))
        assert len(samples) == 1, [common_pb2.BreakCause.Name(s.break_cause) for s in samples]
        check_exact_sample(samples[0], seen, fake.policy_version)
        assert key not in proxy.log()
    finally:
        fake.stop_thread()
