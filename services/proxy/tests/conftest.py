"""Proxy test support: an in-process proxy over a fake (scripted) inference server.

The proxy under test is the real one (HTTP server, call core, gRPC inference
client); only the engine is a fake (:class:`openforge_testing.fakes.ScriptedInferenceServer`)
and records go to a list instead of NATS.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from openforge.common.v1.common_pb2 import SamplingParams
from openforge_proxy.adapters.body_parser import ProcessBodyParser
from openforge_proxy.adapters.inference import GrpcEngine
from openforge_proxy.domain.admission import Admission
from openforge_proxy.domain.handler import CallHandler
from openforge_proxy.domain.offload import OFFLOAD_MIN_BYTES
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.sessions import Limits, SessionRegistry
from openforge_proxy.http.metrics import HttpMetrics
from openforge_proxy.http.server import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, HttpServer
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir


class ListRecorder:
    """Keeps records in a list (the service publishes them to NATS instead)."""

    def __init__(self) -> None:
        self.records: list[CallRecordData] = []
        self.fail: Exception | None = None
        #: Like ``fail``, for the records of answered calls only (a failed call's record, without
        #: ids or bodies, still goes through, as a small record does past a bus's size limit).
        self.fail_answered: Exception | None = None
        #: When set, a record is acknowledged (or fails) only after this wait, as over a network.
        self.ack_delay_s = 0.0

    def encode_parts(self, *fields: object) -> None:
        return None

    async def record(self, data: CallRecordData) -> None:
        if self.ack_delay_s:
            await asyncio.sleep(self.ack_delay_s)
        if self.fail is not None:
            raise self.fail
        if self.fail_answered is not None and not data.error:
            raise self.fail_answered
        self.records.append(data)

    @property
    def answered(self) -> list[CallRecordData]:
        """The records of answered calls."""
        return [r for r in self.records if not r.error]

    @property
    def failed(self) -> list[CallRecordData]:
        """The records of calls admitted and not answered."""
        return [r for r in self.records if r.error]


@dataclass
class Reply:
    """One HTTP answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[tuple[str | None, Any]]:
        """The SSE events, strictly parsed (every data line must be JSON or ``[DONE]``)."""
        return parse_sse(self.body)


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """Parses an SSE body strictly: blocks separated by blank lines, one ``data:`` line each."""
    text = raw.decode()
    assert text.endswith("\n\n"), "stream does not end with a blank line"
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n")[:-1]:
        event: str | None = None
        data: Any = None
        lines = block.split("\n")
        for line in lines:
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                payload = line[6:]
                data = "[DONE]" if payload == "[DONE]" else json.loads(payload)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        assert data is not None, f"SSE block without data: {block!r}"
        out.append((event, data))
    return out


