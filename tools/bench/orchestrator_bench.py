"""Orchestrator benchmark: local sandbox start latency, and concurrent mini-swe-agent rollouts.

1. **Start latency**: ``--starts N`` sandboxes, one after the other, each running the
   ``command`` harness ``true`` exactly as a rollout does (cached workspace copied, proxy
   bridge, network monitor, cgroup, init process). Latency = from ``execute()`` being called to
   the harness process running inside (the init's ``started`` record). Prints p50/p99 beside
   the floor measured in the same run, interleaved with them: a bare ``bwrap --unshare-all
   --ro-bind / / true`` (namespaces only: no workspace, bridge, cgroup or init process).
2. **Concurrency**: for each level in ``--levels`` (e.g. ``8,16,32``), one group of that many
   mini-swe-agent rollouts of ``train/count-lines`` through the real proxy, NATS and orchestrator
   processes, against a fake engine (``ScriptedInferenceServer``: it replays the task's oracle
   as tool calls; it is a test double, not a model), all allowed to run at once. A level is
   sustained when every rollout ends SUCCEEDED with reward 1.0 within ``--timeout`` seconds.
   Prints, per level, wall time, rollouts/minute and the peak of rollouts running at once.

Needs ``bwrap`` and, for part 2, ``openforge harness install mini-swe-agent``.

Usage (repository root): ``.venv/bin/python tools/bench/orchestrator_bench.py --starts 50 --levels 8,16,32``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from google.protobuf.duration_pb2 import Duration
from tokenizers import Tokenizer

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.rpc.client import open_channel
from openforge_orchestrator.backends.local import LocalBackend
from openforge_orchestrator.domain.sandbox import ExecutionPlan, HarnessLaunch
from openforge_orchestrator.domain.tasks import TaskCatalog
from openforge_orchestrator.settings import LocalSandboxSettings
from openforge_testing.fakes import ScriptedInferenceServer, build_fake_model_dir, final_text, tool_call_text
from openforge_testing.servers import NatsServer, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
TASK = "count-lines"
TERMINAL = {
    common_pb2.ROLLOUT_STATUS_SUCCEEDED,
    common_pb2.ROLLOUT_STATUS_FAILED,
    common_pb2.ROLLOUT_STATUS_TIMED_OUT,
    common_pb2.ROLLOUT_STATUS_CANCELLED,
}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


async def bare_bwrap_s() -> float:
    """Seconds from spawning a bare ``bwrap --unshare-all --ro-bind / / true`` to its exit."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("bwrap", "--unshare-all", "--ro-bind", "/", "/", "true")
    if await proc.wait() != 0:
        raise RuntimeError("bare bwrap failed")
    return time.perf_counter() - t0


async def start_latency(n: int, work: Path) -> tuple[list[float], list[float]]:
    """(sandbox start latencies, bare bwrap floor) in seconds, ``n`` of each, interleaved."""
    backend = LocalBackend(
        LocalSandboxSettings(root=str(work / "sb"), cache=str(work / "cache"), artifacts=""), "127.0.0.1:9"
    )
    task = TaskCatalog(TASKS).get("train", TASK)
    launch = HarnessLaunch(name="command", argv=("true",))
    await backend.prepare_workspace(task)
    out: list[float] = []
    floor: list[float] = []
    for i in range(n):
        floor.append(await bare_bwrap_s())
        plan = ExecutionPlan(
            rollout_id=f"bench-{i}",
            task=task,
            launch=launch,
            agent_timeout_s=30,
            verifier_timeout_s=30,
            run_verifier=False,
        )
        result = await backend.execute(plan)
        out.append(result.start_latency_s)
    return out, floor


def oracle_script(model_dir: Path) -> ScriptedInferenceServer:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    solve = "bash -c " + shlex.quote((TASKS / "train" / TASK / "solution" / "solve.sh").read_text())
    steps = [solve, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]

    def answer(prompt: list[int]) -> str:
        done = tok.decode(prompt, skip_special_tokens=False).count("<tool_response>")
        if done < len(steps):
            return tool_call_text("bash", {"command": steps[done]}, text="Next.")
        return final_text("Done.")

    return ScriptedInferenceServer(model_dir, default=answer, tokens_per_message=16)


