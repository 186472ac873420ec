"""The GPU check: a few RL steps of a ~300M-parameter random-init model through the real path
(mini-swe-agent in its sandboxes, the proxy, vLLM on the GPU, the store, the trainer on the GPU),
once per weight-sync layout, with one JSON of figures at the end.

1. ``openforge model init-tiny --size 300m`` builds the model locally (nothing is downloaded).
2. ``file`` layout: ``openforge train`` on the demo's config (the ``lines`` task family, warm
   start by SFT on the scripted oracle's demonstrations, then GRPO), with the trainer on
   ``cuda`` (``precision: auto``, bf16) and vLLM on the same GPU (colocated: the model's dtype,
   CUDA graphs); each step's checkpoint is read by vLLM from its path (``UpdateWeights``).
3. ``stream`` layout: the same RL phase from the warm-started model of step 2, the checkpoint
   streamed to inference (``OPENFORGE_WEIGHT_SYNC=stream``, ``PushWeights``, staged in
   ``/dev/shm``): the path of an inference machine that shares no filesystem with the trainer.
4. While each runs, ``nvidia-smi`` is sampled every 0.5 s.

The JSON (``--out``): per layout, the reward and the time split of each RL step (waiting for
the group's rollouts, training, checkpoint, weight sync), trainer tokens/s and MFU
(``6 * parameters * tokens/s / --peak-tflops``; Kaplan et al. 2020, arXiv:2001.08361 §2.1),
sampled tokens/s while the step waits for its rollouts (generation, harness and verifier time
together), GPU utilisation over the RL phase and while rollouts run, and the issue's targets
with whether each was met.

Usage (on the GPU machine, after ``make setup``, the harnesses and vLLM's GPU build installed)::

    tools/gpu/check.sh                      # writes $OUT/gpu_check.json (or ./gpu_check.json)
    python tools/gpu/check.py --steps 3 --out gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "examples" / "demo" / "demo.yaml"
LAYOUTS = ("file", "stream")
#: The issue's targets.
TARGETS = {"trainer_mfu": 0.40, "gpu_util_rollouts": 0.85, "weight_sync_s": 2.0}
#: H200 (and H100 SXM) dense bf16 tensor-core peak, TFLOP/s.
H200_BF16_TFLOPS = 989.0


@dataclass
class GpuSample:
    """One ``nvidia-smi`` reading: wall time (s since the epoch), utilisation (0-1), memory MiB."""

    time: float
    util: float
    memory_mib: float


def parse_smi_line(line: str, now: float) -> GpuSample | None:
    """``utilization.gpu, memory.used`` (``--format=csv,noheader,nounits``) of the first GPU."""
    parts = [p.strip() for p in line.split(",")]
    try:
        return GpuSample(now, float(parts[0]) / 100.0, float(parts[1]))
    except (IndexError, ValueError):
        return None


@dataclass
class GpuSampler:
    """Samples the first GPU with ``nvidia-smi`` in a thread until :meth:`stop`."""

    period_s: float = 0.5
    samples: list[GpuSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        def loop() -> None:
            query = [
                "nvidia-smi",
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                "-i",
                "0",
            ]
            while not self._stop.wait(self.period_s):
                out = subprocess.run(query, capture_output=True, text=True, check=False).stdout
                sample = parse_smi_line(out.splitlines()[0] if out else "", time.time())
                if sample is not None:
                    self.samples.append(sample)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[GpuSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.samples


def mean_util(samples: Sequence[GpuSample], windows: Sequence[tuple[float, float]]) -> float | None:
    """Mean utilisation of the samples inside any of ``windows``, each ``[start, end)`` (None: no
    sample there)."""
    inside = [s.util for s in samples if any(lo <= s.time < hi for lo, hi in windows)]
    return statistics.fmean(inside) if inside else None


def layout_config(demo: dict[str, Any], layout: str, model: Path, steps: int, warm_start: bool) -> dict[str, Any]:
    """The demo config for one layout: the model at ``model``, trainer and vLLM on the GPU, the
    layout's weight sync, ``steps`` RL steps, no evaluation; the warm start only if asked."""
    cfg: dict[str, Any] = json.loads(json.dumps(demo))  # a deep copy
    cfg["run_id"] = f"gpu-{layout}"
    cfg["model"] = {"path": str(model)}
    cfg["eval"] = None
    for key in ("harness_config",):
        if key in cfg:
            cfg[key] = str((ROOT / cfg[key]).resolve())
    stack = cfg.setdefault("stack", {})
    stack["tasks_root"] = str((ROOT / stack.get("tasks_root", "examples/tasks")).resolve())
    stack["engine"] = "vllm"
    stack["fallback_engine"] = ""  # a GPU check that silently ran on the reference engine says nothing
    stack["env"] = {**stack.get("env", {}), "OPENFORGE_WEIGHT_SYNC": layout, "OPENFORGE_KV_CACHE_GIB": "8"}
    cfg["run"] = {**cfg["run"], "steps": steps, "device": "cuda", "precision": "auto"}
    if warm_start and cfg.get("warm_start"):
        cfg["warm_start"]["run"] = {**cfg["warm_start"]["run"], "device": "cuda", "precision": "auto"}
    else:
        cfg["warm_start"] = None
    return cfg


