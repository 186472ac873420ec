"""Unit tests of ``openforge train`` / ``openforge eval``: config loading,
per-task summaries, the phase record and the checkpoint export (no services needed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from openforge.common.v1 import common_pb2
from openforge_cli.eval import report_table, split_tasks, summarize
from openforge_cli.main import main
from openforge_cli.train import Phases, comparison_table, export_model
from openforge_cli.train_config import TrainConfig, load_train_config
from openforge_core.seeds import EVAL_SEED_KEY, request_seed

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "examples" / "demo" / "demo.yaml"


def _rollout(
    task: str, index: int, status: common_pb2.RolloutStatus.ValueType, reward: float | None
) -> common_pb2.Rollout:
    r = common_pb2.Rollout(rollout_id=f"{task}-{index}", task_id=task, group_index=index, status=status)
    if reward is not None:
        r.reward = reward
    return r


def test_summarize_groups_rollouts_per_task_in_order_and_counts_missing_rewards_as_zero() -> None:
    ok, to = common_pb2.ROLLOUT_STATUS_SUCCEEDED, common_pb2.ROLLOUT_STATUS_TIMED_OUT
    rollouts = [
        _rollout("b", 1, ok, 1.0),
        _rollout("a", 0, to, None),
        _rollout("b", 0, ok, 0.0),
        _rollout("a", 1, ok, 1),
    ]
    report = summarize("ev", "test", ["a", "b"], rollouts, ks=(1, 2), pass_threshold=1.0)
    assert [t.task_id for t in report.tasks] == ["a", "b"]
    a, b = report.tasks
    assert a.rewards == (0.0, 1.0) and a.statuses == ("TIMED_OUT", "SUCCEEDED") and a.passed == 1
    assert b.rewards == (0.0, 1.0) and b.passed == 1
    summary = report.summary()
    assert summary == {"reward/mean": 0.5, "pass@1": 0.5, "pass^1": 0.5, "pass@2": 1.0, "pass^2": 0.0}
    table = report_table(report)
    assert table.row_count == 3  # two tasks and the means
    assert comparison_table(report, report, "test").row_count == 2
    assert report.to_json()["tasks"] == {
        "a": {"rewards": [0.0, 1.0], "statuses": ["TIMED_OUT", "SUCCEEDED"]},
        "b": {"rewards": [0.0, 1.0], "statuses": ["SUCCEEDED", "SUCCEEDED"]},
    }


def test_demo_config_loads_and_builds_valid_trainer_configs() -> None:
    cfg = load_train_config(DEMO)
    assert cfg.harness == "mini-swe-agent" and cfg.warm_start is not None and cfg.eval is not None
    sft = cfg.sft_run_config(Path("/m"))
    rl = cfg.rl_run_config(Path("/m"))
    assert sft["mode"] == "sft" and rl["mode"] == "rl"
    train = cfg.train_tasks()
    assert rl["tasks"] == train and rl["task_split"] == "train"
    demonstrated = sft["tasks"]
    # a subset of the training tasks, each demonstrated once, as many of each kind
    assert set(demonstrated) < set(train) and sft["groups_per_step"] == len(set(demonstrated)) == len(demonstrated)
    per_kind = Counter(t.split("-")[0] for t in demonstrated)
    assert set(per_kind) == {t.split("-")[0] for t in train} and len(set(per_kind.values())) == 1
    assert sft["sft"] == {"min_reward": 0.0} and cfg.warm_start.error_rate > 0  # an imperfect demonstrator, imitated
    root = cfg.tasks_root_path
    assert root == (ROOT / "examples" / "demo" / "tasks").resolve()
    for task in train:
        assert (root / cfg.split / task / "solution" / "solve.sh").is_file()
    assert cfg.eval_tasks() and not set(train) & set(cfg.eval_tasks())  # the evaluation split is held out
    assert cfg.harness_config is not None and cfg.harness_config.is_file()
    spec = cfg.rollout_spec()
    assert (spec.max_tokens, spec.max_turns, spec.harness) == (rl["max_tokens"], rl["max_turns"], "mini-swe-agent")
    # evaluations are seeded as the trainer seeds its own (the run seed, the evaluation key)
    assert spec.seed == request_seed(rl["seed"], EVAL_SEED_KEY)


@pytest.mark.parametrize(("value", "seeded"), [(True, True), (False, False), ("false", False), ("true", True)])
def test_evaluations_are_unseeded_when_the_run_turns_seeded_sampling_off(value: object, seeded: bool) -> None:
    cfg = load_train_config(DEMO)
    cfg = cfg.model_copy(update={"run": {**cfg.run, "seed": 4, "seeded_sampling": value}})
    assert cfg.rollout_spec().seed == (request_seed(4, EVAL_SEED_KEY) if seeded else None)


def test_bad_config_names_every_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("run_id: 'has space'\nmodel: {}\nstack: {max_concurrent: 0}\nsurprise: 1\n")
    with pytest.raises(click.ClickException) as err:
        load_train_config(path)
    message = err.value.message
    for field in ("run_id", "model.path", "stack.max_concurrent", "surprise"):
        assert field in message
    path.write_text("- a list\n")
    with pytest.raises(click.ClickException, match="mapping"):
        load_train_config(path)


def test_split_tasks_lists_task_folders_and_refuses_an_empty_split(tmp_path: Path) -> None:
    assert "hello-world" in split_tasks(ROOT / "examples" / "tasks", "train")
    with pytest.raises(click.ClickException, match="no tasks"):
        split_tasks(tmp_path, "nothing")


def test_phases_persist_and_export_keeps_only_model_files(tmp_path: Path) -> None:
    phases = Phases(tmp_path / "state")
    phases.set("warm_start", {"model": "m"})
    assert Phases(tmp_path / "state").get("warm_start") == {"model": "m"}
    ckpt = tmp_path / "step_00000002"
    ckpt.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "trainer_state.json"):
        (ckpt / name).write_text(name)
    out = export_model(ckpt, tmp_path / "models" / "warm")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_cli_lists_train_and_eval_with_their_options() -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["train", "--help"]).output
    assert "CONFIG" in out and "--fresh" in out and "--state-dir" in out
    out = runner.invoke(main, ["eval", "--help"]).output
    assert "--checkpoint" in out and "--split" in out and "-k" in out
    res = runner.invoke(main, ["eval", str(DEMO), "--checkpoint", str(ROOT), "-k", "0"])
    assert res.exit_code == 2 and "must be >= 1" in res.output


def test_train_config_defaults_need_only_a_model() -> None:
    cfg = TrainConfig.model_validate({"model": {"path": "m"}})
    assert cfg.stack.engine == "vllm" and cfg.stack.fallback_engine == "transformers"
    assert cfg.warm_start is None and cfg.eval is not None and cfg.eval.split == "test"


def test_attaching_to_running_services_refuses_a_warm_start(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        main,
        ["train", str(DEMO), "--state-dir", str(tmp_path / "s"), "--trainer", "127.0.0.1:1", "--orchestrator", "x:2"],
    )
    assert res.exit_code == 1 and "needs its own services" in res.output
    res = runner.invoke(main, ["train", str(DEMO), "--state-dir", str(tmp_path / "s"), "--trainer", "127.0.0.1:1"])
    assert res.exit_code == 2 and "go together" in res.output


def test_stop_signal_is_awaitable_in_each_event_loop_in_turn() -> None:
    import asyncio

    from openforge_cli.stop_signals import StopSignal

    stop = StopSignal()

    async def first() -> bool:
        stop.bind()
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        asyncio.get_running_loop().call_soon(stop.set)
        await asyncio.wait_for(waiter, timeout=5)
        return stop.is_set()

    assert asyncio.run(first())

    async def second() -> None:  # a new loop: the same signal, already requested
        stop.bind()
        await asyncio.wait_for(stop.wait(), timeout=5)

    asyncio.run(second())