async def run_group(orch: str, n: int, timeout_s: float, level: int) -> tuple[float, int, list[common_pb2.Rollout]]:
    async with open_channel(orch) as ch:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(ch)
        t0 = time.monotonic()
        resp = await stub.SubmitRollouts(
            orchestrator_pb2.SubmitRolloutsRequest(
                request_id=f"bench-{level}",
                run_id=f"bench-{level}",
                tasks=[orchestrator_pb2.TaskRef(task_id=TASK, task_set="train")],
                group_size=n,
                harness="mini-swe-agent",
                model_name="policy-model",
                timeout=Duration(seconds=int(timeout_s)),
            )
        )
        ids = {r.rollout_id for r in resp.rollouts}
        done: dict[str, common_pb2.Rollout] = {}
        running: set[str] = set()
        peak = 0
        call = stub.WatchRollouts(orchestrator_pb2.WatchRolloutsRequest(run_id=f"bench-{level}"), timeout=timeout_s * 3)
        async for ev in call:
            r = ev.rollout
            if r.rollout_id not in ids:
                continue
            if r.status == common_pb2.ROLLOUT_STATUS_RUNNING:
                running.add(r.rollout_id)
                peak = max(peak, len(running))
            if r.status in TERMINAL:
                running.discard(r.rollout_id)
                done[r.rollout_id] = r
                if len(done) == n:
                    call.cancel()
                    break
        return time.monotonic() - t0, peak, list(done.values())


def concurrency(levels: list[int], timeout_s: float, work: Path, harness_dir: Path) -> list[tuple[int, bool, str]]:
    model = build_fake_model_dir(work / "model")
    fake = oracle_script(model)
    fake.start_in_thread()
    rows: list[tuple[int, bool, str]] = []
    with NatsServer(work / "nats") as nats:
        env = {"OPENFORGE_NATS__URL": nats.url, "OPENFORGE_SERVICES__INFERENCE": fake.address}
        proxy = ServiceProcess("openforge_proxy", env, work / "logs" / "proxy.log").start()
        orch = ServiceProcess(
            "openforge_orchestrator",
            {
                **env,
                "OPENFORGE_SERVICES__PROXY": proxy.address,
                "OPENFORGE_HARNESS__PROXY_HTTP": f"127.0.0.1:{proxy.http_port}",
                "OPENFORGE_HARNESS__INSTALL_DIR": str(harness_dir),
                "OPENFORGE_TASKS__ROOT": str(TASKS),
                "OPENFORGE_SANDBOX__LOCAL__ROOT": str(work / "sandboxes"),
                "OPENFORGE_SANDBOX__LOCAL__CACHE": str(work / "cache2"),
                "OPENFORGE_SANDBOX__LOCAL__ARTIFACTS": "",
                "OPENFORGE_SCHEDULER__MAX_CONCURRENT": str(max(levels)),
                "OPENFORGE_SCHEDULER__MAX_PER_TASK": str(max(levels)),
                "OPENFORGE_LOG__LEVEL": "warning",
            },
            work / "logs" / "orchestrator.log",
        ).start()
        try:
            for level in levels:
                wall, peak, results = asyncio.run(run_group(orch.address, level, timeout_s, level))
                ok = sum(r.status == common_pb2.ROLLOUT_STATUS_SUCCEEDED and r.reward == 1.0 for r in results)
                reasons = sorted({r.failure_reason for r in results if r.failure_reason})[:3]
                sustained = ok == level
                rows.append(
                    (
                        level,
                        sustained,
                        f"{ok}/{level} reward 1.0, peak {peak} running, wall {wall:.1f}s, "
                        f"{60 * level / wall:.1f} rollouts/min {reasons if reasons else ''}",
                    )
                )
                print(f"  level {level:>3}: {'sustained' if sustained else 'NOT sustained'}: {rows[-1][2]}", flush=True)
                if not sustained:
                    break
        finally:
            orch.stop()
            proxy.stop()
            fake.stop_thread()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=50, help="sandboxes for the start latency (0 = skip)")
    parser.add_argument("--levels", default="8,16,32", help="concurrency levels, comma-separated ('' = skip)")
    parser.add_argument("--timeout", type=float, default=600, help="per-rollout time limit at each level, seconds")
    parser.add_argument("--harness-dir", type=Path, default=ROOT / ".openforge" / "harnesses")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orchestrator-bench-") as tmp:
        work = Path(tmp)
        if args.starts:
            load_start = os.getloadavg()[0]
            lat, floor = asyncio.run(start_latency(args.starts, work))
            print(
                f"sandbox start latency over {len(lat)} sandboxes: p50 {1000 * statistics.median(lat):.0f} ms, "
                f"p99 {1000 * percentile(lat, 99):.0f} ms, min {1000 * min(lat):.0f} ms, max {1000 * max(lat):.0f} ms"
            )
            print(
                f"floor, bare bwrap in the same run: p50 {1000 * statistics.median(floor):.0f} ms, "
                f"p99 {1000 * percentile(floor, 99):.0f} ms (load average {load_start:.2f} -> {os.getloadavg()[0]:.2f})"
            )
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
        if levels:
            if not (args.harness_dir / "mini-swe-agent" / "manifest.json").is_file():
                print("mini-swe-agent is not installed: openforge harness install mini-swe-agent", file=sys.stderr)
                return 1
            rows = concurrency(levels, args.timeout, work, args.harness_dir)
            best = max((lvl for lvl, ok, _ in rows if ok), default=0)
            print(f"largest sustained concurrent mini-swe-agent rollouts: {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
