"""The ``torch`` backend: one process, CPU or one GPU, an HF causal LM, veRL's algorithms.

Every formula comes from ``verl==0.9.1`` (called, not rewritten):

* advantages: ``core_algos.compute_grpo_outcome_advantage`` (GRPO, Shao et al. 2024,
  arXiv:2402.03300) and ``compute_rloo_outcome_advantage`` (RLOO, Ahmadian et al. 2024,
  arXiv:2402.14740) on one row per rollout (each rollout counts once in its group's statistics
  however many samples it was split into; every sample carries its rollout's advantage:
  :func:`~openforge_trainer.backends.verl_batch.rollout_advantages`);
  ``compute_reinforce_plus_plus_outcome_advantage`` (REINFORCE++, Hu 2025, arXiv:2501.03262) on
  the samples' tokens with the outcome reward on each sample's last sampled token; each called
  the way ``ray_trainer.compute_advantage`` calls it;
* truncated importance sampling against the recorded behaviour logprobs:
  ``rollout_corr_helper.compute_rollout_correction_weights`` at token level,
  ``w = min(π_old / π_behaviour, is_cap)``, detached (TIS, Yao et al. 2025, "Your efficient RL
  framework secretly brings you off-policy RL training"; veRL's "decoupled" mode);
* policy loss: ``core_algos.get_policy_loss_fn("vanilla")`` (PPO-clip with dual clip,
  Schulman et al. 2017 arXiv:1707.06347, Ye et al. 2019 arXiv:1912.09729) or ``"gspo"``
  (Zheng et al. 2025, arXiv:2507.18071), each multiplied by the IS weights, aggregated by
  ``core_algos.agg_loss`` over the whole mini-batch (``global_batch_info``), so gradient
  accumulation over micro-batches gives the full-batch gradient;
* KL to the initial policy: ``core_algos.kl_penalty`` (Schulman 2020, k1/k2/k3);
* logprobs and entropy: ``verl.utils.torch_functional.logprobs_from_logits`` and
  ``entropy_from_logits``;
* SFT: the negative log-likelihood of the loss-mask tokens, aggregated with ``agg_loss``
  (veRL's ``workers.utils.losses.sft_loss`` with ``token-mean``).

π_old is the policy before the step's first update: with one update per step it equals the
current policy (``log_prob.detach()``, so the PPO ratio is 1 and only the IS weights correct for
the behaviour policy); with several (``ppo_epochs * mini_batches > 1``) it is recomputed once
without gradients before the first update.
"""

from __future__ import annotations

import importlib
import itertools
import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import structlog

from openforge_core.run_config import RunConfig
from openforge_trainer.backends import hf_common, verl_batch
from openforge_trainer.backends.base import OPTIMIZER_FILE
from openforge_trainer.domain.samples import TrainBatch, TrainSample

if TYPE_CHECKING:
    import torch

log = structlog.get_logger(__name__)

#: veRL's names of the advantage estimators and policy losses.
ADV_ESTIMATORS: Final = {"grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_plus_plus"}
POLICY_LOSSES: Final = {"ppo-clip": "vanilla", "gspo": "gspo"}


@dataclass(frozen=True)
class Verl:
    """Handles on the veRL modules used (typed ``Any``: veRL's functions are untyped)."""

    core_algos: Any
    rollout_corr: Any
    functional: Any
    workers_config: Any
    trainer_config: Any


def load_verl() -> Verl:
    """Imports veRL's algorithm modules.

    Raises:
        ImportError: verl (requirements/trainer-cpu.txt) is not installed.
    """
    return Verl(
        core_algos=importlib.import_module("verl.trainer.ppo.core_algos"),
        rollout_corr=importlib.import_module("verl.trainer.ppo.rollout_corr_helper"),
        functional=importlib.import_module("verl.utils.torch_functional"),
        workers_config=importlib.import_module("verl.workers.config"),
        trainer_config=importlib.import_module("verl.trainer.config"),
    )


