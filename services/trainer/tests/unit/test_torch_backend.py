"""The ``torch`` backend against hand-written references of the same formulas.

References (written out here, not calling veRL):

* GRPO advantage (Shao et al. 2024, arXiv:2402.03300, §4.1.2 outcome supervision; veRL
  ``compute_grpo_outcome_advantage``): ``A_i = (r_i - mean_g r) / (std_g r + 1e-6)`` with the
  unbiased std, ``A_i = r_i / (1 + 1e-6)`` for a group of one.
* RLOO (Ahmadian et al. 2024, arXiv:2402.14740; veRL ``compute_rloo_outcome_advantage``):
  ``A_i = r_i - mean_{j != i} r_j``.
* Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
  you off-policy RL training"; veRL ``compute_rollout_correction_weights``, token level):
  ``w_t = min(exp(log π_old - log π_behaviour), C)``, no gradient.
* PPO-clip with dual clip (Schulman et al. 2017 arXiv:1707.06347 eq. 7; Ye et al. 2019
  arXiv:1912.09729; veRL ``compute_policy_loss_vanilla``) times ``w_t``, token-mean over the
  loss mask (veRL ``agg_loss``).
* GSPO (Zheng et al. 2025, arXiv:2507.18071 eq. 7 with the token-level gradient form; veRL
  ``compute_policy_loss_gspo``).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from openforge_core.run_config import RunConfig
from openforge_trainer.domain.samples import TrainBatch, TrainSample

CAP = 2.0
EPS_LOW, EPS_HIGH, CLIP_C = 0.2, 0.28, 3.0


def make_samples(rewards_by_group: dict[str, list[float]], *, vocab: int = 64, seed: int = 0) -> list[TrainSample]:
    """Samples with varied prompt/response lengths and a tool span (mask 0) inside the response."""
    import random

    rng = random.Random(seed)
    out: list[TrainSample] = []
    for g, rewards in rewards_by_group.items():
        for i, r in enumerate(rewards):
            p = rng.randint(3, 7)
            first, tool, second = rng.randint(2, 5), rng.randint(1, 3), rng.randint(2, 5)
            response = [rng.randrange(2, vocab) for _ in range(first + tool + second)]
            mask = [1] * first + [0] * tool + [1] * second
            out.append(
                TrainSample(
                    sample_id=f"{g}-{i}/0",
                    rollout_id=f"{g}-{i}",
                    group_id=g,
                    task_id=f"task-{g}",
                    prompt_ids=tuple(rng.randrange(2, vocab) for _ in range(p)),
                    response_ids=tuple(response),
                    loss_mask=tuple(mask),
                    behaviour_logprobs=tuple(0.0 for _ in response),
                    policy_versions=tuple(0 for _ in response),
                    reward=r,
                )
            )
    return out


def ref_logprobs(model: Any, s: TrainSample, temperature: float = 1.0) -> Any:
    """log π(response_t | prefix) for every response token of one sample: (R,)."""
    import torch

    ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
    logits = model(input_ids=ids).logits[0] / temperature
    p, r = len(s.prompt_ids), len(s.response_ids)
    logp = torch.log_softmax(logits[p - 1 : p - 1 + r].float(), dim=-1)
    return logp.gather(-1, torch.tensor(s.response_ids).unsqueeze(-1)).squeeze(-1)


def with_behaviour(s: TrainSample, logprobs: list[float]) -> TrainSample:
    masked = tuple(lp if m else 0.0 for lp, m in zip(logprobs, s.loss_mask, strict=True))
    return TrainSample(**{**s.__dict__, "behaviour_logprobs": masked})


def ref_grpo(samples: list[TrainSample]) -> list[float]:
    import statistics

    groups: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        groups[s.group_id].append(s.reward)
    out = []
    for s in samples:
        rs = groups[s.group_id]
        if len(rs) == 1:
            out.append(s.reward / (1.0 + 1e-6))
        else:
            out.append((s.reward - statistics.fmean(rs)) / (statistics.stdev(rs) + 1e-6))
    return out


def ref_rloo(samples: list[TrainSample]) -> list[float]:
    groups: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        groups[s.group_id].append(s.reward)
    out = []
    for s in samples:
        rs = groups[s.group_id]
        out.append(s.reward - (sum(rs) - s.reward) / (len(rs) - 1) if len(rs) > 1 else s.reward)
    return out


def ref_loss(model: Any, samples: list[TrainSample], loss: str, cap: float | None) -> Any:
    """The hand-written objective (see the module docstring); token-mean over all loss tokens."""
    import torch

    adv = ref_grpo(samples)
    total = torch.zeros(())
    ntok = 0
    for s, a in zip(samples, adv, strict=True):
        logp = ref_logprobs(model, s)
        old = logp.detach()
        mask = torch.tensor(s.loss_mask, dtype=torch.float32)
        beh = torch.tensor(s.behaviour_logprobs)
        raw = torch.exp(old - beh)
        w = torch.clamp(raw, max=cap) if cap is not None else raw
        if loss == "ppo-clip":
            ratio = torch.exp(logp - old)
            pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH))
            if a < 0:
                pg = torch.minimum(pg, torch.full_like(pg, -a * CLIP_C))
        else:  # gspo
            seq = ((logp - old) * mask).sum() / mask.sum()
            s_ratio = torch.exp(logp - logp.detach() + seq.detach())
            pg = torch.maximum(-a * s_ratio, -a * torch.clamp(s_ratio, 1 - EPS_LOW, 1 + EPS_HIGH))
        total = total + (pg * w * mask).sum()
        ntok += int(mask.sum())
    return total / ntok


def run_config(model_dir: Path, **over: Any) -> RunConfig:
    base: dict[str, Any] = {
        "model": str(model_dir),
        "tasks": ["t"],
        "group_size": 3,
        "learning_rate": 1e-3,
        "max_grad_norm": 0.0,
        "clip_ratio_low": EPS_LOW,
        "clip_ratio_high": EPS_HIGH,
        "clip_ratio_c": CLIP_C,
        "is_cap": CAP,
    }
    base.update(over)
    return RunConfig.model_validate(base)


def load_backend(model_dir: Path, **over: Any) -> Any:
    from openforge_trainer.backends.base import create_backend

    cfg = run_config(model_dir, **over)
    backend = create_backend("torch", cfg)
    backend.load(model_dir, None)
    return backend


def backward(loss: Any) -> None:
    loss.backward()


def noise(n: int, gen: Any) -> Any:
    import torch

    return (torch.rand(n, generator=gen) - 0.5) * 0.6


def grads_of(model: Any) -> dict[str, Any]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert set(got) == set(want) and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=f"gradient of {name} differs")


@pytest.mark.parametrize("loss", ["ppo-clip", "gspo"])
def test_rl_loss_and_gradients_equal_the_hand_written_reference(micro_model_dir: Path, loss: str) -> None:
    """GRPO advantages + PPO-clip/GSPO with truncated IS, over 3 micro-batches, equal the
    reference computed on a copy of the pre-step weights, loss and every parameter's gradient."""
    import torch

    backend = load_backend(micro_model_dir, loss=loss, micro_batch_tokens=40)
    model = backend.model
    reference = copy.deepcopy(model)
    samples = make_samples({"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 1.0], "c": [1.0]})
    gen = torch.Generator().manual_seed(1)
    # Behaviour logprobs within ±0.3 nats of the current ones: weights in (0.74, 1.35), below the cap.
    samples = [
        with_behaviour(s, (ref_logprobs(reference, s).detach() + noise(len(s.response_ids), gen)).tolist())
        for s in samples
    ]
    metrics = backend.train_rl(TrainBatch(tuple(samples), 0))
    want_loss = ref_loss(reference, samples, loss, CAP)
    backward(want_loss)
    assert metrics["loss/total"] == pytest.approx(float(want_loss.detach()), rel=1e-5, abs=1e-7)
    assert_grads_equal(grads_of(model), grads_of(reference))
    assert metrics["is/capped_fraction"] == 0.0
    assert abs(float(want_loss.detach())) > 1e-4  # the comparison is not between two zeros


def test_importance_sampling_cap_truncates_weights(micro_model_dir: Path) -> None:
    """Behaviour logprobs 3 nats below the current ones on half the tokens (raw weight
    e^3 ≈ 20) are truncated to the cap: the loss and gradients equal the capped reference and
    differ from the uncapped one; the capped fraction and mean weight are reported."""
    import torch

    backend = load_backend(micro_model_dir, loss="ppo-clip")
    model = backend.model
    reference = copy.deepcopy(model)
    uncapped = copy.deepcopy(model)
    samples = make_samples({"a": [1.0, 0.0, 0.0], "b": [1.0, 1.0, 0.0]}, seed=3)
    shifted, capped_tokens, tokens, weight_sum = [], 0, 0, 0.0
    for s in samples:
        cur = ref_logprobs(reference, s).detach()
        beh = []
        for j, m in enumerate(s.loss_mask):
            far = j % 2 == 0
            beh.append(float(cur[j]) - (3.0 if far else -0.5))
            if m:
                tokens += 1
                capped_tokens += far
                weight_sum += CAP if far else math.exp(-0.5)
        shifted.append(with_behaviour(s, beh))
    metrics = backend.train_rl(TrainBatch(tuple(shifted), 0))

    want = ref_loss(reference, shifted, "ppo-clip", CAP)
    backward(want)
    raw = ref_loss(uncapped, shifted, "ppo-clip", None)
    backward(raw)
    assert metrics["loss/total"] == pytest.approx(float(want.detach()), rel=1e-5)
    assert_grads_equal(grads_of(model), grads_of(reference))
    assert metrics["is/capped_fraction"] == pytest.approx(capped_tokens / tokens, abs=1e-6)
    assert metrics["is/mean"] == pytest.approx(weight_sum / tokens, rel=1e-4)
    # Without the cap the same batch gives another loss: the cap changed the update.
    assert abs(float(raw.detach()) - float(want.detach())) > 0.1 * abs(float(want.detach()))
    ratio = [float((grads_of(uncapped)[n] - grads_of(reference)[n]).norm()) for n in grads_of(reference)]
    assert max(ratio) > 1e-6
    del torch


@pytest.mark.parametrize(("algorithm", "reference"), [("grpo", ref_grpo), ("rloo", ref_rloo)])
def test_outcome_advantages_match_the_formula(heavy_stack: None, algorithm: str, reference: Any) -> None:
    from openforge_trainer.backends.torch_backend import compute_advantages, load_verl

    samples = make_samples({"a": [1.0, 0.0, 0.5, 0.25], "b": [0.0, 1.0]}, seed=5)
    cfg = RunConfig.model_validate({"model": "m", "tasks": ["t"], "group_size": 4, "algorithm": algorithm})
    adv = compute_advantages(load_verl(), cfg, samples)
    for i, (s, a) in enumerate(zip(samples, reference(samples), strict=True)):
        for j, m in enumerate(s.loss_mask):
            assert float(adv[i, j]) == pytest.approx(a * m, abs=1e-5)


def test_reinforce_plus_plus_whitens_returns_over_the_batch(heavy_stack: None) -> None:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; veRL ``compute_reinforce_plus_plus_outcome_advantage``):
    with γ = 1 every sampled token's return is its sample's reward (the reward sits on the last
    sampled token and is carried back past tool tokens); advantages are those returns whitened over
    all sampled tokens of the batch (masked mean and unbiased masked variance)."""
    import statistics

    from openforge_trainer.backends.torch_backend import compute_advantages, load_verl

    samples = make_samples({"a": [1.0, 0.0], "b": [0.5, 0.0]}, seed=9)
    cfg = RunConfig(model="m", tasks=["t"], group_size=2, algorithm="reinforce++")
    adv = compute_advantages(load_verl(), cfg, samples)
    returns = [s.reward for s in samples for m in s.loss_mask if m]
    mean, std = statistics.fmean(returns), statistics.stdev(returns)
    for i, s in enumerate(samples):
        for j, m in enumerate(s.loss_mask):
            want = (s.reward - mean) / math.sqrt(std**2 + 1e-8) if m else 0.0
            assert float(adv[i, j]) == pytest.approx(want, abs=1e-4)


def test_sft_lowers_loss_on_sampled_tokens_and_masked_tokens_get_no_gradient(micro_model_dir: Path) -> None:
    """SFT's loss has no term for loss-mask-0 tokens: the gradient of the loss with respect to
    their logits is exactly 0, changing a trailing masked token leaves every parameter gradient
    unchanged, and a few steps lower the NLL of the sampled tokens."""
    import torch

    from openforge_trainer.backends.torch_backend import collate, response_logits

    backend = load_backend(micro_model_dir, mode="sft", learning_rate=3e-3)
    base = make_samples({"a": [1.0, 1.0]}, seed=11)
    # End each response with a masked tool span, so it is context for no sampled token.
    samples = [
        TrainSample(
            **{
                **s.__dict__,
                "response_ids": (*s.response_ids, 5, 6),
                "loss_mask": (*s.loss_mask, 0, 0),
                "behaviour_logprobs": (*s.behaviour_logprobs, 0.0, 0.0),
                "policy_versions": (*s.policy_versions, 0, 0),
            }
        )
        for s in base
    ]
    model = backend.model

    mb = collate(samples, range(len(samples)), torch.device("cpu"))
    logits = response_logits(model, mb, 1.0)
    logits.retain_grad()
    logp = torch.log_softmax(logits, -1).gather(-1, mb.labels.unsqueeze(-1)).squeeze(-1)
    backward(-(logp * mb.mask).sum() / mb.mask.sum())
    assert logits.grad is not None
    per_position = logits.grad.abs().sum(-1)
    assert torch.all(per_position[mb.mask == 0] == 0)
    assert torch.all(per_position[mb.mask == 1] > 0)
    model.zero_grad(set_to_none=True)

    def sft_grads(batch: list[TrainSample]) -> dict[str, Any]:
        clone = copy.deepcopy(model)
        m = collate(batch, range(len(batch)), torch.device("cpu"))
        lp = torch.log_softmax(response_logits(clone, m, 1.0), -1).gather(-1, m.labels.unsqueeze(-1)).squeeze(-1)
        backward(-(lp * m.mask).sum() / m.mask.sum())
        return grads_of(clone)

    altered = [TrainSample(**{**s.__dict__, "response_ids": (*s.response_ids[:-1], 40)}) for s in samples]
    assert_grads_equal(sft_grads(altered), sft_grads(samples))

    def sampled_nll() -> float:
        with torch.no_grad():
            m = collate(samples, range(len(samples)), torch.device("cpu"))
            lp = torch.log_softmax(response_logits(model, m, 1.0), -1).gather(-1, m.labels.unsqueeze(-1)).squeeze(-1)
            return float(-(lp * m.mask).sum() / m.mask.sum())

    before = sampled_nll()
    first = backend.train_sft(TrainBatch(tuple(samples), 0))
    assert first["loss/sft"] == pytest.approx(before, rel=1e-5)
    for _ in range(5):
        backend.train_sft(TrainBatch(tuple(samples), 0))
    after = sampled_nll()
    assert after < before - 0.05


@pytest.mark.parametrize("decay", ["constant", "linear"])
def test_sft_passes_run_at_the_decayed_learning_rate(micro_model_dir: Path, decay: str) -> None:
    """``sft.lr_decay: linear``: pass e of E updates at lr * (E - e) / E; the rate is back to lr
    after the step (a later step starts from it again); ``constant`` keeps lr throughout."""
    backend = load_backend(micro_model_dir, mode="sft", learning_rate=1e-3, ppo_epochs=4, sft={"lr_decay": decay})
    seen: list[float] = []
    step = backend.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        seen.append(backend.optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    backend.optimizer.step = recording_step
    backend.train_sft(TrainBatch(tuple(make_samples({"a": [1.0, 1.0]}, seed=5)), 0))
    want = [1e-3, 0.75e-3, 0.5e-3, 0.25e-3] if decay == "linear" else [1e-3] * 4
    assert seen == pytest.approx(want)
    assert backend.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_the_verl_backend_refuses_a_decay_over_sft_passes() -> None:
    from openforge_core.errors import InvalidArgument
    from openforge_trainer.backends.verl_backend import _validate

    cfg = RunConfig(model="m", tasks=["t"], mode="sft", ppo_epochs=4, sft={"lr_decay": "linear"})
    with pytest.raises(InvalidArgument, match=r"sft\.lr_decay"):
        _validate(cfg)


def test_several_updates_per_step_recompute_old_logprobs_and_clip(micro_model_dir: Path) -> None:
    """With 2 epochs x 2 mini-batches, π_old is fixed before the first update, so later updates
    see ratios away from 1: the PPO ratio moves (ppo_kl != 0) and a large learning rate clips."""
    backend = load_backend(micro_model_dir, ppo_epochs=2, mini_batches=2, learning_rate=5e-2)
    samples = make_samples({"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 1.0]}, seed=13)
    metrics = backend.train_rl(TrainBatch(tuple(samples), 0))
    assert metrics["actor/ppo_kl"] != 0.0
    assert metrics["actor/pg_clipfrac"] > 0.0


def _rl_batch() -> TrainBatch:
    return TrainBatch(tuple(make_samples({"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 1.0]})), 0)


def test_gradient_checkpointing_gives_the_same_step(micro_model_dir: Path) -> None:
    """Recomputing activations in the backward changes memory, not one number of the step."""
    import torch

    plain = load_backend(micro_model_dir, micro_batch_tokens=40)
    recomputed = load_backend(micro_model_dir, micro_batch_tokens=40, gradient_checkpointing=True)
    assert recomputed.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    want = plain.train_rl(_rl_batch())
    got = recomputed.train_rl(_rl_batch())
    assert got["loss/total"] == pytest.approx(want["loss/total"], rel=1e-6, abs=1e-9)
    assert_grads_equal(grads_of(recomputed.model), grads_of(plain.model))
    for (name, p), q in zip(plain.model.named_parameters(), recomputed.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=f"updated {name} differs")


def test_bf16_mixed_precision_keeps_fp32_weights_and_follows_the_fp32_step(micro_model_dir: Path) -> None:
    """bf16 autocast: the forward runs in bf16 (the loss differs from fp32's), the weights, their
    gradients and the optimizer state stay fp32, and the step points where fp32's does."""
    import torch

    fp32 = load_backend(micro_model_dir, precision="fp32")
    bf16 = load_backend(micro_model_dir, precision="bf16")
    want = fp32.train_rl(_rl_batch())
    got = bf16.train_rl(_rl_batch())
    assert got["loss/total"] != want["loss/total"]  # autocast ran
    assert got["loss/total"] == pytest.approx(want["loss/total"], rel=0.05, abs=2e-3)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    assert {g.dtype for g in grads_of(bf16.model).values()} == {torch.float32}
    exp_avg = [s["exp_avg"] for s in bf16.optimizer.state.values()]
    assert exp_avg and {t.dtype for t in exp_avg} == {torch.float32}
    g16, g32 = grads_of(bf16.model), grads_of(fp32.model)
    flat16 = torch.cat([g16[n].flatten() for n in sorted(g32)])
    flat32 = torch.cat([g32[n].flatten() for n in sorted(g32)])
    assert float(torch.nn.functional.cosine_similarity(flat16, flat32, dim=0)) > 0.99


@pytest.mark.parametrize(
    ("precision", "device", "bf16"),
    [("fp32", "cuda", False), ("bf16", "cpu", True), ("auto", "cpu", False), ("auto", "cuda", None)],
)
def test_precision_auto_is_bf16_only_on_a_cuda_device_that_has_it(
    precision: str, device: str, bf16: bool | None
) -> None:
    import torch

    from openforge_trainer.backends.hf_common import uses_bf16

    native = torch.cuda.is_available() and torch.cuda.get_device_capability(torch.device(device)) >= (8, 0)
    expected = bf16 if bf16 is not None else native
    assert uses_bf16(precision, device) is expected
