"""GPU check of the ``verl`` trainer backend: a few RL steps of a small real model, sampled with
vLLM and trained with the ``verl`` backend, in under 8 minutes.

The path follows the GPUs: with one GPU, veRL's ``TrainingWorker`` runs in this process (FSDP
engine on CUDA, world size 1); with more (``--gpus``, default: every visible GPU), the backend
runs with ``verl.distributed`` (veRL's Ray worker group: one FSDP ``TrainingWorker`` per GPU,
the batch split over the data-parallel ranks). vLLM shares GPU 0 with the trainer.

Each step: vLLM samples ``--group-size`` answers to each of ``--groups`` arithmetic prompts
("What is 37 + 58?"), with the sampled tokens' logprobs (the behaviour logprobs); the reward is
1 when the first number of the answer is right. The samples become store-shaped
:class:`TrainSample` (loss mask 1 on every sampled token, policy version = step), the backend
trains one step (veRL's DataProto, GRPO, TIS, ``ppo_loss``), writes an HF checkpoint, and vLLM
reloads it in place (the inference service's ``openforge_reload_weights``, what
``UpdateWeights`` runs). Prints per step: reward, step time, training tokens/s, generation
time; then the reward curve.

Usage (on the GPU machine, trainer and inference GPU requirements installed)::

    python tools/gpu/verl_check.py                       # finds a small model in the HF cache
    python tools/gpu/verl_check.py --model DIR --steps 4 --groups 8 --group-size 4

Exit status 0 when every step trained with a finite loss and vLLM served each new checkpoint.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openforge_core.run_config import RunConfig
from openforge_trainer.backends.base import create_backend
from openforge_trainer.domain.samples import TrainBatch, TrainSample

#: The inference service's vLLM worker extension (``openforge_reload_weights``).
WORKER_EXTENSION = "openforge_inference.engines.vllm_worker.OpenForgeWorkerExtension"

#: Preferred small models, looked up in the local HF cache in this order.
SMALL_MODELS = (
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen2.5-0.5B",
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
)


def find_model() -> Path:
    """A small causal LM already on this machine: ``$OPENFORGE_GPU_MODEL``, else the first of
    :data:`SMALL_MODELS` in the HF cache, else the smallest safetensors model there."""
    if env := os.environ.get("OPENFORGE_GPU_MODEL"):
        return Path(env)
    constants: Any = importlib.import_module("huggingface_hub.constants")
    cache = Path(constants.HF_HUB_CACHE)
    candidates: list[tuple[int, Path]] = []
    for name in SMALL_MODELS:
        snaps = sorted((cache / ("models--" + name.replace("/", "--")) / "snapshots").glob("*/config.json"))
        if snaps:
            return snaps[-1].parent
    for config in cache.glob("models--*/snapshots/*/config.json"):
        weights = list(config.parent.glob("*.safetensors"))
        if weights:
            candidates.append((sum(w.stat().st_size for w in weights), config.parent))
    if not candidates:
        sys.exit("no model found: pass --model DIR or set OPENFORGE_GPU_MODEL")
    return min(candidates)[1]


def make_prompts(tokenizer: Any, n: int, rng: random.Random) -> list[tuple[list[int], int]]:
    """``n`` arithmetic prompts (token ids, answer), in the model's chat template when it has one."""
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        text = f"What is {a} + {b}? Reply with the number only."
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        else:
            ids = tokenizer(text + "\nAnswer:")["input_ids"]
        out.append((list(ids), a + b))
    return out


def reward(text: str, answer: int) -> float:
    """1.0 when the first integer in ``text`` is ``answer``."""
    found = re.search(r"-?\d+", text)
    return 1.0 if found and int(found.group()) == answer else 0.0


def sample_groups(
    llm: Any, params: Any, prompts: list[tuple[list[int], int]], step: int
) -> tuple[list[TrainSample], list[float]]:
    """Samples each prompt's group with vLLM; returns the samples and every rollout's reward."""
    outputs = llm.generate([{"prompt_token_ids": ids} for ids, _ in prompts], params, use_tqdm=False)
    samples: list[TrainSample] = []
    rewards: list[float] = []
    for g, (out, (ids, answer)) in enumerate(zip(outputs, prompts, strict=True)):
        for i, completion in enumerate(out.outputs):
            tokens = list(completion.token_ids)
            logprobs = [float(pos[tok].logprob) for tok, pos in zip(tokens, completion.logprobs, strict=True)]
            r = reward(completion.text, answer)
            rewards.append(r)
            samples.append(
                TrainSample(
                    sample_id=f"s{step}-g{g}-r{i}/0",
                    rollout_id=f"s{step}-g{g}-r{i}",
                    group_id=f"s{step}-g{g}",
                    task_id=f"add-{g}",
                    prompt_ids=tuple(ids),
                    response_ids=tuple(tokens),
                    loss_mask=tuple(1 for _ in tokens),
                    behaviour_logprobs=tuple(logprobs),
                    policy_versions=tuple(step for _ in tokens),
                    reward=r,
                )
            )
    return samples, rewards


