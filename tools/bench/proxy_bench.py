"""Proxy benchmark: the proxy process against a bare pass-through forwarder, on loopback.

Processes (each its own OS process, as deployed):

* a real NATS server (JetStream), where the proxy publishes every call record;
* a **fake** engine (:class:`openforge_testing.fakes.ScriptedInferenceServer`,
  a test double that answers "OK." at once, 3 tokens + end of turn);
* the proxy (``python -m openforge_proxy``) with a fake model whose tokenizer
  is a byte-level BPE of ~32k entries trained on the captured harness requests
  (a Claude Code-sized request of ~155 KB is ~35k tokens, as with a real
  tokenizer);
* the **floor**: a bare pass-through forwarder (this file, ``--role forwarder``),
  an aiohttp low-level server that reads the body and sends the engine a
  ``Generate`` through the proxy's own gRPC client, of a prompt whose length
  follows the body's (the first request's tokens per byte; precomputed ids, so
  no tokenization), then answers the engine's tokens as SSE events or a small JSON
  body: no parsing, no template, no tokenization, no session, no record;
* the client (this process), aiohttp, sending Claude Code-sized Anthropic
  Messages requests (the captured Claude Code first request, its system
  prompt repeated to ``--body-kb``), each conversation growing by the answer
  and a tool result per call, as a harness does.

Measured, forwarder and proxy in the same run:

(a) latency at one session: non-streaming total and streaming time to first
    byte, p50/p99, and "added" = proxy − forwarder (calls to the two interleaved);
(b) calls/s at 32 and 128 concurrent sessions, closed loop (each session sends
    its next call when the previous answer arrived), counted once every session
    made its first two calls (a session's first call tokenizes its whole
    conversation: a one-off cost that would otherwise fill the window at 128);
(c) the proxy's memory (RSS), measured first, on a fresh proxy: per open session (two calls each), and growth
    with recorded calls (rollouts of two calls, sessions closed after; bytes
    per call between two checkpoints, and over the second half alone: bounded
    caches, such as the most recently closed sessions the proxy remembers,
    fill during a warm-up before; RSS moves in steps of the allocator's arenas, so
    a few thousand calls are needed to tell steps from steady growth);
(d) the proxy's CPU per call (all its threads, from ``/proc``) at turn 2 and
    at turn ``--turns`` of a growing conversation.

Usage (about 2 minutes on 2 cores)::

    .venv/bin/python tools/bench/proxy_bench.py
    .venv/bin/python tools/bench/proxy_bench.py --calls 200 --turns 100 --duration 10 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT.parent / "shared" / "cases" / "harness-captures"
FIRST_REQUEST = CAPTURES / "claude-code" / "normal" / "0001_POST_v1_messages.json"
ANSWER = "OK."


# --- fake model ------------------------------------------------------------------------------


def _corpus() -> list[str]:
    """Tokenizer training texts: every captured request body, plus pseudo-words to fill a ~32k vocab."""
    texts = []
    for f in sorted(CAPTURES.glob("*/*/0*.json")):
        body = json.loads(f.read_text()).get("body")
        if body is not None:
            texts.append(json.dumps(body, ensure_ascii=False))
    rng = random.Random(1)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + ["str", "tion", "ing", "er", "an", "th"]
    words: set[str] = set()
    while len(words) < 40_000:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    ordered = sorted(words)
    texts.extend([" ".join(ordered[i : i + 50]) for i in range(0, len(ordered), 50)] * 3)
    return texts


def _first_body(body_kb: int) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(FIRST_REQUEST.read_text())["body"]
    blocks = body["system"]
    while len(json.dumps(body)) < body_kb * 1024:
        blocks.append({"type": "text", "text": blocks[-1]["text"][:4000]})
    body["model"] = "policy-model"
    return body


class Conversation:
    """One harness conversation: the request body, grown by each answer and a tool result."""

    def __init__(self, base: dict[str, Any], tag: str, tool_result_chars: int) -> None:
        self.body = {**base, "messages": [dict(m) for m in base["messages"]]}
        first = self.body["messages"][0]
        first["content"] = [*first["content"], {"type": "text", "text": f"Session {tag}."}]
        self._result = tool_result_chars
        self.turn = 0

    def payload(self, stream: bool) -> bytes:
        return orjson.dumps({**self.body, "stream": stream})

    def answered(self) -> None:
        self.turn += 1
        self.body["messages"] = [
            *self.body["messages"],
            {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": f"tool output {self.turn} " + "x" * self._result}],
            },
        ]


# --- helper processes ------------------------------------------------------------------------


def _serve_engine(model_dir: str, port: int) -> None:
    from openforge_testing.fakes import ScriptedInferenceServer

    async def run() -> None:
        # no script: the fake answers "OK." (ANSWER) without reading the prompt
        fake = ScriptedInferenceServer(Path(model_dir), tokens_per_message=16, keep_requests=False)
        await fake.start(port)
        await asyncio.Event().wait()

    asyncio.run(run())


def _serve_forwarder(engine: str, port: int, prompt_file: str) -> None:
    """The floor: forwards each request to the engine as a prompt as long as the proxy's would be.

    ``prompt_file`` holds ``{"ids": [...], "tokens_per_byte": r}``: ids of a long text (the
    first request body repeated) and the ratio of tokens to body bytes of the first request.
    A request of ``n`` bytes is forwarded as the first ``n * r`` ids, so the engine sees the
    prompt length the proxy's would have (conversations grow; a fixed-length floor would
    charge the proxy for the engine's larger prompts). The packed encoding of every prefix is
    a slice of the whole (varints are a prefix code), so the floor still does no per-token work.
    """
    from aiohttp import web

    from openforge_proxy.adapters.inference import GrpcEngine
    from openforge_proxy.domain.engine import Sampling
    from openforge_proxy.domain.tokens import PackedIds, ids_array, varint

    spec = orjson.loads(Path(prompt_file).read_bytes())
    all_ids = ids_array(spec["ids"])
    per_byte = float(spec["tokens_per_byte"])
    chunks = [varint(i) for i in all_ids]
    offsets = [0]
    for c in chunks:
        offsets.append(offsets[-1] + len(c))
    packed = b"".join(chunks)

    def prompt_for(body: bytes) -> PackedIds:
        n = max(1, min(len(all_ids), int(len(body) * per_byte)))
        return PackedIds(all_ids[:n], packed[: offsets[n]])

    async def run() -> None:
        eng = GrpcEngine(engine)
        sampling = Sampling(max_tokens=64)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            body = await request.read()
            prompt = prompt_for(body)
            stream = b'"stream":true' in body
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                async for d in eng.generate("fwd", prompt, sampling):
                    await resp.write(b"data: " + orjson.dumps({"ids": d.token_ids}) + b"\n\n")
                await resp.write_eof()
                return resp
            ids: list[int] = []
            async for d in eng.generate("fwd", prompt, sampling):
                ids.extend(d.token_ids)
            return web.Response(body=orjson.dumps({"ids": ids}), content_type="application/json")

        server = web.Server(handle, access_log=None)
        runner = web.ServerRunner(server, handle_signals=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(run())


class Child:
    """This file run as a helper process (``--role ...``)."""

    def __init__(self, *args: str) -> None:
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, *args], start_new_session=True)

    def stop(self) -> None:
        from openforge_testing.servers import stop_process

        stop_process(self.proc, 5)


async def _wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as client:
        while True:
            try:
                async with client.get(url) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


# --- /proc readings --------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_ns(pid: int) -> int:
    """CPU time of all the process's threads, nanoseconds (``schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


