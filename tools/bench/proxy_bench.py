"""Proxy benchmark (partial): added latency at one session and per-call cost at turn 2 vs turn N.

Runs in one process on loopback: a fake engine that answers instantly
(:class:`openforge_testing.fakes.ScriptedInferenceServer`, a few tokens), the
real proxy (HTTP server, call core, gRPC inference client; records kept
nowhere), and an aiohttp client sending Claude Code-sized Anthropic requests
(the captured Claude Code first request, its system prompt repeated to reach
``--body-kb``, and a growing history of tool calls and results).

Measured:

* ``engine``: one ``Generate`` of the same prompt ids straight over gRPC (what
  any proxy must at least spend talking to the engine);
* ``proxy total`` (non-streaming) and ``proxy ttfb`` (streaming, first byte)
  per call at one session, p50/p99; "added" = proxy − engine;
* the proxy's CPU per call (process CPU of the whole benchmark process minus
  the engine-only loop's CPU per call) at turn 2 and at turn ``--turns``.

Not yet measured here (see the issue): capacity at 32/128 concurrent sessions,
memory per session and growth with recorded calls, and the bare pass-through
forwarder floor. Usage::

    .venv/bin/python tools/bench/proxy_bench.py --calls 200 --turns 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from openforge.inference.v1 import inference_pb2, inference_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_proxy.adapters.inference import GrpcEngine, sampling_proto
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.handler import CallHandler
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.runtime import ModelRuntime
from openforge_proxy.domain.sessions import Limits, SessionRegistry
from openforge_proxy.http.server import HttpServer
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir

CAPTURE = Path(__file__).resolve().parents[2].parent / "shared/cases/harness-captures/claude-code/normal"


class _Drop:
    async def record(self, data: CallRecordData) -> None:
        return None


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def _first_body(body_kb: int) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((CAPTURE / "0001_POST_v1_messages.json").read_text())["body"]
    blocks = body["system"]
    while len(json.dumps(body)) < body_kb * 1024:
        blocks.append({"type": "text", "text": blocks[-1]["text"][:4000]})
    return body


async def main(args: argparse.Namespace) -> None:
    model = build_fake_model_dir(Path(tempfile.mkdtemp()) / "model", context_length=10_000_000)
    fake = ScriptedInferenceServer(model, default=lambda prompt: "OK.")
    await fake.start()
    engine = GrpcEngine(fake.address)
    runtime = ModelRuntime.load(await engine.model_info())

    async def get_runtime() -> ModelRuntime:
        return runtime

    sessions = SessionRegistry(3600, 1000)
    handler = CallHandler(sessions, engine, get_runtime, _Drop())
    http = HttpServer(handler, "127.0.0.1", 0, 64 << 20)
    port = await http.start()
    url = f"http://127.0.0.1:{port}/v1/messages?beta=true"
    base = _first_body(args.body_kb)
    print(f"request body {len(json.dumps(base)) // 1024} KB")

    # (a) one session, same request repeated (each is a retry attempt: full proxy path, no history growth)
    _, key = sessions.create(
        request_id="a", rollout_id="a", run_id="b", model_name="", limits=Limits(), sampling={}, ttl_s=None
    )
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as client:
        totals: list[float] = []
        ttfbs: list[float] = []
        for i in range(args.calls):
            stream = i % 2 == 1
            t0 = time.perf_counter()
            async with client.post(url, json={**base, "stream": stream}, headers=headers) as r:
                if stream:
                    await r.content.readany()
                    ttfbs.append(time.perf_counter() - t0)
                await r.read()
                assert r.status == 200, await r.text()
            if not stream:
                totals.append(time.perf_counter() - t0)
        state = handler.state("a")
        assert state is not None
        prompt = await _prompt_ids(handler, "a")
        engine_times: list[float] = []
        cpu0 = time.process_time()
        async with open_channel(fake.address) as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            for _ in range(args.calls // 2):
                t0 = time.perf_counter()
                req = inference_pb2.GenerateRequest(
                    prompt_token_ids=prompt, sampling=sampling_proto(Sampling(max_tokens=16))
                )
                async for _m in stub.Generate(req):
                    pass
                engine_times.append(time.perf_counter() - t0)
        engine_cpu = (time.process_time() - cpu0) / max(1, args.calls // 2)
        print(f"prompt tokens {len(prompt)}")
        print(f"engine only      p50 {_pct(engine_times, 0.5):6.2f} ms  p99 {_pct(engine_times, 0.99):6.2f} ms")
        print(f"proxy total      p50 {_pct(totals, 0.5):6.2f} ms  p99 {_pct(totals, 0.99):6.2f} ms")
        print(f"proxy ttfb       p50 {_pct(ttfbs, 0.5):6.2f} ms  p99 {_pct(ttfbs, 0.99):6.2f} ms")
        print(
            f"added (total)    p50 {_pct(totals, 0.5) - _pct(engine_times, 0.5):6.2f} ms"
            f"  p99 {_pct(totals, 0.99) - _pct(engine_times, 0.99):6.2f} ms"
        )

        # (d) CPU per call along one growing session
        _, key2 = sessions.create(
            request_id="d", rollout_id="d", run_id="b", model_name="", limits=Limits(), sampling={}, ttl_s=None
        )
        headers2 = {"x-api-key": key2, "anthropic-version": "2023-06-01"}
        body = {**base, "stream": False, "messages": list(base["messages"])}
        per_turn: dict[int, float] = {}
        for turn in range(1, args.turns + 1):
            c0 = time.process_time()
            async with client.post(url, json=body, headers=headers2) as r:
                answer = await r.json()
                assert r.status == 200, answer
            per_turn[turn] = time.process_time() - c0
            body["messages"] = [
                *body["messages"],
                {"role": "assistant", "content": answer["content"]},
                {"role": "user", "content": [{"type": "text", "text": f"tool output {turn} " + "x" * 800}]},
            ]
        near = [per_turn[t] for t in (2, 3, 4)]
        far = [per_turn[t] for t in range(args.turns - 2, args.turns + 1)]
        print(
            f"CPU per call (whole process, engine share ~{engine_cpu * 1000:.2f} ms): "
            f"turn 2 {statistics.median(near) * 1000:.2f} ms, turn {args.turns} {statistics.median(far) * 1000:.2f} ms"
            f" (body {len(json.dumps(body)) // 1024} KB at the end)"
        )
    await http.stop()
    await engine.close()
    await fake.stop()


async def _prompt_ids(handler: CallHandler, rollout: str) -> list[int]:
    state = handler.state(rollout)
    assert state is not None
    head = next(reversed(state.splicer.heads.values()))
    return list(head.tokens)[:-2]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--body-kb", type=int, default=155)
    asyncio.run(main(parser.parse_args()))
