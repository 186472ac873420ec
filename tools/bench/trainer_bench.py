"""Training throughput of the trainer's ``torch`` backend against a plain PyTorch loop.

Both train the same model (the 10M tiny Qwen2 model by default) on the same batch (samples of
4096 tokens: a prompt, then a response with a masked tool span) with the same loss: GRPO
advantages, truncated importance sampling against behaviour logprobs, PPO-clip, token-mean,
AdamW, gradient clipping. The backend goes through veRL's functions, micro-batching and its
metrics; the plain loop is the formula written inline. Runs alternate (backend, plain, backend,
plain, ...) after a warm-up of each, and the first-step losses are checked to agree.

Usage::

    .venv/bin/python tools/bench/trainer_bench.py                 # builds the 10m model
    .venv/bin/python tools/bench/trainer_bench.py --model DIR --samples 4 --tokens 4096 --iters 3

Prints tokens/s (prompt + response tokens processed per second of training step) for both and
their ratio (target: backend >= 0.8x plain).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openforge_core.run_config import RunConfig
from openforge_trainer.backends.base import create_backend
from openforge_trainer.domain.samples import TrainBatch, TrainSample

CAP, EPS_LOW, EPS_HIGH, CLIP_C = 2.0, 0.2, 0.28, 3.0


def build_model(size: str, out: Path) -> Path:
    """Builds the tiny model with the inference service's builder (its own process)."""
    subprocess.run(
        [sys.executable, "-m", "openforge_inference.tiny_model", "--size", size, "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def make_batch(vocab: int, samples: int, tokens: int, seed: int) -> list[TrainSample]:
    """``samples`` sequences of ``tokens`` tokens: 256-token prompt, response with a 10% tool span."""
    import random

    rng = random.Random(seed)
    prompt_len = 256
    resp = tokens - prompt_len
    tool_start, tool_len = resp // 2, resp // 10
    out = []
    for i in range(samples):
        mask = [0 if tool_start <= j < tool_start + tool_len else 1 for j in range(resp)]
        out.append(
            TrainSample(
                sample_id=f"s{i}/0",
                rollout_id=f"s{i}",
                group_id=f"g{i % 2}",
                task_id="bench",
                prompt_ids=tuple(rng.randrange(10, vocab) for _ in range(prompt_len)),
                response_ids=tuple(rng.randrange(10, vocab) for _ in range(resp)),
                loss_mask=tuple(mask),
                behaviour_logprobs=tuple(-8.3 + rng.uniform(-0.5, 0.5) if m else 0.0 for m in mask),
                policy_versions=tuple(0 for _ in mask),
                reward=float(i % 3) / 2,
            )
        )
    return out


class PlainLoop:
    """The same objective written inline: one sample per forward/backward, one AdamW step."""

    def __init__(self, model: Any, lr: float) -> None:
        import torch

        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self, samples: list[TrainSample]) -> float:
        import torch

        groups: dict[str, list[float]] = {}
        for s in samples:
            groups.setdefault(s.group_id, []).append(s.reward)
        total_tokens = sum(sum(s.loss_mask) for s in samples)
        self.opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for s in samples:
            rs = torch.tensor(groups[s.group_id])
            adv = (s.reward - rs.mean()) / (rs.std() + 1e-6) if len(rs) > 1 else torch.tensor(s.reward)
            ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
            p, r = len(s.prompt_ids), len(s.response_ids)
            logits = self.model(input_ids=ids, use_cache=False).logits[0, p - 1 : p - 1 + r]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, p:].unsqueeze(-1)).squeeze(-1)
            old = logp.detach()
            mask = torch.tensor(s.loss_mask, dtype=torch.float32)
            w = torch.clamp(torch.exp(old - torch.tensor(s.behaviour_logprobs)), max=CAP) * mask
            ratio = torch.exp(logp - old)
            pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH))
            if adv < 0:
                pg = torch.minimum(pg, -adv * CLIP_C)
            loss = (pg * w * mask).sum() / total_tokens
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss_sum


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, help="HF model directory (default: build the tiny model)")
    parser.add_argument("--size", default="10m", help="tiny model size to build (1m, 10m, 50m)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per sample (prompt + response)")
    parser.add_argument("--iters", type=int, default=3, help="timed steps of each, after one warm-up")
    args = parser.parse_args(argv)

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_model(args.size, Path(tmp) / "model")
        cfg = RunConfig(
            model=str(model_dir),
            tasks=["bench"],
            group_size=2,
            groups_per_step=max(1, args.samples // 2),
            learning_rate=1e-5,
            max_grad_norm=1.0,
            clip_ratio_low=EPS_LOW,
            clip_ratio_high=EPS_HIGH,
            clip_ratio_c=CLIP_C,
            is_cap=CAP,
            micro_batch_tokens=args.tokens,
        )
        backend: Any = create_backend("torch", cfg)
        backend.load(model_dir, None)
        plain = PlainLoop(copy.deepcopy(backend.model), lr=1e-5)
        vocab = int(backend.model.config.vocab_size)
        samples = make_batch(vocab, args.samples, args.tokens, seed=0)
        batch = TrainBatch(tuple(samples), 0)
        n_tokens = batch.num_tokens
        params = sum(p.numel() for p in backend.model.parameters())

        first_backend = backend.train_rl(batch)["loss/total"]
        first_plain = plain.step(samples)
        if abs(first_backend - first_plain) > 1e-4 * max(1.0, abs(first_plain)):
            print(f"LOSS MISMATCH: backend {first_backend:.6g} vs plain {first_plain:.6g}")
            return 1
        times: dict[str, list[float]] = {"backend": [], "plain": []}
        for _ in range(args.iters):
            t = time.perf_counter()
            backend.train_rl(batch)
            times["backend"].append(time.perf_counter() - t)
            t = time.perf_counter()
            plain.step(samples)
            times["plain"].append(time.perf_counter() - t)

    rate = {k: n_tokens / statistics.median(v) for k, v in times.items()}
    print(
        f"model {params / 1e6:.1f}M params, batch {args.samples} x {args.tokens} tokens = {n_tokens} tokens, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"first-step loss: backend {first_backend:.6g}, plain {first_plain:.6g}")
    for k in ("backend", "plain"):
        print(f"{k:8s} {rate[k]:10.1f} tokens/s  (median of {args.iters} steps: {statistics.median(times[k]):.2f} s)")
    print(f"ratio backend/plain: {rate['backend'] / rate['plain']:.3f} (target >= 0.8)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
