"""Training samples and completed groups as the trainer sees them, and what it does with them
before any tensor exists: staleness filtering, SFT selection, zero-variance groups and per-step
data metrics.

Only rollouts with a verifier reward are trained on (ARCHITECTURE.md, invariants): a rollout
that failed, was cancelled, timed out before its verifier ran or was flagged for bypassing the
proxy has no reward; its samples never reach a backend (they are not reward-0 samples) and it is
counted among a group's :attr:`CompletedGroup.excluded` rollouts with its reason.

Pure Python (no torch): the loop runs these on the event loop; backends turn a
:class:`TrainBatch` into tensors.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from openforge_core.passk import pass_at_k, pass_hat_k

ExclusionReason = Literal["bypass", "failed", "cancelled", "timed_out", "no_reward"]

#: Every reason a rollout is left out of training (``rollouts/excluded/<reason>`` metrics).
EXCLUSION_REASONS: Final[tuple[ExclusionReason, ...]] = ("bypass", "failed", "cancelled", "timed_out", "no_reward")


@dataclass(frozen=True)
class TrainSample:
    """One training sequence (``openforge.trajectory.v1.Sample`` plus its group).

    Response arrays are parallel (length R).

    Attributes:
        sample_id: ``"<rollout_id>/<index>"``.
        rollout_id: Rollout it came from.
        group_id: The rollout's group (the GRPO/RLOO index).
        task_id: The rollout's task.
        prompt_ids: Prompt token ids (P).
        response_ids: Every token after the prompt (R): sampled and harness/tool tokens.
        loss_mask: 1 = sampled by the policy (trained on), 0 = harness/tool/environment.
        behaviour_logprobs: Logprob the engine reported for each sampled token (nats; 0 where
            the mask is 0).
        policy_versions: Policy version that sampled each token (0 where the mask is 0).
        reward: The rollout's verifier reward (every sample of a rollout carries the same one;
            a sample exists here only when its rollout has a reward).
        calls: Model calls merged into this sample (``len(Sample.call_ids)``).
        role: The role of its calls: ``main``, ``sub_agent``, ``compaction`` or ``side``.
    """

    sample_id: str
    rollout_id: str
    group_id: str
    task_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    reward: float
    calls: int = 1
    role: str = "main"

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if not (len(self.loss_mask) == len(self.behaviour_logprobs) == len(self.policy_versions) == n):
            raise ValueError(f"sample {self.sample_id}: response arrays are not parallel")
        if not self.prompt_ids:
            raise ValueError(f"sample {self.sample_id}: empty prompt")

    @property
    def sampled_tokens(self) -> int:
        """Tokens with loss mask 1."""
        return sum(self.loss_mask)

    def oldest_version(self) -> int | None:
        """Oldest policy version among sampled tokens (None when nothing was sampled)."""
        versions = [v for v, m in zip(self.policy_versions, self.loss_mask, strict=True) if m]
        return min(versions) if versions else None


@dataclass(frozen=True)
class ExcludedRollout:
    """A rollout of a group that is not trained on because it has no verifier reward.

    Attributes:
        rollout_id: The rollout.
        reason: ``bypass`` (flagged for reaching the model around the proxy, or making no proxy
            call), ``failed`` (harness, sandbox or verifier failure), ``cancelled``,
            ``timed_out`` (the verifier did not score the partial trace), ``no_reward`` (any
            other rollout without a reward).
        num_samples: Samples the store assembled for it (left out of the group's samples).
    """

    rollout_id: str
    reason: ExclusionReason
    num_samples: int = 0


@dataclass(frozen=True)
class CompletedGroup:
    """A group whose rollouts all ended (``WatchCompletedGroupsResponse``).

    Attributes:
        group_id: The group.
        task_id: Its task.
        rewards: Reward of each rollout that has one, by rollout id: the trainable rollouts.
        samples: Every sample of every trainable rollout of the group (a rollout in ``rewards``).
        cursor: The store's resume cursor of this group.
        excluded: The group's rollouts without a reward, each with its reason; their samples are
            not in ``samples``.
    """

    group_id: str
    task_id: str
    rewards: dict[str, float]
    samples: tuple[TrainSample, ...]
    cursor: str
    excluded: tuple[ExcludedRollout, ...] = ()

    @property
    def has_samples(self) -> bool:
        """Whether any rollout of the group, trainable or excluded, left a sample."""
        return bool(self.samples) or any(x.num_samples for x in self.excluded)


@dataclass(frozen=True)
class TrainBatch:
    """What one optimizer step trains on.

    Attributes:
        samples: The samples, grouped by ``group_id`` (order is kept).
        policy_version: The trainer's policy version when the batch was built.
    """

    samples: tuple[TrainSample, ...]
    policy_version: int

    @property
    def num_tokens(self) -> int:
        """Prompt + response tokens over all samples."""
        return sum(len(s.prompt_ids) + len(s.response_ids) for s in self.samples)

    @property
    def num_sampled_tokens(self) -> int:
        """Loss-mask tokens over all samples."""
        return sum(s.sampled_tokens for s in self.samples)


@dataclass
class StalenessReport:
    """What the staleness filter kept and dropped.

    Attributes:
        kept: Samples within the bound.
        dropped: Samples older than the bound.
        staleness: Staleness (versions behind) of each kept sample.
    """

    kept: list[TrainSample] = field(default_factory=list)
    dropped: list[TrainSample] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)


def filter_stale(samples: Iterable[TrainSample], current_version: int, max_staleness: int) -> StalenessReport:
    """Drops samples whose oldest sampled token is more than ``max_staleness`` versions old.

    A sample's staleness is ``current_version - min(policy_versions over loss-mask tokens)``;
    a sample with no sampled token has staleness 0 (nothing in it is trained on by the policy
    loss anyway).

    Args:
        samples: Candidate samples.
        current_version: The trainer's policy version now.
        max_staleness: Largest staleness kept (0 = strictly on-policy).

    Returns:
        Kept and dropped samples.
    """
    report = StalenessReport()
    for s in samples:
        oldest = s.oldest_version()
        staleness = 0 if oldest is None else max(0, current_version - oldest)
        if staleness > max_staleness:
            report.dropped.append(s)
        else:
            report.kept.append(s)
            report.staleness.append(staleness)
    return report


def is_zero_variance(samples: Iterable[TrainSample]) -> bool:
    """Whether the rollouts of one group's ``samples`` all have the same reward.

    Such a group gets a GRPO/RLOO advantage of 0 on every token (no learning signal). The rule is
    veRL DAPO's dynamic-sampling filter (``recipe/dapo/dapo_ray_trainer.py``: a group is kept when
    ``np.std(rewards) > 0 or len(rewards) == 1``; Yu et al. 2025, arXiv:2503.14476, §3.2): each
    rollout counts once however many samples it has, and a group of one rollout is never
    zero-variance (veRL's GRPO gives it advantage = reward).

    Args:
        samples: Samples of one group (those that would be trained on).
    """
    rewards = {s.rollout_id: s.reward for s in samples}
    return len(rewards) > 1 and len(set(rewards.values())) == 1


def shuffle_rewards(samples: Sequence[TrainSample], rng: random.Random) -> list[TrainSample]:
    """The samples with their rollouts' rewards permuted among the rollouts (one draw of
    ``rng``; every sample of a rollout gets the same new reward): the ``shuffle_rewards``
    negative control. Sample order is kept."""
    rollouts = list(dict.fromkeys(s.rollout_id for s in samples))
    reward_of = {s.rollout_id: s.reward for s in samples}
    permuted = [reward_of[r] for r in rollouts]
    rng.shuffle(permuted)
    new = dict(zip(rollouts, permuted, strict=True))
    return [dataclasses.replace(s, reward=new[s.rollout_id]) for s in samples]


def select_for_sft(samples: Iterable[TrainSample], min_reward: float) -> list[TrainSample]:
    """Rejection sampling: the samples of rollouts whose reward is >= ``min_reward`` and that
    hold at least one sampled token."""
    return [s for s in samples if s.reward >= min_reward and s.sampled_tokens > 0]


def group_metrics(
    groups: Sequence[CompletedGroup], *, pass_threshold: float, pass_k: Sequence[int], prefix: str = ""
) -> dict[str, float]:
    """Reward, pass@k / pass^k (per task and mean over tasks) and response length of groups.

    Rewards are per rollout (every rollout of a group that has a reward, whether or not its
    samples were trained on); excluded rollouts (no reward) are not counted. Tasks with fewer
    rollouts than k get no pass@k.

    Args:
        groups: The groups.
        pass_threshold: A rollout passes when its reward is >= this.
        pass_k: The k values.
        prefix: Prepended to every name (``"eval/"``).

    Returns:
        ``reward/mean``, ``reward/std``, ``reward/min``, ``reward/max``,
        ``pass@k/<task>``, ``pass^k/<task>``, ``pass@k/mean``, ``pass^k/mean``,
        ``response/length_mean`` (tokens after the prompt), ``response/sampled_mean``
        (loss-mask tokens), ``samples/per_rollout`` (samples of the trainable rollouts: more than
        one where the conversation broke) and ``calls/per_sample`` (model calls merged into a
        sample: the merge ratio).
    """
    out: dict[str, float] = {}
    rewards = [r for g in groups for r in g.rewards.values()]
    if rewards:
        out["reward/mean"] = statistics.fmean(rewards)
        out["reward/std"] = statistics.pstdev(rewards)
        out["reward/min"] = min(rewards)
        out["reward/max"] = max(rewards)
    by_task: dict[str, list[float]] = {}
    for g in groups:
        by_task.setdefault(g.task_id, []).extend(g.rewards.values())
    for k in pass_k:
        at, hat = [], []
        for task, rs in sorted(by_task.items()):
            if len(rs) < k:
                continue
            c = sum(1 for r in rs if r >= pass_threshold)
            out[f"pass@{k}/{task}"] = pass_at_k(len(rs), c, k)
            out[f"pass^{k}/{task}"] = pass_hat_k(len(rs), c, k)
            at.append(out[f"pass@{k}/{task}"])
            hat.append(out[f"pass^{k}/{task}"])
        if at:
            out[f"pass@{k}/mean"] = statistics.fmean(at)
            out[f"pass^{k}/mean"] = statistics.fmean(hat)
    samples = [s for g in groups for s in g.samples]
    if samples:
        out["response/length_mean"] = statistics.fmean(len(s.response_ids) for s in samples)
        out["response/sampled_mean"] = statistics.fmean(s.sampled_tokens for s in samples)
        out["samples/per_rollout"] = len(samples) / len({s.rollout_id for s in samples})
        out["calls/per_sample"] = statistics.fmean(s.calls for s in samples)
    return {prefix + k: v for k, v in out.items()}


#: The call roles a sample can have (``Sample.role``), in metric order.
ROLES: Final[tuple[str, ...]] = ("main", "sub_agent", "compaction", "side")


def role_metrics(samples: Sequence[TrainSample]) -> dict[str, float]:
    """Per call role: samples per rollout (over the rollouts with a trained sample) and model calls
    per sample, the merge ratio (``samples/per_rollout/<role>``, ``samples/merge_ratio/<role>``);
    a role with no sample gives 0 for both."""
    rollouts = len({s.rollout_id for s in samples})
    out: dict[str, float] = {}
    for role in ROLES:
        mine = [s for s in samples if s.role == role]
        out[f"samples/per_rollout/{role}"] = len(mine) / rollouts if rollouts else 0.0
        out[f"samples/merge_ratio/{role}"] = sum(s.calls for s in mine) / len(mine) if mine else 0.0
    return out
