"""The ``verl`` backend: our store samples trained with veRL's (``verl==0.9.1``) actor loss.

Each step:

1. the batch of :class:`TrainSample` becomes veRL's ``DataProto``
   (:func:`~openforge_trainer.backends.verl_batch.samples_to_dataproto`: left-padded prompts,
   right-padded responses, ``response_mask`` = our loss mask, ``rollout_log_probs`` = our
   behaviour logprobs, ``uid`` = group id);
2. advantages with veRL's outcome estimator on ``token_level_rewards`` grouped by ``uid``;
3. ``old_log_probs`` (π_old, the policy before the step's first update, computed without
   gradient as veRL's ``compute_log_prob`` does), ``rollout_is_weights`` from veRL's
   ``compute_rollout_correction_weights`` (token TIS, "decoupled" mode), ``ref_log_prob`` when
   the KL loss is on;
4. for each epoch and mini-batch: the micro-batches go through ``to_tensordict`` and
   ``left_right_2_no_padding`` into veRL's ``workers.utils.losses.ppo_loss`` (or ``sft_loss``)
   with the engine's normalisation entries (``dp_size``, ``batch_num_tokens``,
   ``global_batch_size``); gradients accumulate; clip; AdamW step;
5. checkpoints are HF safetensors (+ ``optimizer.pt``), which the loop hands to inference
   ``UpdateWeights`` like the ``torch`` backend's.

The model forward (veRL's FSDP engine on GPUs) is run here in-process, one sequence at a time
(:func:`~openforge_trainer.backends.verl_batch.sequence_log_probs`), so this backend runs on CPU
and on one GPU. The multi-GPU path runs veRL's Ray worker group with the config from
:func:`verl_config` (see ``services/trainer/VERL.md``).
"""

from __future__ import annotations

import importlib
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import structlog

from openforge_core.errors import InvalidArgument
from openforge_trainer.backends import hf_common, verl_batch
from openforge_trainer.backends.base import OPTIMIZER_FILE
from openforge_trainer.domain.config import RunConfig
from openforge_trainer.domain.samples import TrainBatch

log = structlog.get_logger(__name__)

#: The veRL version this backend's layout and config mapping were written against.
VERL_VERSION: Final = "0.9.1"

#: Our names → veRL's.
ADV_ESTIMATORS: Final = {"grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_plus_plus"}
POLICY_LOSSES: Final = {"ppo-clip": "vanilla", "gspo": "gspo"}


def _reject(field: str, why: str) -> InvalidArgument:
    return InvalidArgument.field(field, f"the verl backend cannot express this: {why}")


def verl_config(config: RunConfig) -> dict[str, Any]:
    """Maps a run config onto veRL's trainer config (the keys of ``ppo_trainer.yaml``).

    Field by field (also in ``services/trainer/VERL.md``); fields not listed are our loop's
    (tasks, harness, staleness, evaluation, pass@k) and never reach veRL.

    Raises:
        InvalidArgument: A setting veRL 0.9.1 cannot express (one field violation, named).
    """
    rollouts = config.groups_per_step * config.group_size
    if config.groups_per_step % config.mini_batches:
        raise _reject(
            "mini_batches",
            f"veRL's ppo_mini_batch_size counts prompts (groups): groups_per_step={config.groups_per_step} "
            f"must be a multiple of mini_batches={config.mini_batches}",
        )
    if config.max_grad_norm == 0:
        raise _reject("max_grad_norm", "veRL always clips the gradient norm (actor.optim.clip_grad); set a value > 0")
    if config.mode == "sft" and config.loss_agg_mode != "token-mean":
        raise _reject(
            "loss_agg_mode",
            f"veRL's sft_loss is a token mean over the batch; {config.loss_agg_mode!r} needs mode 'rl' or 'token-mean'",
        )
    if config.device != "cpu" and not config.device.startswith("cuda"):
        raise _reject("device", f"{config.device!r}: veRL trains on 'cuda' devices (or 'cpu' in-process)")
    mini_prompts = config.groups_per_step // config.mini_batches
    return {
        "data": {"train_batch_size": config.groups_per_step},
        "algorithm": {
            "adv_estimator": ADV_ESTIMATORS[config.algorithm],
            "gamma": config.gamma,
            "norm_adv_by_std_in_grpo": config.norm_adv_by_std,
            "use_kl_in_reward": False,
            "rollout_correction": {"rollout_is": "token", "rollout_is_threshold": config.is_cap, "bypass_mode": False},
        },
        "actor_rollout_ref": {
            "model": {"path": config.model},
            "rollout": {"n": config.group_size, "temperature": config.temperature},
            "actor": {
                "strategy": "fsdp",
                "ppo_mini_batch_size": mini_prompts,
                "ppo_epochs": config.ppo_epochs,
                "shuffle": False,
                "data_loader_seed": config.seed,
                "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": config.micro_batch_tokens,
                "loss_agg_mode": config.loss_agg_mode,
                "policy_loss": {"loss_mode": POLICY_LOSSES[config.loss]},
                "clip_ratio": config.clip_ratio_low,
                "clip_ratio_low": config.clip_ratio_low,
                "clip_ratio_high": config.clip_ratio_high,
                "clip_ratio_c": config.clip_ratio_c,
                "entropy_coeff": config.entropy_coeff,
                "calculate_entropy": True,
                "use_kl_loss": config.kl_coef > 0,
                "kl_loss_coef": config.kl_coef,
                "kl_loss_type": config.kl_loss_type,
                "optim": {
                    "optimizer": "AdamW",
                    "lr": config.learning_rate,
                    "weight_decay": config.weight_decay,
                    "clip_grad": config.max_grad_norm,
                },
            },
        },
        "trainer": {
            "total_training_steps": config.steps,
            "device": "cpu" if config.device == "cpu" else "cuda",
            "n_gpus_per_node": 1,
            "nnodes": 1,
        },
        "openforge": {"rollouts_per_step": rollouts, "mode": config.mode},
    }


