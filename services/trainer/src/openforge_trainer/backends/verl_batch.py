"""Store samples ⇄ veRL ``DataProto`` (``verl==0.9.1``), and veRL's loss on such a batch.

Our data contract (``openforge.trajectory.v1.Sample`` → :class:`TrainSample`) is the boundary;
this module is the only place that knows veRL's batch layout, which is the one its rollout
workers produce and ``ray_trainer._update_actor`` hands to the actor:

==========================  ==================================================================
key (N rows)                what it holds
==========================  ==================================================================
``prompts``                 (N, P) prompt ids, **left**-padded with ``pad_token_id``
``responses``               (N, R) every token after the prompt (sampled and tool tokens),
                            **right**-padded
``input_ids``               (N, P+R) ``cat(prompts, responses)``
``attention_mask``          (N, P+R) 1 on real tokens (prompt and whole response), 0 on pads
``position_ids``            (N, P+R) ``clip(cumsum(attention_mask) - 1, 0)`` (veRL's
                            ``compute_position_id_with_mask``)
``response_mask``           (N, R) our ``loss_mask`` (1 = sampled by the policy), 0 on pads
``rollout_log_probs``       (N, R) our behaviour logprobs (0 where the mask is 0 and on pads)
``token_level_scores``      (N, R) the rollout reward on the sample's last loss-mask token
``token_level_rewards``     same as the scores (no in-reward KL penalty)
``policy_versions``         (N, R) our per-token policy versions (veRL ignores this key; kept
                            so the conversion is lossless)
``uid`` (non-tensor)        group id: the GRPO/RLOO index (statistics per rollout, see
                            :func:`rollout_advantages`)
``reward`` (non-tensor)     the rollout reward as a float64 (as in the store's Parquet export)
``sample_id``, ``rollout_id``, ``task_id`` (non-tensor): our ids, for the round trip
``meta_info``               ``temperature``, ``policy_version``, ``pad_token_id``
==========================  ==================================================================

Added per step: ``advantages`` (and ``returns``), ``old_log_probs``, ``rollout_is_weights``,
``ref_log_prob`` — the names veRL's ``workers.utils.losses.ppo_loss`` reads.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from openforge_trainer.domain.samples import TrainSample

#: Non-tensor columns that carry our ids.
ID_COLUMNS: Final = ("sample_id", "rollout_id", "task_id")

#: veRL outcome estimators whose advantage is a statistic of each group's rollout rewards.
GROUP_ESTIMATORS: Final = ("grpo", "rloo")


def load_verl_losses() -> Any:
    """Imports ``verl.workers.utils.losses`` (``ppo_loss``, ``sft_loss``).

    ``verl/utils/dataset/__init__.py`` imports HF ``datasets`` for veRL's data loaders, which the
    CPU install (``requirements/trainer-cpu.txt``) leaves out; ``losses`` only needs the enum in
    ``verl.utils.dataset.dataset_utils``. When ``datasets`` is missing, the package is entered
    without running its ``__init__`` (its submodules import as usual). In veRL's full image
    (``datasets`` installed) this is the plain import.

    Raises:
        ImportError: verl is not installed.
    """
    try:
        return importlib.import_module("verl.workers.utils.losses")
    except ModuleNotFoundError as exc:
        if exc.name != "datasets":
            raise
    utils = importlib.import_module("verl.utils")
    pkg = types.ModuleType("verl.utils.dataset")
    pkg.__path__ = [str(Path(next(iter(utils.__path__))) / "dataset")]
    sys.modules["verl.utils.dataset"] = pkg
    for name in [m for m in sys.modules if m.startswith("verl.workers.utils.losses")]:
        del sys.modules[name]
    return importlib.import_module("verl.workers.utils.losses")


def samples_to_dataproto(
    samples: Sequence[TrainSample], *, pad_token_id: int = 0, temperature: float = 1.0, policy_version: int = 0
) -> Any:
    """Builds veRL's ``DataProto`` of ``samples`` (layout in the module docstring).

    Args:
        samples: Samples of whole groups, in order (row i = ``samples[i]``).
        pad_token_id: Id written on padding (masked everywhere, so any id is exact).
        temperature: Sampling temperature (``meta_info["temperature"]``, as veRL's actor reads it).
        policy_version: The trainer's policy version (``meta_info``).

    Raises:
        ValueError: No samples.
    """
    import numpy as np
    import torch
    from verl import DataProto

    if not samples:
        raise ValueError("no samples to convert")
    n = len(samples)
    width_p = max(len(s.prompt_ids) for s in samples)
    width_r = max(1, max(len(s.response_ids) for s in samples))
    prompts = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((n, width_p), dtype=torch.long)
    responses = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    response_attn = torch.zeros((n, width_r), dtype=torch.long)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    behaviour = torch.zeros((n, width_r), dtype=torch.float32)
    versions = torch.zeros((n, width_r), dtype=torch.long)
    scores = torch.zeros((n, width_r), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        prompts[i, width_p - p :] = torch.tensor(s.prompt_ids, dtype=torch.long)
        prompt_attn[i, width_p - p :] = 1
        if r:
            responses[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
            response_attn[i, :r] = 1
            response_mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.long)
            behaviour[i, :r] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            versions[i, :r] = torch.tensor(s.policy_versions, dtype=torch.long)
        sampled = [j for j, m in enumerate(s.loss_mask) if m]
        if sampled:
            scores[i, sampled[-1]] = s.reward
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_log_probs": behaviour,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "policy_versions": versions,
    }
    non_tensors = {
        "uid": np.array([s.group_id for s in samples], dtype=object),
        **{col: np.array([getattr(s, col) for s in samples], dtype=object) for col in ID_COLUMNS},
        "reward": np.array([s.reward for s in samples], dtype=np.float64),
    }
    meta = {"temperature": temperature, "policy_version": policy_version, "pad_token_id": pad_token_id}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def dataproto_to_samples(data: Any) -> list[TrainSample]:
    """The inverse of :func:`samples_to_dataproto`: real tokens are where ``attention_mask`` is 1.

    Behaviour logprobs are float32 in the store's proto and in veRL's batch (exact); the reward
    is a float64 in the proto, so it travels in the non-tensor ``reward`` column (the store's
    Parquet export's name) besides veRL's float32 ``token_level_scores``.
    """
    batch = data.batch
    width_p = batch["prompts"].shape[1]
    out: list[TrainSample] = []
    for i in range(len(data)):
        attn = batch["attention_mask"][i]
        p = int(attn[:width_p].sum())
        r = int(attn[width_p:].sum())
        out.append(
            TrainSample(
                sample_id=str(data.non_tensor_batch["sample_id"][i]),
                rollout_id=str(data.non_tensor_batch["rollout_id"][i]),
                group_id=str(data.non_tensor_batch["uid"][i]),
                task_id=str(data.non_tensor_batch["task_id"][i]),
                prompt_ids=tuple(int(t) for t in batch["prompts"][i, width_p - p :]),
                response_ids=tuple(int(t) for t in batch["responses"][i, :r]),
                loss_mask=tuple(int(m) for m in batch["response_mask"][i, :r]),
                behaviour_logprobs=tuple(float(x) for x in batch["rollout_log_probs"][i, :r]),
                policy_versions=tuple(int(v) for v in batch["policy_versions"][i, :r]),
                reward=float(data.non_tensor_batch["reward"][i]),
            )
        )
    return out


def rollout_advantages(
    core_algos: Any,
    rollout_ids: Sequence[str],
    group_ids: Sequence[str],
    rewards: Sequence[float],
    *,
    estimator: str,
    gamma: float,
    norm_adv_by_std: bool,
) -> list[float]:
    """The advantage of each row's rollout from veRL's group estimator, one row per rollout.

    A rollout split into several samples (compaction, sub-agent, template drift) must count once
    in its group's mean and std (ARCHITECTURE.md, invariants), so veRL's estimator is called the
    way ``ray_trainer.compute_advantage`` calls it, but on one row per rollout:
    ``token_level_rewards`` (M, 1) holding the rollout's reward (float32, as veRL's own),
    ``response_mask`` (M, 1) of ones, ``index`` = group id (M rollouts, first-seen order).
    ``compute_grpo_outcome_advantage`` (GRPO, Shao et al. 2024, arXiv:2402.03300) or
    ``compute_rloo_outcome_advantage`` (RLOO, Ahmadian et al. 2024, arXiv:2402.14740) then
    gives one scalar per rollout.

    Args:
        core_algos: ``verl.trainer.ppo.core_algos``.
        rollout_ids: Rollout of each row (N samples).
        group_ids: Group of each row (N).
        rewards: Rollout reward of each row (N).
        estimator: veRL's name, ``grpo`` or ``rloo``.
        gamma: ``AlgoConfig.gamma`` (unused by these estimators; carried as veRL's config).
        norm_adv_by_std: GRPO divides by the group's reward std (False: Dr. GRPO).

    Returns:
        The advantage of each row's rollout (N floats, row order; reward units, or reward-std
        units with GRPO's normalisation).

    Raises:
        ValueError: ``estimator`` is not a group estimator, or two rows of one rollout name
            another group or reward.
    """
    import numpy as np
    import torch

    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"{estimator} is not a group estimator {GROUP_ESTIMATORS}")
    first: dict[str, tuple[str, float]] = {}
    for rid, gid, reward in zip(rollout_ids, group_ids, rewards, strict=True):
        seen = first.setdefault(rid, (gid, reward))
        if seen != (gid, reward):
            raise ValueError(f"rollout {rid}: samples disagree on (group, reward): {seen} and {(gid, reward)}")
    kwargs = {
        "token_level_rewards": torch.tensor([[r] for _, r in first.values()], dtype=torch.float32),
        "response_mask": torch.ones((len(first), 1), dtype=torch.float32),
        "index": np.array([g for g, _ in first.values()], dtype=object),
    }
    if estimator == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(**kwargs, norm_adv_by_std_in_grpo=norm_adv_by_std)
    else:
        trainer_config = importlib.import_module("verl.trainer.config")
        algo = trainer_config.AlgoConfig(adv_estimator=estimator, gamma=gamma, norm_adv_by_std_in_grpo=norm_adv_by_std)
        adv, _ = core_algos.get_adv_estimator_fn(estimator)(**kwargs, config=algo)
    of_rollout = {rid: float(a) for rid, a in zip(first, adv[:, 0].tolist(), strict=True)}
    return [of_rollout[rid] for rid in rollout_ids]


def compute_advantages(core_algos: Any, data: Any, *, estimator: str, gamma: float, norm_adv_by_std: bool) -> None:
    """Adds ``advantages`` and ``returns`` (N, R) to ``data`` as ``ray_trainer.compute_advantage``
    does for the outcome estimators (grpo, rloo, reinforce_plus_plus).

    grpo and rloo: one scalar per rollout from :func:`rollout_advantages` (grouped by ``uid``,
    each ``rollout_id`` once), on every ``response_mask`` token of each of the rollout's rows, 0
    elsewhere; returns = advantages, as veRL's outcome estimators return them.
    reinforce_plus_plus: veRL's estimator on the rows' ``token_level_rewards`` as they are (its
    discounted returns are whitened over all tokens of the batch, no group statistic).

    (``ray_trainer`` itself imports veRL's data loaders, absent on CPU; its outcome-estimator
    branch is these calls.)
    """
    import torch

    batch = data.batch
    mask = batch["response_mask"].float()
    if estimator in GROUP_ESTIMATORS:
        per_row = rollout_advantages(
            core_algos,
            data.non_tensor_batch["rollout_id"].tolist(),
            data.non_tensor_batch["uid"].tolist(),
            data.non_tensor_batch["reward"].tolist(),
            estimator=estimator,
            gamma=gamma,
            norm_adv_by_std=norm_adv_by_std,
        )
        adv = torch.tensor(per_row, dtype=torch.float32).unsqueeze(-1) * mask
        ret = adv
    else:
        trainer_config = importlib.import_module("verl.trainer.config")
        algo = trainer_config.AlgoConfig(adv_estimator=estimator, gamma=gamma, norm_adv_by_std_in_grpo=norm_adv_by_std)
        adv, ret = core_algos.get_adv_estimator_fn(estimator)(
            token_level_rewards=batch["token_level_rewards"],
            response_mask=mask,
            index=data.non_tensor_batch["uid"],
            config=algo,
        )
    batch["advantages"] = adv
    batch["returns"] = ret
