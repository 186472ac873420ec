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
``uid`` (non-tensor)        group id: the GRPO/RLOO index
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


def compute_advantages(core_algos: Any, data: Any, *, estimator: str, gamma: float, norm_adv_by_std: bool) -> None:
    """Adds ``advantages`` and ``returns`` to ``data`` the way ``ray_trainer.compute_advantage``
    does for the outcome estimators (grpo, rloo, reinforce_plus_plus), grouped by ``uid``.

    (``ray_trainer`` itself imports veRL's data loaders, absent on CPU; its outcome-estimator
    branch is these calls.)
    """
    trainer_config = importlib.import_module("verl.trainer.config")
    batch = data.batch
    kwargs = {
        "token_level_rewards": batch["token_level_rewards"],
        "response_mask": batch["response_mask"].float(),
        "index": data.non_tensor_batch["uid"],
    }
    if estimator == "grpo":
        adv, ret = core_algos.compute_grpo_outcome_advantage(**kwargs, norm_adv_by_std_in_grpo=norm_adv_by_std)
    else:
        algo = trainer_config.AlgoConfig(adv_estimator=estimator, gamma=gamma, norm_adv_by_std_in_grpo=norm_adv_by_std)
        adv, ret = core_algos.get_adv_estimator_fn(estimator)(**kwargs, config=algo)
    batch["advantages"] = adv
    batch["returns"] = ret