def actor_config(config: RunConfig) -> Any:
    """veRL ``ActorConfig`` built from :func:`verl_config`'s actor section (what ``ppo_loss``
    reads: loss mode, clip ratios, aggregation, entropy and KL settings)."""
    mapped = verl_config(config)["actor_rollout_ref"]["actor"]
    workers_config = importlib.import_module("verl.workers.config")
    rollouts = config.groups_per_step * config.group_size
    return workers_config.ActorConfig(
        strategy=mapped["strategy"],
        ppo_mini_batch_size=rollouts // config.mini_batches,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=mapped["ppo_max_token_len_per_gpu"],
        rollout_n=config.group_size,
        ppo_epochs=mapped["ppo_epochs"],
        shuffle=False,
        data_loader_seed=mapped["data_loader_seed"],
        clip_ratio=mapped["clip_ratio"],
        clip_ratio_low=mapped["clip_ratio_low"],
        clip_ratio_high=mapped["clip_ratio_high"],
        clip_ratio_c=mapped["clip_ratio_c"],
        loss_agg_mode=mapped["loss_agg_mode"],
        policy_loss=workers_config.PolicyLossConfig(loss_mode=mapped["policy_loss"]["loss_mode"]),
        entropy_coeff=mapped["entropy_coeff"],
        calculate_entropy=True,
        use_kl_loss=mapped["use_kl_loss"],
        kl_loss_coef=mapped["kl_loss_coef"],
        kl_loss_type=mapped["kl_loss_type"],
    )


