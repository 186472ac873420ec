"""Weight-sync benchmark: a checkpoint read by inference from its path (``UpdateWeights``, the
baseline) against the same checkpoint streamed to inference (``PushWeights``), in one run.

Builds a tiny model (``--size``, 50m by default, or ``--model``) and ``--rounds`` perturbed
checkpoints of it, starts NATS and the inference service process (``--engine``, transformers by
default), then loads each checkpoint with the trainer's client once per mode, the modes
alternating, each version greater than the last. A call's time is the trainer's wall time from
the request to the answer: for ``file``, validation with the checksum and the in-place load;
for ``stream``, also reading the files and sending them over gRPC on loopback, and staging them
in memory on the inference side.

Usage (after ``make setup``)::

    python tools/bench/weight_sync_bench.py
    python tools/bench/weight_sync_bench.py --size 10m --rounds 3 --engine vllm
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from openforge_inference.model_files import checkpoint_checksum
from openforge_inference.tiny_model import build_tiny_model, perturb_checkpoint
from openforge_testing.servers import NatsServer, ServiceProcess
from openforge_trainer.adapters.clients import InferenceClient, WeightSyncMode

MODES: tuple[WeightSyncMode, ...] = ("file", "stream")


async def _measure(address: str, checkpoints: list[Path], timeout_s: float) -> dict[str, list[float]]:
    clients = {mode: InferenceClient(address, timeout_s=timeout_s, weight_sync=mode) for mode in MODES}
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    version = 0
    try:
        for checkpoint in checkpoints:
            checksum = checkpoint_checksum(checkpoint)
            for mode in MODES:
                version += 1
                started = time.perf_counter()
                serving = await clients[mode].update_weights(f"bench/{version}", str(checkpoint), version, checksum)
                seconds[mode].append(time.perf_counter() - started)
                if serving != version:
                    raise RuntimeError(f"{mode}: inference serves {serving}, not {version}")
    finally:
        for client in clients.values():
            await client.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="50m", help="tiny model size (1m, 10m, 50m)")
    parser.add_argument("--model", type=Path, help="an HF model directory instead of a tiny model")
    parser.add_argument("--engine", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--rounds", type=int, default=5, help="checkpoints, each loaded once per mode")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weight-sync-bench-") as tmp:
        root = Path(tmp)
        model = args.model or build_tiny_model(root / "model", size=args.size, seed=0)
        checkpoints = [perturb_checkpoint(model, root / f"ckpt{i}", seed=i + 1) for i in range(args.rounds)]
        megabytes = sum(p.stat().st_size for p in checkpoints[0].glob("*.safetensors")) / 2**20
        with NatsServer(root / "nats") as nats:
            env = {
                "OPENFORGE_NATS__URL": nats.url,
                "OPENFORGE_MODEL_PATH": str(model),
                "OPENFORGE_ENGINE": args.engine,
                "OPENFORGE_MAX_MODEL_LEN": "512",
                "OPENFORGE_KV_CACHE_GIB": "1",
            }
            service = ServiceProcess("openforge_inference", env, root / "inference.log")
            service.start(timeout_s=600)
            try:
                seconds = asyncio.run(_measure(service.address, checkpoints, args.timeout_s))
            finally:
                service.stop()
    print(f"{args.engine} engine, {megabytes:.1f} MiB of safetensors, {args.rounds} rounds per mode")
    print(f"{'mode':<8} {'median s':>9} {'min s':>7} {'max s':>7} {'MiB/s':>8}")
    for mode in MODES:
        values = seconds[mode]
        median = statistics.median(values)
        print(f"{mode:<8} {median:>9.3f} {min(values):>7.3f} {max(values):>7.3f} {megabytes / median:>8.1f}")
    ratio = statistics.median(seconds["stream"]) / statistics.median(seconds["file"])
    print(f"stream / file median: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