# --- measurements ----------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def _post(
    client: aiohttp.ClientSession, url: str, payload: bytes, headers: dict[str, str], stream: bool
) -> float:
    """One call; returns the time to the first body byte (streaming) or to the whole answer."""
    t0 = time.perf_counter()
    async with client.post(url, data=payload, headers=headers) as r:
        if stream:
            await r.content.readany()
            first = time.perf_counter() - t0
            await r.read()
        else:
            await r.read()
            first = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {(await r.text())[:300]}")
    return first


class Target:
    """Where calls go: the proxy (a session per conversation) or the forwarder."""

    def __init__(self, name: str, url: str, new_key: Callable[[str], Awaitable[str]] | None) -> None:
        self.name = name
        self.url = url
        self._new_key = new_key

    async def headers(self, tag: str) -> dict[str, str]:
        key = await self._new_key(tag) if self._new_key else "none"
        return {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"}


async def latency(
    targets: list[Target], base: dict[str, Any], calls: int, result_chars: int
) -> dict[str, dict[str, float]]:
    """Latency of one growing conversation per target, the targets' calls interleaved.

    Call ``i`` goes to every target in turn before call ``i + 1``, so both see the same
    conversation length at the same moment and a change of the machine's speed during the
    run (other load, frequency scaling) affects them alike. Even calls are non-streaming,
    odd calls streaming; the first 10 calls of each are not counted.
    """
    convs = {t.name: Conversation(base, f"lat-{t.name}", result_chars) for t in targets}
    headers = {t.name: await t.headers(f"lat-{t.name}-{time.monotonic_ns()}") for t in targets}
    totals: dict[str, list[float]] = {t.name: [] for t in targets}
    ttfbs: dict[str, list[float]] = {t.name: [] for t in targets}
    async with aiohttp.ClientSession() as client:
        for i in range(calls + 10):
            stream = i % 2 == 1
            for t in targets:
                conv = convs[t.name]
                took = await _post(client, t.url, conv.payload(stream), headers[t.name], stream)
                conv.answered()
                if i >= 10:
                    (ttfbs if stream else totals)[t.name].append(took)
    return {
        t.name: {
            "total_p50": _pct(totals[t.name], 0.5),
            "total_p99": _pct(totals[t.name], 0.99),
            "ttfb_p50": _pct(ttfbs[t.name], 0.5),
            "ttfb_p99": _pct(ttfbs[t.name], 0.99),
        }
        for t in targets
    }


async def throughput(target: Target, base: dict[str, Any], sessions: int, duration_s: float) -> float:
    """Closed-loop calls/s of ``sessions`` concurrent conversations, counted over ``duration_s``.

    Warm-up is per session, not a fixed time: each session makes its first two calls (the first
    one tokenizes the whole ~35k-token conversation, the cost of a session's start, paid once)
    and the window opens when every session is past them. With a fixed 2 s warm-up, 128 sessions'
    first calls alone exceed the window and the figure measured session starts, not steady calls.
    """
    keys = [await target.headers(f"tp{sessions}-{i}-{target.name}-{time.monotonic_ns()}") for i in range(sessions)]
    warm = 0
    all_warm = asyncio.Event()
    window: dict[str, float] = {}
    count = 0

    async def one(i: int, client: aiohttp.ClientSession, headers: dict[str, str]) -> None:
        nonlocal count, warm
        conv = Conversation(base, f"tp{sessions}-{i}-{target.name}", 200)
        for _ in range(2):
            await _post(client, target.url, conv.payload(False), headers, False)
            conv.answered()
        warm += 1
        if warm == sessions:
            window["start"] = time.monotonic()
            window["stop"] = window["start"] + duration_s
            all_warm.set()
        await all_warm.wait()
        while time.monotonic() < window["stop"]:
            await _post(client, target.url, conv.payload(False), headers, False)
            conv.answered()
            if time.monotonic() <= window["stop"]:
                count += 1

    conn = aiohttp.TCPConnector(limit=sessions + 8)
    async with aiohttp.ClientSession(connector=conn) as client:
        await asyncio.gather(*(one(i, client, keys[i]) for i in range(sessions)))
    return count / duration_s


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from google.protobuf.duration_pb2 import Duration

    from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    from openforge_core.rpc.client import open_channel
    from openforge_testing.fakes import build_fake_model_dir
    from openforge_testing.servers import NatsServer, ServiceProcess, free_port

    tmp = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    load0 = os.getloadavg()
    print(f"load average at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} CPUs)")
    t0 = time.monotonic()
    model = build_fake_model_dir(tmp / "model", context_length=10_000_000, vocab_size=32768, corpus=_corpus())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    base = _first_body(args.body_kb)
    base_json = json.dumps(base)
    prompt = tok.encode(base_json).ids
    # the floor's prompts: as many ids per body byte as the first request has, up to ~4x its size
    long_ids = prompt * 4
    (tmp / "prompt.json").write_bytes(orjson.dumps({"ids": long_ids, "tokens_per_byte": len(prompt) / len(base_json)}))
    print(
        f"fake tokenizer: {tok.get_vocab_size()} entries (trained in {time.monotonic() - t0:.1f} s); "
        f"request body {len(base_json) // 1024} KB = {len(prompt)} tokens as JSON text"
    )
    engine_port, fwd_port = free_port(), free_port()
    children: list[Child] = []
    results: dict[str, Any] = {"body_kb": len(base_json) // 1024, "load_average_start": load0}
    with NatsServer(tmp / "nats") as nats:
        children.append(Child("--role", "engine", "--model-dir", str(model), "--port", str(engine_port)))
        children.append(
            Child(
                "--role",
                "forwarder",
                "--engine",
                f"127.0.0.1:{engine_port}",
                "--port",
                str(fwd_port),
                "--prompt-file",
                str(tmp / "prompt.json"),
            )
        )
        proxy = ServiceProcess(
            "openforge_proxy",
            {
                "OPENFORGE_NATS__URL": nats.url,
                "OPENFORGE_SERVICES__INFERENCE": f"127.0.0.1:{engine_port}",
                "OPENFORGE_MAX_SESSIONS": "100000",
            },
            tmp / "proxy.log",
        )
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(proxy.start)
            await _wait_http(f"http://127.0.0.1:{proxy.http_port}/health")
            await _wait_http(f"http://127.0.0.1:{fwd_port}/health")
            async with open_channel(proxy.address) as ch:
                stub = proxy_pb2_grpc.ProxyServiceStub(ch)

                async def new_key(tag: str) -> str:
                    r = await stub.CreateSession(
                        proxy_pb2.CreateSessionRequest(
                            request_id=tag, rollout_id=tag, run_id="bench", ttl=Duration(seconds=3600)
                        )
                    )
                    return str(r.api_key)

                url_path = "/v1/messages?beta=true"
                px = Target("proxy", f"http://127.0.0.1:{proxy.http_port}{url_path}", new_key)
                fw = Target("forwarder", f"http://127.0.0.1:{fwd_port}{url_path}", None)
                # (c) runs first, on a fresh proxy: only the model load and one warm-up
                # conversation before it, not the thousands of sessions (a), (b) leave open.
                await latency([px, fw], base, 2, 200)

                print("\n(c) proxy memory (RSS), measured first on a fresh proxy")
                pid = proxy.pid

                async def rollouts(n: int, tag: str, close: bool) -> None:
                    async with aiohttp.ClientSession() as client:
                        sem = asyncio.Semaphore(8)

                        async def one(i: int) -> None:
                            async with sem:
                                rid = f"{tag}-{i}"
                                headers = await px.headers(rid)
                                conv = Conversation(base, rid, 200)
                                for _ in range(2):
                                    await _post(client, px.url, conv.payload(False), headers, False)
                                    conv.answered()
                                if close:
                                    await stub.CloseSession(proxy_pb2.CloseSessionRequest(rollout_id=rid))

                        await asyncio.gather(*(one(i) for i in range(n)))

                rss0 = rss_bytes(pid)
                await rollouts(args.sessions, "mem-open", close=False)
                rss1 = rss_bytes(pid)
                per_session = (rss1 - rss0) / args.sessions
                # warm-up: more closed sessions than the proxy remembers (OPENFORGE_MAX_ENDED_SESSIONS,
                # 256 by default), so that bounded state is full before growth is measured
                await rollouts(max(args.rollouts // 5, 300), "mem-warm", close=True)
                rss2 = rss_bytes(pid)
                half = args.rollouts // 2
                await rollouts(half, "mem-closed-a", close=True)
                rss3 = rss_bytes(pid)
                await rollouts(args.rollouts - half, "mem-closed-b", close=True)
                rss4 = rss_bytes(pid)
                growth = (rss4 - rss2) / (2 * args.rollouts)
                growth_b = (rss4 - rss3) / (2 * (args.rollouts - half))
                results["memory"] = {
                    "per_open_session_kb": per_session / 1024,
                    "growth_per_recorded_call_b": growth,
                    "growth_per_recorded_call_second_half_b": growth_b,
                    "rss_mb": rss4 / 2**20,
                }
                print(
                    f"per open session (2 calls, {len(base_json) // 1024} KB conversation): {per_session / 1024:.0f} KB"
                )
                print(
                    f"growth with recorded calls ({2 * args.rollouts} calls in closed sessions): "
                    f"{growth:.0f} B per call (RSS {rss2 / 2**20:.0f} -> {rss3 / 2**20:.0f} -> {rss4 / 2**20:.0f} MB; "
                    f"second half alone: {growth_b:.0f} B per call)"
                )

                print(f"\n(a) latency at one session, {args.calls} calls (half streaming), ms")
                lat = await latency([fw, px], base, args.calls, 200)
                results["latency_ms"] = lat
                print(f"{'':10} {'total p50':>10} {'total p99':>10} {'ttfb p50':>10} {'ttfb p99':>10}")
                for name, r in lat.items():
                    print(
                        f"{name:10} {r['total_p50']:10.2f} {r['total_p99']:10.2f} {r['ttfb_p50']:10.2f} "
                        f"{r['ttfb_p99']:10.2f}"
                    )
                added = {k: lat["proxy"][k] - lat["forwarder"][k] for k in lat["proxy"]}
                results["added_ms"] = added
                print(
                    f"{'added':10} {added['total_p50']:10.2f} {added['total_p99']:10.2f} {added['ttfb_p50']:10.2f} "
                    f"{added['ttfb_p99']:10.2f}"
                )

                print(f"\n(b) calls/s, closed loop, {args.duration:.0f} s each, counted after 2 calls per session")
                tp: dict[str, dict[int, float]] = {}
                for n in (32, 128):
                    for t in (fw, px):
                        tp.setdefault(t.name, {})[n] = await throughput(t, base, n, args.duration)
                    print(f"{n:4} sessions: forwarder {tp['forwarder'][n]:7.1f}   proxy {tp['proxy'][n]:7.1f}")
                results["calls_per_s"] = tp

                print(f"\n(d) proxy CPU per call (all threads), turn 2 vs turn {args.turns}, 5 sessions")
                per_turn: dict[int, list[float]] = {}
                async with aiohttp.ClientSession() as client:
                    for s in range(5):
                        rid = f"cpu-{s}"
                        headers = await px.headers(rid)
                        conv = Conversation(base, rid, 800)
                        for turn in range(1, args.turns + 1):
                            c0 = cpu_ns(pid)
                            await _post(client, px.url, conv.payload(False), headers, False)
                            per_turn.setdefault(turn, []).append((cpu_ns(pid) - c0) / 1e6)
                            conv.answered()
                near = statistics.median([x for t in (2, 3, 4) for x in per_turn[t]])
                far = statistics.median([x for t in range(args.turns - 2, args.turns + 1) for x in per_turn[t]])
                end_kb = len(conv.payload(False)) // 1024
                results["cpu_ms"] = {"turn2": near, f"turn{args.turns}": far, "end_body_kb": end_kb}
                print(f"turn 2: {near:.2f} ms   turn {args.turns}: {far:.2f} ms   (body {end_kb} KB at the end)")
                load1 = os.getloadavg()
                results["load_average_end"] = load1
                print(f"\nload average at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        finally:
            proxy.stop()
            for c in children:
                c.stop()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--role", choices=["bench", "engine", "forwarder"], default="bench")
    parser.add_argument("--calls", type=int, default=200, help="(a) calls at one session")
    parser.add_argument("--duration", type=float, default=10.0, help="(b) seconds per measurement")
    parser.add_argument("--sessions", type=int, default=100, help="(c) sessions held open")
    parser.add_argument("--rollouts", type=int, default=2000, help="(c) two-call rollouts in closed sessions")
    parser.add_argument("--turns", type=int, default=100, help="(d) turns of the growing conversation")
    parser.add_argument("--body-kb", type=int, default=155)
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--model-dir", default="")
    parser.add_argument("--engine", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--prompt-file", default="")
    a = parser.parse_args()
    if a.role == "bench" and a.turns < 5:
        parser.error("--turns must be at least 5 ((d) compares turns 2-4 with the last three)")
    if a.role == "engine":
        _serve_engine(a.model_dir, a.port)
    elif a.role == "forwarder":
        _serve_forwarder(a.engine, a.port, a.prompt_file)
    else:
        out = asyncio.run(main(a))
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
