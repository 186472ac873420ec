"""Proxy big-body probe: other sessions' small calls while one ~30 MiB request arrives.

Processes (each its own OS process, as deployed; the same set as ``proxy_bench.py``):

* a real NATS server (JetStream), where the proxy publishes every call record;
* a **fake** engine (:class:`openforge_testing.fakes.ScriptedInferenceServer`, a test double
  that answers "OK." at once);
* the proxy (``python -m openforge_proxy``) over a fake model (small byte-level BPE
  vocabulary; context ``--context`` tokens, 131072 by default, as a real model's);
* the big sender (this file, ``--role big``): ``--big`` times, after ``--gap`` seconds
  without, one ``--big-mb`` MiB request (a single user message) from a session of its own,
  its API cycling through Anthropic Messages, Chat Completions and Responses; its own process,
  so that sending it does not slow down the client below;
* the client (this process), aiohttp: small non-streaming Anthropic Messages calls (a ~2 KB
  conversation) from ``--sessions`` sessions in turn, ``--rate`` per second whatever the
  answers' times (open loop: the proxy is not saturated, so latency is what is measured), for
  the whole run.

The whole probe runs once per ``--modes`` entry, in the same run, each with a fresh proxy:
``off`` is the reference path (``OPENFORGE_LARGE_BODY__PROCESS=false``: every body parsed in
the proxy's process, large ones in a worker thread), ``on`` the large-body parser process
(``OPENFORGE_LARGE_BODY__PROCESS=true``, bodies from ``OPENFORGE_LARGE_BODY__MIN_BYTES``);
``--rounds`` repeats the modes in turn (off, on, off, on...), so that a machine whose load
changes meanwhile weighs on both alike. A table compares them at the end, each run and each
mode's median.

In each mode, the small calls are counted in two groups: **big**, those whose time overlaps
a big request's (from the first byte sent to its answer), and **quiet**, those at least
``--settle`` seconds away from every big request. Reported: each group's latency p50/p99 (ms)
and count; the ratio of the big group's p99 to the quiet group's (the target: at most 2); each
big request's status and time to answer; the proxy's RSS (MiB) before and after.

Usage (about a minute per mode on 2 cores)::

    .venv/bin/python tools/bench/proxy_big_body_bench.py
    .venv/bin/python tools/bench/proxy_big_body_bench.py --sessions 16 --big 12 --json out.json
    .venv/bin/python tools/bench/proxy_big_body_bench.py --rounds 3
    .venv/bin/python tools/bench/proxy_big_body_bench.py --modes on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

BIG_APIS = (
    ("/v1/messages", "anthropic"),
    ("/v1/chat/completions", "chat"),
    ("/v1/responses", "responses"),
)


def _serve_engine(model_dir: str, port: int) -> None:
    from openforge_testing.fakes import ScriptedInferenceServer

    async def run() -> None:
        fake = ScriptedInferenceServer(Path(model_dir), keep_requests=False)
        await fake.start(port)
        await asyncio.Event().wait()

    asyncio.run(run())


def _send_big(url: str, key: str, count: int, gap_s: float, mib: int, out: str) -> None:
    """Sends ``count`` big requests one at a time, ``gap_s`` seconds apart; writes each one's
    API, status, error message and start and end (``time.monotonic()``) to ``out`` as JSON."""

    async def run() -> list[dict[str, Any]]:
        bodies = {api: big_body(api, mib) for _, api in BIG_APIS}
        done: list[dict[str, Any]] = []
        hdrs = {
            "x-api-key": key,
            "Authorization": f"Bearer {key}",
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        }
        async with aiohttp.ClientSession() as client:
            for i in range(count):
                await asyncio.sleep(gap_s)
                path, api = BIG_APIS[i % len(BIG_APIS)]
                t0 = time.monotonic()
                async with client.post(url + path, data=bodies[api], headers=hdrs) as r:
                    body = await r.read()
                    status = r.status
                t1 = time.monotonic()
                err = orjson.loads(body).get("error", {}) if status != 200 else {}
                done.append(
                    {
                        "api": api,
                        "status": status,
                        "start": t0,
                        "end": t1,
                        "error": err.get("message", "") if isinstance(err, dict) else "",
                    }
                )
        return done

    Path(out).write_bytes(orjson.dumps(asyncio.run(run())))


class Child:
    """This file run as a helper process (``--role ...``)."""

    def __init__(self, *args: str) -> None:
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, *args], start_new_session=True)

    def stop(self) -> None:
        from openforge_testing.servers import stop_process

        stop_process(self.proc, 5)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def small_body(i: int) -> bytes:
    """A ~2 KB Anthropic Messages request, its user message unique to call ``i``."""
    return orjson.dumps(
        {
            "model": "policy-model",
            "max_tokens": 32,
            "system": "You are a terse assistant. " * 20,
            "messages": [
                {"role": "user", "content": f"Task {i}: " + "describe the file listing briefly. " * 30},
            ],
        }
    )


def big_body(api: str, mib: int) -> bytes:
    """A request of about ``mib`` MiB: one user message of plain text."""
    text = ("lorem ipsum dolor sit amet consectetur " * ((mib << 20) // 39 + 1))[: mib << 20]
    if api == "anthropic":
        body: dict[str, Any] = {
            "model": "policy-model",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": text}],
        }
    elif api == "chat":
        body = {"model": "policy-model", "messages": [{"role": "user", "content": text}]}
    else:
        body = {
            "model": "policy-model",
            "stream": False,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        }
    return orjson.dumps(body)


MODES = {"off": "false", "on": "true"}  # mode -> OPENFORGE_LARGE_BODY__PROCESS


async def main(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from google.protobuf.duration_pb2 import Duration

    from openforge.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    from openforge_core.rpc.client import open_channel
    from openforge_testing.fakes import build_fake_model_dir
    from openforge_testing.servers import NatsServer, ServiceProcess, free_port

    tmp = Path(tempfile.mkdtemp(prefix="proxy-big-body-"))
    print(f"\n=== mode {mode}: OPENFORGE_LARGE_BODY__PROCESS={MODES[mode]}")
    load0 = os.getloadavg()
    print(f"load average at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} ({os.cpu_count()} CPUs)")
    model = build_fake_model_dir(tmp / "model", context_length=args.context)
    size = len(big_body("anthropic", args.big_mb)) / 2**20
    print(f"big request: {size:.1f} MiB; model context {args.context} tokens")
    engine_port = free_port()
    engine = Child("--role", "engine", "--model-dir", str(model), "--port", str(engine_port))
    results: dict[str, Any] = {"mode": mode, "load_average_start": load0, "big_mib": size}
    with NatsServer(tmp / "nats") as nats:
        proxy = ServiceProcess(
            "openforge_proxy",
            {
                "OPENFORGE_NATS__URL": nats.url,
                "OPENFORGE_SERVICES__INFERENCE": f"127.0.0.1:{engine_port}",
                "OPENFORGE_LARGE_BODY__PROCESS": MODES[mode],
            },
            tmp / "proxy.log",
        )
        try:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(proxy.start)
            base = f"http://127.0.0.1:{proxy.http_port}"
            async with open_channel(proxy.address) as ch:
                stub = proxy_pb2_grpc.ProxyServiceStub(ch)

                async def new_key(tag: str) -> str:
                    r = await stub.CreateSession(
                        proxy_pb2.CreateSessionRequest(
                            request_id=tag, rollout_id=tag, run_id="bench", ttl=Duration(seconds=3600)
                        )
                    )
                    return str(r.api_key)

                def headers(key: str) -> dict[str, str]:
                    return {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"}

                keys = [await new_key(f"small-{i}-{time.monotonic_ns()}") for i in range(args.sessions)]
                big_key = await new_key(f"big-{time.monotonic_ns()}")
                conn = aiohttp.TCPConnector(limit=args.sessions + 8)
                async with aiohttp.ClientSession(connector=conn) as client:
                    counter = 0
                    calls: list[tuple[float, float]] = []  # (start, end), time.monotonic()

                    async def small(key: str) -> None:
                        nonlocal counter
                        counter += 1
                        t0 = time.monotonic()
                        async with client.post(
                            base + "/v1/messages", data=small_body(counter), headers=headers(key)
                        ) as r:
                            await r.read()
                            if r.status != 200:
                                raise RuntimeError(f"small call: {r.status} {(await r.text())[:300]}")
                        calls.append((t0, time.monotonic()))

                    # warm-up: the model is loaded, every session has made a call
                    await asyncio.gather(*(small(k) for k in keys))
                    calls.clear()
                    pid = proxy.pid
                    rss0 = rss_mib(pid)
                    out = tmp / "big.json"
                    sender = Child(
                        "--role", "big", "--url", base, "--key", big_key, "--big", str(args.big),
                        "--gap", str(args.gap), "--big-mb", str(args.big_mb), "--out", str(out),
                    )  # fmt: skip
                    done = asyncio.Event()

                    async def load() -> None:
                        """Open loop: a call every 1/rate s, whatever the answers' times (the
                        proxy keeps headroom: latency is measured, not capacity)."""
                        pending: set[asyncio.Task[None]] = set()
                        t_next = time.monotonic()
                        i = 0
                        while not done.is_set():
                            task = asyncio.create_task(small(keys[i % len(keys)]))
                            pending.add(task)
                            task.add_done_callback(pending.discard)
                            i += 1
                            t_next += 1 / args.rate
                            await asyncio.sleep(max(0.0, t_next - time.monotonic()))
                        await asyncio.gather(*pending)

                    async def wait_sender() -> None:
                        await asyncio.to_thread(sender.proc.wait)
                        await asyncio.sleep(args.gap)  # quiet calls after the last big request too
                        done.set()

                    await asyncio.gather(wait_sender(), load())
                    rss1 = rss_mib(pid)
            bigs_done: list[dict[str, Any]] = orjson.loads(out.read_bytes())
            spans = [(b["start"], b["end"]) for b in bigs_done]
            lat: dict[str, list[float]] = {"quiet": [], "big": []}
            for t0, t1 in calls:
                if any(t0 < e and t1 > s for s, e in spans):
                    lat["big"].append(t1 - t0)
                elif all(t1 < s - args.settle or t0 > e + args.settle for s, e in spans):
                    lat["quiet"].append(t1 - t0)
            q99, b99 = _pct(lat["quiet"], 0.99), _pct(lat["big"], 0.99)
            results["small_calls_ms"] = {
                kind: {"p50": _pct(xs, 0.5), "p99": _pct(xs, 0.99), "calls": len(xs)} for kind, xs in lat.items()
            }
            results["p99_ratio"] = b99 / q99
            results["big_requests"] = bigs_done
            results["rss_mib"] = {"before": rss0, "after": rss1}
            print(f"\nsmall calls, {args.rate:g} per second over {args.sessions} sessions, ms")
            print(f"{'':8} {'p50':>8} {'p99':>8} {'calls':>7}")
            for kind, r in results["small_calls_ms"].items():
                print(f"{kind:8} {r['p50']:8.2f} {r['p99']:8.2f} {r['calls']:7}")
            print(f"p99 while a big request arrives / without: {results['p99_ratio']:.2f} (target: at most 2)")
            print(f"\nbig requests ({len(bigs_done)}):")
            for b in bigs_done:
                print(f"  {b['api']:10} {b['status']}  {(b['end'] - b['start']) * 1000:8.0f} ms  {b['error'][:90]}")
            print(f"\nproxy RSS: {rss0:.0f} MiB before, {rss1:.0f} MiB after")
            load1 = os.getloadavg()
            results["load_average_end"] = load1
            print(f"load average at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        finally:
            proxy.stop()
            engine.stop()
    return results


def compare(runs: list[dict[str, Any]]) -> None:
    """Prints one line per run: the small calls' p50 and p99 quiet and during a big request, the
    p99 ratio, and the big requests' median and longest time to answer. (On a machine others
    load, the p99s are often their pauses; the p50s show what a big request costs the rest.)"""
    print("\nsmall calls' latency (ms) quiet and during a big request; big requests' time to answer (ms)")
    print(
        f"{'mode':10} {'quiet p50':>10} {'big p50':>8} {'quiet p99':>10} {'big p99':>8} {'ratio':>6} "
        f"{'answer p50':>11} {'answer max':>11}"
    )

    def row(name: str, rs: list[dict[str, Any]]) -> None:
        def med(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2]

        times = [sorted((b["end"] - b["start"]) * 1000 for b in r["big_requests"]) for r in rs]
        calls = [r["small_calls_ms"] for r in rs]
        print(
            f"{name:10} {med([c['quiet']['p50'] for c in calls]):10.1f} {med([c['big']['p50'] for c in calls]):8.1f} "
            f"{med([c['quiet']['p99'] for c in calls]):10.1f} {med([c['big']['p99'] for c in calls]):8.1f} "
            f"{med([r['p99_ratio'] for r in rs]):6.2f} "
            f"{med([t[len(t) // 2] for t in times]):11.0f} {med([t[-1] for t in times]):11.0f}"
        )

    for r in runs:
        row(r["mode"], [r])
    if len(runs) > len({r["mode"] for r in runs}):
        for mode in dict.fromkeys(r["mode"] for r in runs):
            row(f"{mode} median", [r for r in runs if r["mode"] == mode])


async def run_modes(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            runs.append(await main(args, mode.strip()))
    compare(runs)
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--role", choices=["bench", "engine", "big"], default="bench")
    parser.add_argument("--sessions", type=int, default=8, help="sessions making small calls")
    parser.add_argument("--rate", type=float, default=20.0, help="small calls per second (all sessions)")
    parser.add_argument("--big", type=int, default=9, help="big requests sent, one at a time")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds without a big request between two")
    parser.add_argument("--settle", type=float, default=0.5, help="seconds around a big request not counted as quiet")
    parser.add_argument("--big-mb", type=int, default=30, help="size of a big request, MiB")
    parser.add_argument("--context", type=int, default=131072, help="the fake model's context, tokens")
    parser.add_argument("--modes", default="off,on", help="modes run, in order: off (reference), on (parser process)")
    parser.add_argument("--rounds", type=int, default=1, help="times the modes are run, in turn")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--model-dir", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--url", default="")
    parser.add_argument("--key", default="")
    parser.add_argument("--out", default="")
    a = parser.parse_args()
    if a.role == "engine":
        _serve_engine(a.model_dir, a.port)
    elif a.role == "big":
        _send_big(a.url, a.key, a.big, a.gap, a.big_mb, a.out)
    else:
        if any(m.strip() not in MODES for m in a.modes.split(",")):
            parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
        out = asyncio.run(run_modes(a))
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