def split_rows(lengths: Sequence[int], rows: Sequence[int], token_budget: int) -> list[list[int]]:
    """Greedy split of rows (in order) so that rows x longest sequence <= ``token_budget``."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for r in rows:
        n = lengths[r]
        if cur and max(longest, n) * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, longest = [], 0
        cur.append(r)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


class VerlBackend:
    """An HF causal LM trained with veRL's batch layout and loss functions.

    Args:
        config: The run config; rejected (``InvalidArgument``) when veRL cannot express it.

    Raises:
        InvalidArgument: See :func:`verl_config`.
        ImportError: torch, transformers or verl is not installed.
    """

    def __init__(self, config: RunConfig) -> None:
        import torch

        self._config = config
        self._mapped = verl_config(config)
        self._core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        self._rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        self._losses = verl_batch.load_verl_losses()
        self._cfg = actor_config(config)
        self._device = torch.device(config.device)
        self._model: Any = None
        self._ref: Any = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._model_dir: Path | None = None
        self._pad_token_id = 0
        torch.manual_seed(config.seed)

    @property
    def model(self) -> Any:
        """The HF model (after :meth:`load`)."""
        if self._model is None:
            raise RuntimeError("VerlBackend.load() was not called")
        return self._model

    @property
    def optimizer(self) -> Any:
        """The optimizer (after :meth:`load`)."""
        if self._optimizer is None:
            raise RuntimeError("VerlBackend.load() was not called")
        return self._optimizer

    def load(self, model_dir: Path, checkpoint_dir: Path | None) -> None:
        """Loads weights (and the optimizer state of a checkpoint); see the protocol."""
        import torch
        from transformers import AutoModelForCausalLM

        self._model_dir = model_dir
        source = checkpoint_dir or model_dir
        model: Any = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
        model.to(self._device)
        model.train()
        self._model = model
        pad = getattr(model.config, "pad_token_id", None)
        self._pad_token_id = int(pad) if isinstance(pad, int) else 0
        opt = self._mapped["actor_rollout_ref"]["actor"]["optim"]
        self._optimizer = torch.optim.AdamW(model.parameters(), lr=opt["lr"], weight_decay=opt["weight_decay"])
        if checkpoint_dir is not None:
            state = torch.load(checkpoint_dir / OPTIMIZER_FILE, map_location=self._device, weights_only=True)
            self._optimizer.load_state_dict(state)
        if self._config.kl_coef > 0:
            ref: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            ref.to(self._device)
            ref.eval()
            ref.requires_grad_(False)
            self._ref = ref
        log.info("verl_backend.loaded", source=str(source), device=str(self._device), verl=VERL_VERSION)

    # ---- batch ----

    def to_dataproto(self, batch: TrainBatch) -> Any:
        """The batch in veRL's layout, with advantages (RL) added."""
        data = verl_batch.samples_to_dataproto(
            batch.samples,
            pad_token_id=self._pad_token_id,
            temperature=self._config.temperature,
            policy_version=batch.policy_version,
        )
        return data.to(str(self._device)) if self._device.type != "cpu" else data

    def _log_probs(self, model: Any, data: Any, *, with_entropy: bool = False) -> tuple[Any, Any]:
        """(N, R) padded log-probs (and entropy) of ``data`` via veRL's no-padding layout."""
        padding = importlib.import_module("verl.workers.utils.padding")
        td = verl_batch.micro_tensordict(data, batch_num_tokens=1.0, global_batch_size=len(data))
        lp, ent = verl_batch.sequence_log_probs(
            model, td, temperature=self._config.temperature, with_entropy=with_entropy
        )
        return padding.no_padding_2_padding(lp, td), (
            padding.no_padding_2_padding(ent, td) if ent is not None else None
        )

    def prepare_rl(self, data: Any) -> None:
        """Adds ``advantages``, ``old_log_probs``, ``rollout_is_weights`` (and ``ref_log_prob``)."""
        import torch

        verl_batch.compute_advantages(
            self._core_algos,
            data,
            estimator=self._mapped["algorithm"]["adv_estimator"],
            gamma=self._config.gamma,
            norm_adv_by_std=self._config.norm_adv_by_std,
        )
        b = data.batch
        with torch.no_grad():
            b["old_log_probs"] = self._log_probs(self.model, data)[0].detach().float()
            if self._ref is not None:
                b["ref_log_prob"] = self._log_probs(self._ref, data)[0].detach().float()
        mask = b["response_mask"].float()
        weights, is_metrics = self._rollout_corr.compute_rollout_correction_weights(
            log_ratio=b["old_log_probs"] - b["rollout_log_probs"],
            response_mask=mask,
            rollout_is="token",
            rollout_is_threshold=self._config.is_cap,
        )
        b["rollout_is_weights"] = weights
        data.meta_info["is_metrics"] = {k: float(v) for k, v in is_metrics.items()}

    def _mini_batches(self, n: int) -> list[list[int]]:
        size = n // self._config.mini_batches
        parts = [list(range(i * size, (i + 1) * size)) for i in range(self._config.mini_batches)]
        parts[-1].extend(range(self._config.mini_batches * size, n))
        return [p for p in parts if p]

    def _micro_batches(self, data: Any, rows: Sequence[int]) -> list[list[int]]:
        lengths = [int(x) for x in data.batch["attention_mask"].sum(dim=-1)]
        return split_rows(lengths, rows, self._config.micro_batch_tokens)

    def rl_loss(self, data: Any, rows: Sequence[int], *, backward: bool) -> tuple[float, dict[str, float]]:
        """veRL's ``ppo_loss`` summed over the micro-batches of one mini-batch (``rows``).

        Returns:
            (loss, metrics): the mini-batch loss (the sum of the micro-batch shares, as veRL's
            engine reports it) and token-weighted metrics.
        """
        mask = data.batch["response_mask"]
        num_tokens = float(mask[list(rows)].sum())
        with_entropy = self._config.entropy_coeff > 0
        total = 0.0
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        for micro in self._micro_batches(data, rows):
            sub = data.select_idxs(micro)
            td = verl_batch.micro_tensordict(sub, batch_num_tokens=max(num_tokens, 1.0), global_batch_size=len(rows))
            lp, ent = verl_batch.sequence_log_probs(
                self.model, td, temperature=self._config.temperature, with_entropy=with_entropy
            )
            output = {"log_probs": lp} if ent is None else {"log_probs": lp, "entropy": ent}
            loss, metrics = self._losses.ppo_loss(self._cfg, output, td)
            if backward:
                loss.backward()
            total += float(loss.detach())
            ntok = float(sub.batch["response_mask"].sum())
            for k, v in metrics.items():
                value, summed = _metric_value(v)
                if summed:  # a share of the mini-batch value (veRL aggregates these with SUM)
                    sums[k] += value
                    weights[k] = 1.0
                else:
                    sums[k] += value * ntok
                    weights[k] += ntok
        return total, {k: sums[k] / weights[k] for k in sums if weights[k] > 0}

    # ---- protocol ----

    def train_rl(self, batch: TrainBatch) -> dict[str, float]:
        """One RL step (see the module docstring)."""
        started = time.perf_counter()
        data = self.to_dataproto(batch)
        self.prepare_rl(data)
        losses: list[float] = []
        norms: list[float] = []
        sums: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for _epoch in range(self._config.ppo_epochs):
            for rows in self._mini_batches(len(data)):
                self.optimizer.zero_grad(set_to_none=True)
                loss, metrics = self.rl_loss(data, rows, backward=True)
                norms.append(self._clip_and_step())
                losses.append(loss)
                for k, v in metrics.items():
                    sums[k] += v
                    count[k] += 1
        out = {("actor/" + k.removeprefix("actor/")): sums[k] / count[k] for k in sums}
        out.update({"is/" + k.removeprefix("rollout_is_"): v for k, v in data.meta_info["is_metrics"].items()})
        out["loss/total"] = sum(losses) / len(losses)
        out["loss/policy"] = out["loss/total"]
        out["grad_norm"] = sum(norms) / len(norms)
        out.update(self._throughput(batch, time.perf_counter() - started))
        return out

    def sft_loss(self, data: Any, *, backward: bool) -> float:
        """veRL's ``sft_loss`` (padded mode: ``-Σ mask·logp / batch_num_tokens``) over the batch."""
        num_tokens = float(data.batch["response_mask"].sum())
        total = 0.0
        for micro in self._micro_batches(data, range(len(data))):
            sub = data.select_idxs(micro)
            td = verl_batch.micro_tensordict(sub, batch_num_tokens=max(num_tokens, 1.0), global_batch_size=len(data))
            lp, _ = verl_batch.sequence_log_probs(
                self.model, td, temperature=self._config.temperature, with_entropy=False
            )
            padding = importlib.import_module("verl.workers.utils.padding")
            tu = importlib.import_module("verl.utils.tensordict_utils")
            dataset_utils = importlib.import_module("verl.utils.dataset.dataset_utils")
            tu.assign_non_tensor(td, pad_mode=dataset_utils.DatasetPadMode.LEFT_RIGHT)
            loss, _ = self._losses.sft_loss(self._cfg, {"log_probs": padding.no_padding_2_padding(lp, td)}, td)
            if backward:
                loss.backward()
            total += float(loss.detach())
        return total

    def train_sft(self, batch: TrainBatch) -> dict[str, float]:
        """One SFT step with veRL's ``sft_loss`` on the loss-mask tokens."""
        started = time.perf_counter()
        data = self.to_dataproto(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.sft_loss(data, backward=True)
        out = {"loss/sft": loss, "loss/total": loss, "grad_norm": self._clip_and_step()}
        out.update(self._throughput(batch, time.perf_counter() - started))
        return out

    def save_checkpoint(self, directory: Path) -> None:
        """Writes ``model.safetensors`` (HF layout), config, tokenizer files and ``optimizer.pt``."""
        hf_common.save_checkpoint(self.model, self.optimizer, self._model_dir, directory)

    def close(self) -> None:
        """Drops the model, reference and optimizer."""
        self._model = None
        self._ref = None
        self._optimizer = None

    # ---- helpers ----

    def _clip_and_step(self) -> float:
        max_norm = self._mapped["actor_rollout_ref"]["actor"]["optim"]["clip_grad"]
        return hf_common.clip_and_step(self.model, self.optimizer, max_norm, "verl_backend.nonfinite_grad")

    @staticmethod
    def _throughput(batch: TrainBatch, seconds: float) -> dict[str, float]:
        return hf_common.throughput(batch, seconds)


def _metric_value(metric: Any) -> tuple[float, bool]:
    """(value, aggregated-by-sum) of one entry of veRL's loss metrics (a ``Metric`` or a number)."""
    values = getattr(metric, "values", None)
    if isinstance(values, list):
        numbers = [float(x) for x in values]
        value = sum(numbers) / len(numbers) if numbers else 0.0
        return value, str(getattr(metric.aggregation, "value", metric.aggregation)).lower() == "sum"
    return float(metric), False