def cuda_device_count() -> int:
    """Visible CUDA devices (0 without CUDA)."""
    torch: Any = importlib.import_module("torch")
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def run_config(model_dir: Path, args: argparse.Namespace, *, gpus: int) -> RunConfig:
    """The run config of the check: ``verl.distributed`` over ``gpus`` GPUs when there is more
    than one, else the in-process worker on ``cuda``."""
    verl = {"distributed": True, "n_gpus_per_node": gpus} if gpus > 1 else {}
    return RunConfig.model_validate(
        {
            "model": str(model_dir),
            "tasks": ["add"],
            "backend": "verl",
            "device": "cuda",
            "group_size": args.group_size,
            "groups_per_step": args.groups,
            "learning_rate": args.lr,
            "steps": args.steps,
            "seed": args.seed,
            "verl": verl,
        }
    )


def describe(config: RunConfig) -> str:
    """One line naming the trainer path the check exercises."""
    if config.verl.distributed:
        return f"veRL Ray worker group, {config.verl.n_gpus_per_node} FSDP TrainingWorkers (one per GPU)"
    return "veRL TrainingWorker in-process (FSDP engine, world size 1, one GPU)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="HF model directory (default: a small cached one)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--gpus", type=int, default=0, help="trainer GPUs (default: all visible; > 1: Ray group)")
    args = parser.parse_args()

    started = time.perf_counter()
    model_dir = args.model or find_model()
    print(f"model: {model_dir.name if args.model is None else model_dir}", flush=True)
    vllm: Any = importlib.import_module("vllm")
    transformers: Any = importlib.import_module("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    llm = vllm.LLM(
        model=str(model_dir),
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=True,
        max_model_len=1024,
        seed=args.seed,
        max_logprobs=1,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
    )
    params = vllm.SamplingParams(n=args.group_size, temperature=1.0, max_tokens=args.max_tokens, logprobs=0)
    config = run_config(model_dir, args, gpus=args.gpus or cuda_device_count())
    print(f"trainer: {describe(config)}", flush=True)
    backend = create_backend("verl", config)
    backend.load(model_dir, None)
    print(f"startup_s={time.perf_counter() - started:.1f}", flush=True)

    rng = random.Random(args.seed)
    curve: list[float] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="verl-check-") as tmp:
        for step in range(args.steps):
            t0 = time.perf_counter()
            samples, rewards = sample_groups(llm, params, make_prompts(tokenizer, args.groups, rng), step)
            gen_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            metrics = backend.train_rl(TrainBatch(samples=tuple(samples), policy_version=step))
            train_s = time.perf_counter() - t1
            ckpt = Path(tmp) / f"step-{step + 1}"
            ckpt.mkdir()
            backend.save_checkpoint(ckpt)
            t2 = time.perf_counter()
            llm.collective_rpc("openforge_reload_weights", kwargs={"weights_path": str(ckpt)})
            sync_s = time.perf_counter() - t2
            mean_reward = sum(rewards) / len(rewards)
            curve.append(mean_reward)
            ok = ok and math.isfinite(metrics["loss/total"])
            row = {
                "step": step + 1,
                "reward_mean": round(mean_reward, 4),
                "loss": round(metrics["loss/total"], 6),
                "grad_norm": round(metrics["grad_norm"], 4),
                "step_s": round(gen_s + train_s + sync_s, 2),
                "train_s": round(train_s, 2),
                "gen_s": round(gen_s, 2),
                "weight_sync_s": round(sync_s, 2),
                "train_tokens_per_s": round(metrics["tokens/per_s"], 1),
                "tokens": int(metrics["tokens/total"]),
            }
            print(json.dumps(row), flush=True)
    backend.close()
    print("reward_curve: " + " ".join(f"{r:.3f}" for r in curve))
    print(f"total_s={time.perf_counter() - started:.1f} ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
