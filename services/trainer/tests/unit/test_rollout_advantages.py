"""GRPO/RLOO statistics count each rollout once, however many samples it was split into, and every
sample of a rollout carries its rollout's advantage (ARCHITECTURE.md, invariants).

Checked against a direct call of veRL's estimator on one row per rollout, in both backends'
code paths (``torch_backend.compute_advantages`` and ``verl_batch.compute_advantages``).
"""

from __future__ import annotations

from typing import Any

import pytest

from openforge_core.run_config import RunConfig
from openforge_trainer.domain.samples import TrainSample

pytestmark = pytest.mark.usefixtures("heavy_stack")

#: Rewards of the rollouts of each group; rollout "a-0" is split into two samples.
REWARDS = {"a": [1.0, 0.0, 0.0, 0.5], "b": [0.25, 1.0, 0.75]}


def sample(gid: str, i: int, k: int, reward: float, mask: tuple[int, ...]) -> TrainSample:
    """Sample ``k`` of rollout ``<gid>-<i>``: tokens under a tool span (mask 0) included."""
    return TrainSample(
        sample_id=f"{gid}-{i}/{k}",
        rollout_id=f"{gid}-{i}",
        group_id=gid,
        task_id=f"task-{gid}",
        prompt_ids=(1, 2, 3 + k),
        response_ids=tuple(10 + j for j in range(len(mask))),
        loss_mask=mask,
        behaviour_logprobs=tuple(-0.5 * m for m in mask),
        policy_versions=tuple(m for m in mask),
        reward=reward,
    )


def batches() -> tuple[list[TrainSample], list[TrainSample]]:
    """The same rollouts twice: with rollout a-0 as one sample, and split into two samples (a
    compaction: its second sample starts a new sequence)."""
    whole, split = [], []
    for gid, rewards in REWARDS.items():
        for i, r in enumerate(rewards):
            whole.append(sample(gid, i, 0, r, (1, 1, 0, 1)))
            if (gid, i) == ("a", 0):
                split += [sample(gid, i, 0, r, (1, 0, 1)), sample(gid, i, 1, r, (1, 1, 1, 0, 1, 1))]
            else:
                split.append(whole[-1])
    return whole, split


def direct_verl(estimator: str, norm_adv_by_std: bool) -> dict[str, float]:
    """veRL's estimator called directly with one row per rollout: advantage by rollout id."""
    import importlib

    import numpy as np
    import torch

    core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    trainer_config: Any = importlib.import_module("verl.trainer.config")
    ids = [(f"{g}-{i}", g, r) for g, rs in REWARDS.items() for i, r in enumerate(rs)]
    rewards = torch.tensor([[r] for _, _, r in ids], dtype=torch.float32)
    mask = torch.ones_like(rewards)
    index = np.array([g for _, g, _ in ids], dtype=object)
    if estimator == "grpo":
        adv, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm_adv_by_std
        )
    else:
        algo = trainer_config.AlgoConfig(adv_estimator=estimator)
        adv, _ = core_algos.compute_rloo_outcome_advantage(
            token_level_rewards=rewards, response_mask=mask, index=index, config=algo
        )
    return {rid: float(a) for (rid, _, _), a in zip(ids, adv[:, 0].tolist(), strict=True)}


def per_sample(adv: Any, samples: list[TrainSample]) -> list[float]:
    """The one advantage each sample holds on its loss-mask tokens (asserting it is one value,
    and 0 on every other position)."""
    out = []
    for i, s in enumerate(samples):
        row = [float(x) for x in adv[i]]
        sampled = {round(v, 6) for v, m in zip(row, s.loss_mask, strict=False) if m}
        assert len(sampled) == 1, (s.sample_id, row)
        assert all(v == 0.0 for v, m in zip(row, list(s.loss_mask) + [0] * len(row), strict=False) if not m)
        out.append(next(v for v, m in zip(row, s.loss_mask, strict=False) if m))
    return out


CASES = [("grpo", True), ("grpo", False), ("rloo", True)]


@pytest.mark.parametrize(("algorithm", "norm"), CASES)
def test_a_split_rollout_counts_once_in_its_group_in_the_torch_backend(algorithm: str, norm: bool) -> None:
    from openforge_trainer.backends.torch_backend import compute_advantages, load_verl

    cfg = RunConfig.model_validate(
        {"model": "m", "tasks": ["t"], "group_size": 4, "algorithm": algorithm, "norm_adv_by_std": norm}
    )
    whole, split = batches()
    want = direct_verl(algorithm, norm)
    got_whole = per_sample(compute_advantages(load_verl(), cfg, whole), whole)
    got_split = per_sample(compute_advantages(load_verl(), cfg, split), split)
    assert got_whole == pytest.approx([want[s.rollout_id] for s in whole], abs=1e-6)
    assert got_split == pytest.approx([want[s.rollout_id] for s in split], abs=1e-6)
    # Both samples of a-0 carry a-0's advantage, and the split changed no other rollout's.
    assert got_split[0] == got_split[1] == pytest.approx(got_whole[0])
    assert got_split[2:] == pytest.approx(got_whole[1:])


@pytest.mark.parametrize(("algorithm", "norm"), CASES)
def test_a_split_rollout_counts_once_in_its_group_in_the_verl_batch(algorithm: str, norm: bool) -> None:
    import importlib

    from openforge_trainer.backends.verl_batch import compute_advantages, samples_to_dataproto

    core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    _, split = batches()
    data = samples_to_dataproto(split)
    compute_advantages(core_algos, data, estimator=algorithm, gamma=1.0, norm_adv_by_std=norm)
    want = direct_verl(algorithm, norm)
    got = per_sample(data.batch["advantages"], split)
    assert got == pytest.approx([want[s.rollout_id] for s in split], abs=1e-6)
    assert data.batch["returns"].tolist() == data.batch["advantages"].tolist()


def test_one_row_per_sample_would_weigh_the_split_rollout_twice() -> None:
    """The statistic the fix avoids: veRL's GRPO on one row per sample moves group a's mean and
    std (every rollout of a gets another advantage), so the tests above can tell the two apart."""
    import importlib

    import numpy as np
    import torch

    core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    _, split = batches()
    rewards = torch.tensor([[s.reward] for s in split], dtype=torch.float32)
    index = np.array([s.group_id for s in split], dtype=object)
    per_row, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=torch.ones_like(rewards), index=index
    )
    want = direct_verl("grpo", True)
    assert abs(float(per_row[2, 0]) - want["a-1"]) > 0.05


def test_samples_of_one_rollout_must_agree_on_reward_and_group() -> None:
    import importlib

    from openforge_trainer.backends.verl_batch import rollout_advantages

    core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    with pytest.raises(ValueError, match="disagree"):
        rollout_advantages(
            core_algos, ["r", "r"], ["g", "g"], [1.0, 0.0], estimator="grpo", gamma=1.0, norm_adv_by_std=True
        )
    with pytest.raises(ValueError, match="group estimator"):
        rollout_advantages(
            core_algos, ["r"], ["g"], [1.0], estimator="reinforce_plus_plus", gamma=1.0, norm_adv_by_std=True
        )