def actor_config(verl: Verl, config: RunConfig) -> Any:
    """veRL ``ActorConfig`` carrying the run's clip ratios, loss and KL settings."""
    return verl.workers_config.ActorConfig(
        strategy="fsdp",  # required by the dataclass; unused by the loss functions
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=config.group_size,
        clip_ratio=config.clip_ratio_low,
        clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=config.loss_agg_mode,
        entropy_coeff=config.entropy_coeff,
        use_kl_loss=config.kl_coef > 0,
        kl_loss_coef=config.kl_coef,
        kl_loss_type=config.kl_loss_type,
        ppo_epochs=config.ppo_epochs,
    )


@dataclass
class MicroBatch:
    """Padded tensors of a few samples (b rows).

    Attributes:
        rows: Indices of the samples in the batch.
        input_ids: (b, L) prompt + response ids, right-padded with 0.
        attention_mask: (b, L) 1 on real tokens.
        keep: Logit positions computed: the last ``keep`` of L.
        gather_index: (b, R) position (within the kept logits) whose logits predict response
            token j of row i.
        labels: (b, R) response ids (0 on padding).
        mask: (b, R) float loss mask (0 on padding).
        behaviour: (b, R) behaviour logprobs.
        advantages: (b, R) advantages (set by the RL step).
        old_log_prob: (b, R) π_old logprobs when recomputed (several updates per step).
    """

    rows: list[int]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: int
    gather_index: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor | None = None
    old_log_prob: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens."""
        return int(self.attention_mask.sum().item())


def split_micro_batches(samples: Sequence[TrainSample], rows: Sequence[int], token_budget: int) -> list[list[int]]:
    """Greedy split of rows (in order) so that rows x longest sequence <= ``token_budget``.

    A sample longer than the budget gets a micro-batch of its own.
    """
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for r in rows:
        n = len(samples[r].prompt_ids) + len(samples[r].response_ids)
        if cur and max(longest, n) * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


def collate(samples: Sequence[TrainSample], rows: Sequence[int], device: torch.device) -> MicroBatch:
    """Pads ``samples[rows]`` into a :class:`MicroBatch`.

    The logits at position ``P_i - 1 + j`` predict response token ``j`` of a row whose prompt
    has ``P_i`` tokens; only positions from the smallest ``P_i - 1`` on are computed.
    """
    import torch

    picked = [samples[r] for r in rows]
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in picked]
    max_len = max(lengths)
    max_resp = max(1, max(len(s.response_ids) for s in picked))
    first = min(len(s.prompt_ids) - 1 for s in picked)
    keep = max_len - first
    b = len(picked)
    input_ids = torch.zeros((b, max_len), dtype=torch.long)
    attention = torch.zeros((b, max_len), dtype=torch.long)
    gather = torch.zeros((b, max_resp), dtype=torch.long)
    labels = torch.zeros((b, max_resp), dtype=torch.long)
    mask = torch.zeros((b, max_resp), dtype=torch.float32)
    behaviour = torch.zeros((b, max_resp), dtype=torch.float32)
    for i, s in enumerate(picked):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, :p] = torch.tensor(s.prompt_ids, dtype=torch.long)
        attention[i, : p + r] = 1
        if r:
            input_ids[i, p : p + r] = torch.tensor(s.response_ids, dtype=torch.long)
            gather[i, :r] = torch.arange(p - 1 - first, p - 1 - first + r)
            labels[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
            mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
            behaviour[i, :r] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
    return MicroBatch(
        rows=list(rows),
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        keep=keep,
        gather_index=gather.to(device),
        labels=labels.to(device),
        mask=mask.to(device),
        behaviour=behaviour.to(device),
    )


def response_logits(model: Any, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Logits predicting each response token: (b, R, V), divided by ``temperature``."""
    import torch

    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False, logits_to_keep=mb.keep)
    logits: torch.Tensor = out.logits
    vocab = logits.shape[-1]
    picked = torch.gather(logits, 1, mb.gather_index.unsqueeze(-1).expand(-1, -1, vocab))
    if temperature != 1.0:
        picked = picked / temperature
    return picked