def read_steps(state: Path, run_id: str) -> list[dict[str, Any]]:
    """The RL run's ``metrics.jsonl``: one ``{"step", "time", "metrics"}`` per step."""
    path = state / "checkpoints" / run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(
    rows: Sequence[dict[str, Any]], samples: Sequence[GpuSample], parameters: int, peak_tflops: float
) -> dict[str, Any]:
    """The figures of one layout's RL steps (see the module docstring)."""
    steps: list[dict[str, float]] = []
    rl_windows: list[tuple[float, float]] = []
    rollout_windows: list[tuple[float, float]] = []
    for row in rows:
        m = row["metrics"]
        end = float(row["time"])
        start = end - m["time/step_s"]
        rl_windows.append((start, end))
        rollout_windows.append((start, start + m["time/wait_rollouts_s"]))
        train_tps = m["tokens/per_s"]
        steps.append(
            {
                "step": row["step"],
                "reward": m.get("reward/mean", float("nan")),
                "step_s": m["time/step_s"],
                "wait_rollouts_s": m["time/wait_rollouts_s"],
                "train_s": m["time/train_s"],
                "checkpoint_s": m["time/checkpoint_s"],
                "weight_sync_s": m["time/weight_sync_s"],
                "trainer_tokens_per_s": train_tps,
                "trainer_mfu": 6.0 * parameters * train_tps / (peak_tflops * 1e12),
                "sampled_tokens_per_s_waiting": m["tokens/sampled"] / m["time/wait_rollouts_s"]
                if m["time/wait_rollouts_s"] > 0
                else 0.0,
            }
        )
    later = steps[1:] or steps  # the first step carries the warm-up (CUDA graphs, allocator)
    return {
        "steps": steps,
        "reward_per_step": [s["reward"] for s in steps],
        "weight_sync_s_median": statistics.median(s["weight_sync_s"] for s in later),
        "trainer_mfu_median": statistics.median(s["trainer_mfu"] for s in later),
        "trainer_tokens_per_s_median": statistics.median(s["trainer_tokens_per_s"] for s in later),
        "gpu_util_rl": mean_util(samples, rl_windows),
        "gpu_util_rollouts": mean_util(samples, rollout_windows),
        "gpu_memory_mib_max": max((s.memory_mib for s in samples), default=None),
    }


def targets_met(layouts: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Each target, met by the best layout."""
    best_sync = min(v["weight_sync_s_median"] for v in layouts.values())
    best_mfu = max(v["trainer_mfu_median"] for v in layouts.values())
    utils = [v["gpu_util_rollouts"] for v in layouts.values() if v["gpu_util_rollouts"] is not None]
    return {
        "trainer_mfu": best_mfu >= TARGETS["trainer_mfu"],
        "gpu_util_rollouts": bool(utils) and max(utils) >= TARGETS["gpu_util_rollouts"],
        "weight_sync_s": best_sync <= TARGETS["weight_sync_s"],
    }


def parameter_count(model: Path) -> int:
    """Parameters of a safetensors model directory, from its headers."""
    from openforge_inference.model_files import read_checkpoint_tensors

    total = 0
    for meta in read_checkpoint_tensors(model).values():
        n = 1
        for d in meta.shape:
            n *= d
        total += n
    return total


def _openforge(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "openforge"), *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    parser.add_argument("--state", type=Path, default=ROOT / ".openforge" / "gpu-check")
    parser.add_argument("--size", default="300m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    args = parser.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: this check needs an NVIDIA GPU", file=sys.stderr)
        return 2
    started = time.time()
    shutil.rmtree(args.state, ignore_errors=True)
    model = args.state / "model"
    subprocess.run(_openforge("model", "init-tiny", "--size", args.size, "--out", str(model)), check=True, cwd=ROOT)
    demo = yaml.safe_load(DEMO_CONFIG.read_text())
    parameters = parameter_count(model)
    result: dict[str, Any] = {"model_parameters": parameters, "size": args.size, "layouts": {}, "errors": {}}
    policy = model
    for i, layout in enumerate(args.layouts.split(",")):
        state = args.state / layout
        cfg = layout_config(demo, layout, policy, args.steps, warm_start=i == 0)
        config = args.state / f"{layout}.yaml"
        config.write_text(yaml.safe_dump(cfg))
        sampler = GpuSampler().start()
        t0 = time.time()
        done = subprocess.run(_openforge("train", str(config), "--state-dir", str(state), "--fresh"), cwd=ROOT)
        samples = sampler.stop()
        if done.returncode != 0:
            result["errors"][layout] = f"openforge train exited {done.returncode} (logs: {state / 'logs'})"
            continue
        summary = summarize(read_steps(state, cfg["run_id"]), samples, parameters, args.peak_tflops)
        summary["wall_s"] = time.time() - t0
        result["layouts"][layout] = summary
        if i == 0 and (state / "models" / "warm-start").is_dir():
            policy = state / "models" / "warm-start"
    if result["layouts"]:
        result["targets"] = TARGETS
        result["targets_met"] = targets_met(result["layouts"])
    result["total_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if not result["errors"] and result["layouts"] else 1


if __name__ == "__main__":
    sys.exit(main())