class InProcessProxy:
    """The proxy's HTTP server and core, in this event loop, over a fake engine."""

    def __init__(
        self,
        fake: ScriptedInferenceServer,
        *,
        max_body_bytes: int = 32 << 20,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        offload_min_bytes: int = OFFLOAD_MIN_BYTES,
        body_parser_min_bytes: int | None = None,
        memos: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.fake = fake
        self._template_kwargs = template_kwargs
        self.sessions = SessionRegistry(3600, 1000)
        self.recorder = ListRecorder()
        self._max_body = max_body_bytes
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        self._offload_min_bytes = offload_min_bytes
        self._memos = memos
        #: The large-body parser process (``body_parser_min_bytes``; None: without one).
        self.body_parser = ProcessBodyParser(body_parser_min_bytes) if body_parser_min_bytes is not None else None
        self.engine: GrpcEngine | None = None
        self.handler: CallHandler | None = None
        self.http: HttpServer | None = None
        self.client: aiohttp.ClientSession | None = None
        self.runtime: ModelRuntime | None = None
        self.metrics_registry = CollectorRegistry()

    async def start(self) -> InProcessProxy:
        await self.fake.start()
        self.engine = GrpcEngine(self.fake.address, info_timeout_s=5)

        async def runtime() -> ModelRuntime:
            if self.runtime is None:
                assert self.engine is not None
                self.runtime = ModelRuntime.load(await self.engine.model_info(), template_kwargs=self._template_kwargs)
            return self.runtime

        admission = Admission(
            self.sessions,
            runtime,
            offload_min_bytes=self._offload_min_bytes,
            body_parser=self.body_parser,
            memos=self._memos,
        )
        self.handler = CallHandler(self.sessions, self.engine, self.recorder, admission)
        self.http = HttpServer(
            self.handler,
            "127.0.0.1",
            0,
            self._max_body,
            header_timeout_s=self._header_timeout_s,
            body_timeout_s=self._body_timeout_s,
            metrics=HttpMetrics(self.metrics_registry),
        )
        await self.http.start()
        self.client = aiohttp.ClientSession(auto_decompress=False)
        return self

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.http is not None:
            await self.http.stop()
        if self.engine is not None:
            await self.engine.close()
        if self.body_parser is not None:
            await asyncio.to_thread(self.body_parser.close)
        await self.fake.stop()

    @property
    def base(self) -> str:
        assert self.http is not None
        return f"http://127.0.0.1:{self.http.port}"

    def session(
        self,
        rollout_id: str = "r1",
        *,
        model_name: str = "",
        limits: Limits | None = None,
        harness: str = "",
        **sampling: Any,
    ) -> str:
        """Opens a session; returns its key."""
        _, key = self.sessions.create(
            request_id=rollout_id,
            rollout_id=rollout_id,
            run_id="run",
            model_name=model_name,
            limits=limits or Limits(),
            sampling=SamplingParams(**sampling) if sampling else SamplingParams(temperature=1.0),
            ttl_s=None,
            harness=harness,
        )
        return key

    async def post(
        self,
        path: str,
        body: Any,
        *,
        key: str | None = None,
        bearer: bool = False,
        headers: Mapping[str, str] = {},
    ) -> Reply:
        """POSTs JSON (or raw bytes) with the key as ``x-api-key`` or Bearer."""
        assert self.client is not None
        h = dict(headers)
        if key is not None:
            if bearer:
                h["Authorization"] = f"Bearer {key}"
            else:
                h["x-api-key"] = key
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
        async with self.client.post(self.base + path, data=data, headers=h) as resp:
            raw = await resp.read()
            return Reply(resp.status, CIMultiDict(resp.headers), raw)

    async def get(self, path: str, headers: Mapping[str, str] = {}) -> Reply:
        assert self.client is not None
        async with self.client.get(self.base + path, headers=dict(headers)) as resp:
            return Reply(resp.status, CIMultiDict(resp.headers), await resp.read())


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with the Hermes template (reasoning kept in history)."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model"), template="hermes")


@pytest.fixture(scope="session")
def qwen3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with the Qwen3-style template (past reasoning dropped)."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-qwen3"), template="qwen3")


@pytest.fixture
async def proxy(model_dir: Path) -> AsyncIterator[InProcessProxy]:
    """An in-process proxy over a fake engine with an empty script."""
    p = await InProcessProxy(ScriptedInferenceServer(model_dir)).start()
    try:
        yield p
    finally:
        await p.stop()


StartProxy = Callable[..., Awaitable[InProcessProxy]]


@pytest.fixture
async def start_proxy() -> AsyncIterator[StartProxy]:
    """Starts in-process proxies over given fake engines (keyword options as
    :class:`InProcessProxy`'s); all are stopped at teardown."""
    started: list[InProcessProxy] = []

    async def start(fake: ScriptedInferenceServer, **options: Any) -> InProcessProxy:
        p = await InProcessProxy(fake, **options).start()
        started.append(p)
        return p

    yield start
    for p in started:
        await p.stop()


@pytest.fixture(scope="session")
def llama3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake model directory with a Llama 3.1-style template and Llama 3's special tokens."""
    return build_fake_model_dir(tmp_path_factory.mktemp("fake-model-llama3"), template="llama3")