def outcome_rewards(samples: Sequence[TrainSample], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level rewards and response mask of the whole batch, (N, width) each.

    The sample's reward sits on its last loss-mask token (veRL's outcome-reward layout).
    """
    import torch

    rewards = torch.zeros((len(samples), width), dtype=torch.float32)
    mask = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        if s.response_ids:
            mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
        sampled = [j for j, m in enumerate(s.loss_mask) if m]
        if sampled:
            rewards[i, sampled[-1]] = s.reward
    return rewards, mask


def compute_advantages(verl: Verl, config: RunConfig, samples: Sequence[TrainSample]) -> torch.Tensor:
    """Advantages (N, R_max) with veRL's estimator.

    grpo and rloo are group statistics: the estimator runs on one row per rollout
    (:func:`~openforge_trainer.backends.verl_batch.rollout_advantages`, grouped by ``group_id``),
    so a rollout split into several samples counts once in its group's mean and std, and each of
    its samples gets that one scalar on its loss-mask tokens. reinforce++ is not a group
    statistic (discounted returns whitened over every sampled token of the batch): it runs per
    token on the samples, with each sample's reward on its last sampled token
    (:func:`outcome_rewards`), so there each sample's tokens count in the batch statistics.

    Args:
        verl: veRL modules.
        config: Algorithm, ``norm_adv_by_std`` and ``gamma``.
        samples: The batch's samples (N).

    Returns:
        Advantages (N, R_max, float32), 0 outside the loss mask.
    """
    import numpy as np
    import torch

    width = max(1, max(len(s.response_ids) for s in samples))
    token_rewards, mask = outcome_rewards(samples, width)
    name = ADV_ESTIMATORS[config.algorithm]
    if name in verl_batch.GROUP_ESTIMATORS:
        per_sample = verl_batch.rollout_advantages(
            verl.core_algos,
            [s.rollout_id for s in samples],
            [s.group_id for s in samples],
            [s.reward for s in samples],
            estimator=name,
            gamma=config.gamma,
            norm_adv_by_std=config.norm_adv_by_std,
        )
        return torch.tensor(per_sample, dtype=torch.float32).unsqueeze(-1) * mask
    algo = verl.trainer_config.AlgoConfig(
        adv_estimator=name, gamma=config.gamma, norm_adv_by_std_in_grpo=config.norm_adv_by_std
    )
    index = np.array([s.group_id for s in samples], dtype=object)
    fn = verl.core_algos.get_adv_estimator_fn(name)
    advantages, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=index, config=algo)
    result: torch.Tensor = advantages
    return result


def policy_objective(
    verl: Verl,
    cfg: Any,
    *,
    loss_name: str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_cap: float,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """Policy loss with truncated importance sampling, exactly as veRL computes it.

    ``w = compute_rollout_correction_weights(old_log_prob - behaviour_log_prob, "token", is_cap)``
    then ``get_policy_loss_fn(loss_name)(old_log_prob, log_prob, advantages, mask,
    cfg.loss_agg_mode, cfg, rollout_is_weights=w)``. ``cfg.global_batch_info`` sets the
    aggregation denominators (dp_size, batch_num_tokens, global_batch_size).

    Args:
        verl: veRL modules.
        cfg: veRL ``ActorConfig``.
        loss_name: veRL loss name (``vanilla``, ``gspo``).
        log_prob: (b, R) current logprobs (with gradient).
        old_log_prob: (b, R) π_old logprobs.
        behaviour_log_prob: (b, R) logprobs of the policy that sampled.
        advantages: (b, R).
        mask: (b, R) loss mask.
        is_cap: TIS threshold.

    Returns:
        (loss, metrics, is_weights): the scalar loss share of this micro-batch, veRL's loss and
        IS metrics (renamed ``actor/...`` and ``is/...``), and the (b, R) IS weights.
    """
    weights, is_metrics = verl.rollout_corr.compute_rollout_correction_weights(
        log_ratio=old_log_prob - behaviour_log_prob,
        response_mask=mask,
        rollout_is="token",
        rollout_is_threshold=is_cap,
    )
    loss_fn = verl.core_algos.get_policy_loss_fn(loss_name)
    loss, pg_metrics = loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
        rollout_is_weights=weights,
    )
    metrics = {k: float(v) for k, v in pg_metrics.items()}
    metrics.update({"is/" + k.removeprefix("rollout_is_"): float(v) for k, v in is_metrics.items()})
    return loss, metrics, weights


class TorchBackend:
    """An HF causal LM trained in this process with AdamW.

    Args:
        config: The run config (algorithm, loss, optimizer, device, batch sizes).

    Raises:
        ImportError: torch, transformers or verl is not installed.
    """

    def __init__(self, config: RunConfig) -> None:
        import torch

        self._config = config
        self._verl = load_verl()
        self._device = torch.device(config.device)
        self._bf16 = hf_common.uses_bf16(config.precision, config.device)
        self._cfg = actor_config(self._verl, config)
        self._loss_name = POLICY_LOSSES[config.loss]
        self._model: Any = None
        self._ref: Any = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._model_dir: Path | None = None
        torch.manual_seed(config.seed)

    @property
    def model(self) -> Any:
        """The HF model (after :meth:`load`)."""
        if self._model is None:
            raise RuntimeError("TorchBackend.load() was not called")
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer (after :meth:`load`)."""
        if self._optimizer is None:
            raise RuntimeError("TorchBackend.load() was not called")
        return self._optimizer

    def load(self, model_dir: Path, checkpoint_dir: Path | None) -> None:
        """Loads weights (and the optimizer state of a checkpoint); see the protocol."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self._model_dir = model_dir
        source = checkpoint_dir or model_dir
        model: Any = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
        model.to(self._device)
        if self._config.gradient_checkpointing:  # None: off, this backend's default
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        self._model = model
        self._optimizer = torch.optim.AdamW(
            model.parameters(), lr=self._config.learning_rate, weight_decay=self._config.weight_decay
        )
        if checkpoint_dir is not None:
            state = torch.load(checkpoint_dir / OPTIMIZER_FILE, map_location=self._device, weights_only=True)
            self._optimizer.load_state_dict(state)
        if self._config.kl_coef > 0:
            ref: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            ref.to(self._device)
            ref.eval()
            ref.requires_grad_(False)
            self._ref = ref
        log.info(
            "backend.loaded",
            source=str(source),
            device=str(self._device),
            kl_reference=self._ref is not None,
            precision="bf16" if self._bf16 else "fp32",
            gradient_checkpointing=self._config.gradient_checkpointing,
        )

    # ---- RL ----

    def train_rl(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step over ``batch``; see the module docstring for the formulas."""
        import torch

        started = time.perf_counter()
        samples = batch.samples
        advantages = compute_advantages(self._verl, self._config, samples)
        minis = self._mini_batches(samples)
        needs_old = self._config.updates_per_step > 1
        if needs_old:
            with torch.no_grad():
                for mbs in minis:
                    for mb in mbs:
                        mb.old_log_prob = self._log_prob(self.model, mb)[0].detach()
        for mbs in minis:
            for mb in mbs:
                mb.advantages = advantages[mb.rows, : mb.labels.shape[1]].to(self._device)
        sums: dict[str, float] = defaultdict(float)
        weights_of: dict[str, float] = defaultdict(float)
        losses: list[float] = []
        grad_norms: list[float] = []
        for _epoch in range(self._config.ppo_epochs):
            for mbs in minis:
                self._set_batch_info(mbs)
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for mb in mbs:
                    loss, metrics, ntok = self._rl_micro(mb, fresh_old=not needs_old)
                    _backward(loss)
                    total += float(loss.detach())
                    for k, v in metrics.items():
                        sums[k] += v * ntok
                        weights_of[k] += ntok
                grad_norms.append(self._clip_and_step())
                losses.append(total)
        out = {k: sums[k] / weights_of[k] for k in sums if weights_of[k] > 0}
        out["loss/total"] = sum(losses) / len(losses)
        out["grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["advantage/mean"] = _masked_mean(advantages, _resp_mask(samples, advantages.shape[1]))
        out.update(self._throughput(batch, time.perf_counter() - started))
        return out

    def _rl_micro(self, mb: MicroBatch, *, fresh_old: bool) -> tuple[torch.Tensor, dict[str, float], float]:
        import torch

        log_prob, entropy = self._log_prob(self.model, mb, with_entropy=True)
        old = log_prob.detach() if fresh_old else mb.old_log_prob
        assert old is not None and mb.advantages is not None
        loss, metrics, _weights = policy_objective(
            self._verl,
            self._cfg,
            loss_name=self._loss_name,
            log_prob=log_prob,
            old_log_prob=old,
            behaviour_log_prob=mb.behaviour,
            advantages=mb.advantages,
            mask=mb.mask,
            is_cap=self._config.is_cap,
        )
        agg = self._verl.core_algos.agg_loss
        info = self._cfg.global_batch_info
        metrics["loss/policy"] = float(loss.detach())
        ntok = float(mb.mask.sum().item())
        raw_ratio = torch.exp(torch.clamp(old - mb.behaviour, -20.0, 20.0))
        metrics["is/capped_fraction"] = _masked_mean(raw_ratio > self._config.is_cap, mb.mask)
        # KL(π_behaviour || π_θ) estimate (k3) on the sampled tokens: how far the policy moved
        # from the one that sampled.
        behaviour_kl = self._verl.core_algos.kl_penalty(old, mb.behaviour, "low_var_kl")
        metrics["kl/behaviour"] = _masked_mean(behaviour_kl, mb.mask)
        assert entropy is not None
        if self._config.entropy_coeff > 0:
            entropy_loss = agg(loss_mat=entropy, loss_mask=mb.mask, loss_agg_mode=self._cfg.loss_agg_mode, **info)
            loss = loss - self._config.entropy_coeff * entropy_loss
        metrics["entropy"] = _masked_mean(entropy.detach(), mb.mask)
        if self._ref is not None:
            with torch.no_grad():
                ref_log_prob = self._log_prob(self._ref, mb)[0]
            kld = self._verl.core_algos.kl_penalty(log_prob, ref_log_prob, self._config.kl_loss_type)
            kl_loss = agg(loss_mat=kld, loss_mask=mb.mask, loss_agg_mode=self._cfg.loss_agg_mode, **info)
            loss = loss + self._config.kl_coef * kl_loss
            metrics["kl/reference"] = _masked_mean(kld.detach(), mb.mask)
        return loss, metrics, ntok

    # ---- SFT ----

    def train_sft(self, batch: TrainBatch) -> dict[str, float]:
        """One SFT step: ``agg_loss(-log_prob, loss_mask)``, one update per mini-batch, over
        ``ppo_epochs`` passes (``updates_per_step`` updates; one by default), at the learning
        rate of ``sft.lr_decay``.

        ``loss/sft`` and ``sft/nll_per_token`` are those of the first pass,
        ``sft/nll_per_token_last`` that of the last; each mini-batch is measured just before its
        own update (with one mini-batch: the whole batch before the pass's update).
        """
        started = time.perf_counter()
        minis = self._mini_batches(batch.samples)
        losses: list[float] = []
        nlls: list[float] = []
        grad_norms: list[float] = []
        passes = self._config.ppo_epochs
        for epoch in range(passes):
            if self._config.sft.lr_decay == "linear":
                self._set_lr(self._config.learning_rate * (passes - epoch) / passes)
            nll_sum = ntok = total = 0.0
            for mbs in minis:
                self._set_batch_info(mbs)
                self.optimizer.zero_grad(set_to_none=True)
                for mb in mbs:
                    log_prob, _ = self._log_prob(self.model, mb)
                    loss = self._verl.core_algos.agg_loss(
                        loss_mat=-log_prob,
                        loss_mask=mb.mask,
                        loss_agg_mode=self._cfg.loss_agg_mode,
                        **self._cfg.global_batch_info,
                    )
                    _backward(loss)
                    total += float(loss.detach())
                    nll_sum += float((-log_prob.detach() * mb.mask).sum())
                    ntok += float(mb.mask.sum())
                grad_norms.append(self._clip_and_step())
            losses.append(total / len(minis))
            nlls.append(nll_sum / ntok if ntok else math.nan)
        self._set_lr(self._config.learning_rate)
        out = {"loss/sft": losses[0], "loss/total": losses[0], "grad_norm": sum(grad_norms) / len(grad_norms)}
        if not math.isnan(nlls[0]):
            out["sft/nll_per_token"] = nlls[0]
            out["sft/nll_per_token_last"] = nlls[-1]
        out.update(self._throughput(batch, time.perf_counter() - started))
        return out

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ---- checkpoints ----

    def save_checkpoint(self, directory: Path) -> None:
        """Writes ``model.safetensors``, config, tokenizer files and ``optimizer.pt``."""
        hf_common.save_checkpoint(self.model, self.optimizer, self._model_dir, directory)

    def close(self) -> None:
        """Drops the model, reference and optimizer."""
        self._model = None
        self._ref = None
        self._optimizer = None

    # ---- helpers ----

    def _log_prob(
        self, model: Any, mb: MicroBatch, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        import torch

        # bf16: the forward (and so its backward) under autocast, the weights, gradients and
        # optimizer state stay fp32; the log-softmax runs on the logits cast to fp32 (they were
        # computed, and so rounded, in bf16).
        with torch.autocast(self._device.type, dtype=torch.bfloat16, enabled=self._bf16):
            logits = response_logits(model, mb, self._config.temperature)
        logits = logits.float()
        log_prob: torch.Tensor = self._verl.functional.logprobs_from_logits(logits, mb.labels)
        entropy: torch.Tensor | None = None
        if with_entropy:
            if self._config.entropy_coeff > 0:
                entropy = self._verl.functional.entropy_from_logits(logits)
            else:
                with torch.no_grad():
                    entropy = self._verl.functional.entropy_from_logits(logits.detach())
        return log_prob, entropy

    def _micro_rows(self, samples: Sequence[TrainSample], rows: Sequence[int] | range) -> list[list[int]]:
        return split_micro_batches(samples, list(rows), self._config.micro_batch_tokens)

    def _mini_batches(self, samples: Sequence[TrainSample]) -> list[list[MicroBatch]]:
        parts = min(self._config.mini_batches, len(samples))
        return [
            [collate(samples, rows, self._device) for rows in self._micro_rows(samples, part)]
            for part in iter_rows(len(samples), parts)
        ]

    def _set_batch_info(self, mbs: Sequence[MicroBatch]) -> None:
        """Aggregation denominators of one optimizer update (veRL ``global_batch_info``)."""
        tokens = sum(float(mb.mask.sum()) for mb in mbs)
        seqs = sum(int((mb.mask.sum(dim=-1) > 0).sum()) for mb in mbs)
        horizon = max(mb.mask.shape[1] for mb in mbs)
        info = self._cfg.global_batch_info
        info.clear()
        info.update(dp_size=1, batch_num_tokens=max(tokens, 1.0), global_batch_size=max(seqs, 1))
        info["loss_scale_factor"] = horizon

    def _clip_and_step(self) -> float:
        max_norm = self._config.max_grad_norm if self._config.max_grad_norm > 0 else math.inf
        return hf_common.clip_and_step(self.model, self.optimizer, max_norm, "backend.nonfinite_grad")

    @staticmethod
    def _throughput(batch: TrainBatch, seconds: float) -> dict[str, float]:
        return hf_common.throughput(batch, seconds)


def _backward(loss: Any) -> None:
    loss.backward()


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    denom = float(mask.sum())
    if denom == 0:
        return 0.0
    return float((values.float() * mask).sum()) / denom


def _resp_mask(samples: Sequence[TrainSample], width: int) -> torch.Tensor:
    return outcome_rewards(samples, width)[1]


def iter_rows(n: int, parts: int) -> Iterator[range]:
    """Contiguous ranges splitting ``range(n)`` into ``parts`` near-equal parts."""
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            yield range(lo, hi)
