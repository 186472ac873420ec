"""Pure trainer logic: pass@k / pass^k, staleness, SFT selection, task picking, config, state."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from openforge_core.errors import InvalidArgument
from openforge_trainer.domain.config import parse_run_config, read_config_file
from openforge_trainer.domain.loop import pick_tasks
from openforge_trainer.domain.samples import (
    CompletedGroup,
    TrainSample,
    filter_stale,
    group_metrics,
    select_for_sft,
)
from openforge_trainer.domain.state import TrainerState


def sample(sid: str, versions: tuple[int, ...], mask: tuple[int, ...], reward: float = 0.0) -> TrainSample:
    return TrainSample(
        sample_id=sid,
        rollout_id=sid.split("/")[0],
        group_id="g",
        task_id="t",
        prompt_ids=(1, 2),
        response_ids=tuple(range(len(mask))),
        loss_mask=mask,
        behaviour_logprobs=tuple(-1.0 * m for m in mask),
        policy_versions=versions,
        reward=reward,
    )


def test_filter_stale_uses_the_oldest_sampled_token() -> None:
    fresh = sample("a/0", (0, 5, 0), (0, 1, 0))
    mixed = sample("b/0", (3, 5, 9), (1, 1, 0))  # the masked token's version does not count
    none_sampled = sample("c/0", (0, 0), (0, 0))
    report = filter_stale([fresh, mixed, none_sampled], current_version=6, max_staleness=2)
    assert [s.sample_id for s in report.kept] == ["a/0", "c/0"]
    assert [s.sample_id for s in report.dropped] == ["b/0"]
    assert report.staleness == [1, 0]


def test_select_for_sft_keeps_passing_rollouts_with_sampled_tokens() -> None:
    good = sample("a/0", (1, 1), (1, 1), reward=1.0)
    bad = sample("b/0", (1, 1), (1, 1), reward=0.5)
    empty = sample("c/0", (0,), (0,), reward=1.0)
    assert select_for_sft([good, bad, empty], min_reward=1.0) == [good]


def test_group_metrics_per_task_and_mean() -> None:
    g1 = CompletedGroup("g1", "t1", {"r1": 1.0, "r2": 0.0, "r3": 0.0, "r4": 1.0}, (), "c1")
    g2 = CompletedGroup("g2", "t2", {"r5": 1.0, "r6": 1.0}, (), "c2")
    m = group_metrics([g1, g2], pass_threshold=1.0, pass_k=[1, 2])
    assert m["reward/mean"] == pytest.approx(4 / 6)
    assert m["pass@1/t1"] == pytest.approx(0.5) and m["pass@1/t2"] == 1.0
    assert m["pass^2/t1"] == pytest.approx(1 / 6) and m["pass^2/t2"] == 1.0
    assert m["pass@2/mean"] == pytest.approx((1 - 1 / 6 + 1.0) / 2)
    assert math.isclose(m["reward/std"], 0.4714045, rel_tol=1e-6)
    assert "samples/per_rollout" not in m  # no samples: no sample figures


def test_group_metrics_count_samples_per_rollout_and_calls_per_sample() -> None:
    # r1's conversation broke once (two samples: 3 calls, then 1); r2 is one sample of 2 calls
    samples = tuple(
        replace(sample(sid, (1,), (1,), reward=1.0), calls=calls)
        for sid, calls in (("r1/0", 3), ("r1/1", 1), ("r2/0", 2))
    )
    m = group_metrics(
        [CompletedGroup("g1", "t1", {"r1": 1.0, "r2": 1.0}, samples, "c1")], pass_threshold=1.0, pass_k=[1]
    )
    assert m["samples/per_rollout"] == 1.5
    assert m["calls/per_sample"] == 2.0


def test_pick_tasks_is_deterministic_and_covers_tasks() -> None:
    tasks = ["a", "b", "c"]
    assert pick_tasks(tasks, 3, 0, "step/1") == pick_tasks(tasks, 3, 0, "step/1")
    assert sorted(pick_tasks(tasks, 3, 0, "step/2")) == tasks
    assert len(pick_tasks(tasks, 7, 0, "x")) == 7


def test_config_errors_name_the_fields() -> None:
    with pytest.raises(InvalidArgument) as exc:
        parse_run_config({"model": "m", "tasks": ["t"], "algorithm": "ppo", "group_size": 0, "bogus": 1})
    fields = {v.field for v in exc.value.violations}
    assert {"algorithm", "group_size", "bogus"} <= fields


def test_config_needs_tasks_unless_sft_from_a_recorded_run() -> None:
    with pytest.raises(InvalidArgument, match="tasks"):
        parse_run_config({"model": "m"})
    cfg = parse_run_config({"model": "m", "mode": "sft", "sft": {"source_run_id": "old"}})
    assert cfg.sft.source_run_id == "old" and cfg.updates_per_step == 1


def test_config_files_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("model: m\ntasks: [x]\nalgorithm: rloo\nloss: gspo\n")
    (tmp_path / "b.json").write_text('{"model": "m", "tasks": ["x"], "steps": 3}')
    assert parse_run_config(read_config_file(tmp_path / "a.yaml")).loss == "gspo"
    assert parse_run_config(read_config_file(tmp_path / "b.json")).steps == 3
    (tmp_path / "c.yaml").write_text("- a list\n")
    with pytest.raises(InvalidArgument, match="mapping"):
        read_config_file(tmp_path / "c.yaml")
    with pytest.raises(InvalidArgument, match="cannot read"):
        read_config_file(tmp_path / "missing.json")


def test_trainer_state_round_trips() -> None:
    st = TrainerState(step=3, policy_version=3, cursor="g:9", pending_groups=["x"], samples_dropped_total=2)
    assert TrainerState.from_json(st.to_json()) == st
