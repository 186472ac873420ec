"""The repository on SQLite and PostgreSQL: one suite, both backends."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from store_builders import conversation, failed_call, finished, make_call, make_rollout, recorded, submitted

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch
from openforge_core.errors import FailedPrecondition, InvalidArgument, NotFound
from openforge_trajectory_store.adapters import database, export
from openforge_trajectory_store.adapters.sql import SqlRepository
from openforge_trajectory_store.domain.query import RolloutFilter

DONE = common_pb2.ROLLOUT_STATUS_SUCCEEDED


def _group(repo: SqlRepository, n: int = 2, turns: int = 3) -> list[common_pb2.Rollout]:
    rollouts = [make_rollout(f"r{i}", index=i, t=i) for i in range(n)]
    repo.ingest([submitted(*rollouts)])
    for r in rollouts:
        repo.ingest([recorded(c) for c in conversation(r.rollout_id, turns)])
    return rollouts


def _finish(r: common_pb2.Rollout, reward: float, calls: int, attempts: int = 0) -> tuple[str, orch.RolloutFinished]:
    done = common_pb2.Rollout()
    done.CopyFrom(r)
    done.status = DONE
    done.reward = reward
    return finished(done, calls, attempts)


def test_migrations_are_versioned_and_idempotent(repo: SqlRepository) -> None:
    assert repo.schema_version() == 4
    repo.close()
    repo.open()
    assert repo.schema_version() == 4


def test_redelivery_never_duplicates(repo: SqlRepository) -> None:
    calls = conversation("r0", 4)
    events = [submitted(make_rollout("r0")), *[recorded(c) for c in calls]]
    first = repo.ingest(events)
    again = repo.ingest(events)
    assert (first.applied, first.duplicates) == (5, 0)
    assert (again.applied, again.duplicates) == (0, 5)
    assert repo.count_calls() == 4
    got = repo.calls("r0")
    assert [c.SerializeToString() for c in got] == [c.SerializeToString() for c in calls]


def test_group_completes_once_with_aligned_samples(repo: SqlRepository) -> None:
    r0, r1 = _group(repo)
    assert repo.ingest([_finish(r0, 1.0, 3)]).completed_groups == []
    with pytest.raises(FailedPrecondition):
        repo.samples("r1")
    done = repo.ingest([_finish(r1, 0.0, 3)]).completed_groups
    assert [(g.group_id, g.size, g.seq) for g in done] == [("g1", 2, 1)]
    assert repo.ingest([_finish(r1, 0.0, 3)]).completed_groups == []  # redelivered finish
    [s0] = repo.samples("r0")
    calls = repo.calls("r0")
    assert list(s0.prompt_token_ids) + list(s0.response_token_ids) == (
        list(calls[-1].prompt_token_ids) + list(calls[-1].completion_token_ids)
    )
    assert sum(s0.loss_mask) == sum(len(c.completion_token_ids) for c in calls)
    assert s0.reward == 1.0
    assert [g.group_id for g in repo.completed_groups("run", 0)] == ["g1"]
    assert repo.completed_groups("run", 1) == []
    assert [g.group_id for g in repo.unpublished_groups()] == ["g1"]
    repo.mark_published("g1")
    assert repo.unpublished_groups() == []


def test_waits_for_calls_still_in_flight(repo: SqlRepository) -> None:
    calls = conversation("r0", 3)
    r0 = make_rollout("r0")
    repo.ingest([submitted(r0), recorded(calls[0]), recorded(calls[1])])
    assert repo.ingest([_finish(r0, 1.0, 3)]).completed_groups == []  # the proxy served 3
    done = repo.ingest([recorded(calls[2])]).completed_groups
    assert [g.group_id for g in done] == ["g1"]
    assert list(repo.samples("r0")[0].call_ids) == ["c0", "c1", "c2"]


def test_a_failed_call_closes_the_rollouts_count_and_enters_no_sample(repo: SqlRepository) -> None:
    """The proxy counted 3 calls; the second failed at inference (its record: an error, no ids) and
    the harness went on with a changed request: the rollout assembles from the 2 answered calls."""
    calls = conversation("r0", 2)
    r0 = make_rollout("r0")
    repo.ingest([submitted(r0), recorded(calls[0]), recorded(failed_call("r0", "c-failed", t=500))])
    assert repo.ingest([_finish(r0, 1.0, 3)]).completed_groups == []  # the last call is still in flight
    done = repo.ingest([recorded(calls[1])]).completed_groups
    assert [g.group_id for g in done] == ["g1"]
    [sample] = repo.samples("r0")
    assert list(sample.call_ids) == ["c0", "c1"] and sample.break_cause == common_pb2.BREAK_CAUSE_NONE
    assert [c.error for c in repo.calls("r0")] == ["", "inference: UNAVAILABLE", ""]  # kept for inspection


def test_only_the_last_attempt_of_a_re_run_rollout_is_assembled(repo: SqlRepository) -> None:
    """The orchestrator re-ran the rollout (same id) after its first attempt's proxy session was
    lost: both attempts' calls are stored, the samples come from attempt 2 only, and the count
    of calls the rollout waits for is attempt 2's."""
    first = [
        make_call(
            "r0", f"a1-{c.call_id}", list(c.prompt_token_ids), list(c.completion_token_ids), t=i, rollout_attempt=1
        )
        for i, c in enumerate(conversation("r0", 2, seed=1))
    ]
    second = [
        make_call(
            "r0",
            f"a2-{c.call_id}",
            list(c.prompt_token_ids),
            list(c.completion_token_ids),
            t=100 + i,
            rollout_attempt=2,
        )
        for i, c in enumerate(conversation("r0", 3, seed=2))
    ]
    r0 = make_rollout("r0")
    repo.ingest([submitted(r0), *[recorded(c) for c in first], recorded(second[0]), recorded(second[1])])
    # 4 calls are stored, but attempt 2 made 3: wait for its third
    assert repo.ingest([_finish(r0, 1.0, 3, attempts=2)]).completed_groups == []
    assert [g.group_id for g in repo.ingest([recorded(second[2])]).completed_groups] == ["g1"]
    [sample] = repo.samples("r0")
    assert list(sample.call_ids) == ["a2-c0", "a2-c1", "a2-c2"]
    assert list(sample.prompt_token_ids) == list(second[0].prompt_token_ids)
    assert len(repo.calls("r0")) == 5


def test_a_store_of_schema_2_is_migrated_and_its_calls_read_as_attempt_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setattr(database, "MIGRATIONS", database.MIGRATIONS[:2])
    old = SqlRepository(url)
    old.open()
    old.close()
    monkeypatch.undo()
    with sqlite3.connect(tmp_path / "store.db") as db:  # calls as schema 2 stored them
        for c in conversation("r0", 2):
            db.execute(
                "INSERT INTO calls (rollout_id, call_id, attempt, run_id, receive_time, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (c.rollout_id, c.call_id, c.attempt, c.run_id, c.receive_time.ToNanoseconds(), c.SerializeToString()),
            )
    new = SqlRepository(url)
    new.open()
    try:
        assert new.schema_version() == 4
        r0 = make_rollout("r0")
        new.ingest([submitted(r0)])
        assert [g.group_id for g in new.ingest([_finish(r0, 1.0, 2, attempts=1)]).completed_groups] == ["g1"]
        assert list(new.samples("r0")[0].call_ids) == ["c0", "c1"]
    finally:
        new.close()


def test_finish_before_submit_and_stale_states(repo: SqlRepository) -> None:
    r0 = make_rollout("r0")
    repo.ingest([recorded(c) for c in conversation("r0", 2)])
    repo.ingest([_finish(r0, 1.0, 2)])
    repo.ingest([("started/r0", orch.RolloutStarted(event_id="started/r0", rollout=r0))])  # late, older state
    assert repo.rollout("r0").status == DONE
    assert repo.completed_groups("run", 0) == []  # the group's size is not known yet
    assert [g.group_id for g in repo.ingest([submitted(r0)]).completed_groups] == ["g1"]


def test_invalid_call_is_refused(repo: SqlRepository) -> None:
    bad = make_call("r0", "c0", [1, 2], [3, 4])
    del bad.completion_logprobs[:]
    bad.completion_logprobs.append(-1.0)
    with pytest.raises(InvalidArgument):
        repo.ingest([recorded(bad)])
    assert repo.count_calls() == 0  # nothing of the failed batch was committed


def test_list_filters_and_pages(repo: SqlRepository) -> None:
    rollouts = [make_rollout(f"r{i:02d}", group_id=f"g{i}", status=DONE, reward=i / 10, t=i % 4) for i in range(10)]
    repo.ingest([submitted(*rollouts)])
    seen: list[str] = []
    token = ""
    while True:
        page, token = repo.list_rollouts(RolloutFilter(run_id="run"), 3, token)
        seen += [r.rollout_id for r in page]
        if not token:
            break
    expected = sorted(rollouts, key=lambda r: (-r.create_time.ToNanoseconds(), r.rollout_id))
    assert seen == [r.rollout_id for r in expected]
    page, _ = repo.list_rollouts(RolloutFilter(min_reward=0.3, max_reward=0.5, status=DONE), 0, "")
    assert sorted(r.rollout_id for r in page) == ["r03", "r04", "r05"]
    with pytest.raises(InvalidArgument):
        repo.list_rollouts(RolloutFilter(), 0, "bogus")
    with pytest.raises(NotFound):
        repo.rollout("nope")


def test_retention_deletes_old_runs(repo: SqlRepository) -> None:
    _group(repo)
    old = make_rollout("new", group_id="g2", run_id="fresh", t=10**12)  # 1000 s later
    repo.ingest([submitted(old, event_id="sub/2")])
    deleted = repo.delete_runs_older_than(1.0 + 500)  # cutoff between the two runs
    assert deleted == ["run"]
    with pytest.raises(NotFound):
        repo.rollout("r0")
    assert repo.count_calls() == 0
    assert repo.rollout("new").run_id == "fresh"


def test_export_round_trips(repo: SqlRepository, tmp_path: Path) -> None:
    r0, r1 = _group(repo)
    repo.ingest([_finish(r0, 1.0, 3), _finish(r1, 0.0, 3)])
    items = repo.run_samples("run")
    rows = export.rows(items, None)
    out = tmp_path / "out" / "run.parquet"
    assert export.write_parquet(out, rows, include_requests=False) == 2
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    table = pq.read_table(out)
    assert table.column_names[:6] == [
        "prompt_ids",
        "response_ids",
        "response_mask",
        "rollout_log_probs",
        "policy_versions",
        "reward",
    ]
    back = table.to_pylist()
    for row, (_, s) in zip(back, items, strict=True):
        assert row["response_ids"] == list(s.response_token_ids)
        assert row["response_mask"] == list(s.loss_mask)
        assert row["prompt_ids"] == list(s.prompt_token_ids)
        assert row["uid"] == "g1"
    assert "requests" not in table.column_names
    jsonl = tmp_path / "run.jsonl"
    calls: dict[str, dict[str, object]] = {c.call_id: {"model": "tiny"} for c in repo.calls("r0")}
    export.write_jsonl(jsonl, export.rows(items, calls))
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert json.loads(lines[0]["requests"]) == [{"model": "tiny"}] * 3
    assert stat.S_IMODE(os.stat(jsonl).st_mode) == 0o600
    with pytest.raises(NotFound):
        repo.run_samples("no-run")


def test_sqlite_file_is_owner_only(tmp_path: Path) -> None:
    r = SqlRepository(str(tmp_path / "private" / "store.db"))
    r.open()
    r.ingest([submitted(make_rollout("r0"))])
    for f in (tmp_path / "private").iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f.name
    r.close()


def test_run_manifest_is_kept(repo: SqlRepository) -> None:
    manifest = common_pb2.RunManifest(
        run_id="run",
        harness="codex",
        harness_version="0.171.0",
        tokenizer_hash="sha256:ab",
        parsers=["hermes"],
        sandbox_image_digest="sha256:cd",
    )
    event = orch.RunRegistered(event_id="run/run", manifest=manifest)
    repo.ingest([("run/run", event)])
    repo.ingest([("run/run", event)])
    assert repo.run_manifest("run") == manifest
    assert repo.run_manifest("other") is None


def test_trainer_step_metrics_are_kept_per_step(repo: SqlRepository) -> None:
    from openforge.trainer.v1 import events_pb2 as trainer_events

    def step(n: int, reward: float) -> tuple[str, trainer_events.StepCompleted]:
        eid = f"step/run/{n}"
        return eid, trainer_events.StepCompleted(
            event_id=eid, run_id="run", step=n, policy_version=n, metrics={"reward/mean": reward}
        )

    repo.ingest([step(2, 0.5), step(1, 0.25)])
    repo.ingest([step(2, 0.5)])  # redelivered
    got = repo.step_metrics("run")
    assert [(m.step, m.metrics["reward/mean"]) for m in got] == [(1, 0.25), (2, 0.5)]
    assert repo.step_metrics("other") == []


def test_runs_are_listed_newest_first_with_manifest_and_counts(repo: SqlRepository) -> None:
    from openforge.trainer.v1 import events_pb2 as trainer_events

    r0, r1 = _group(repo)  # run "run": rollouts created at 1 s
    repo.ingest([_finish(r0, 1.0, 3), _finish(r1, 0.0, 3)])
    other = make_rollout("o0", group_id="g2", run_id="older", task_id="t2")
    other.create_time.FromNanoseconds(500_000_000)
    repo.ingest([submitted(other, event_id="sub/2")])
    manifest = common_pb2.RunManifest(run_id="registered", harness="codex", model="models/tiny")
    repo.ingest([("run/registered", orch.RunRegistered(event_id="run/registered", manifest=manifest))])
    step = trainer_events.StepCompleted(event_id="step/run/1", run_id="run", step=1, policy_version=3)
    repo.ingest([("step/run/1", step)])

    runs, token = repo.list_runs(0, "")
    assert token == ""
    # "registered" was seen at the store's clock (now), the others at their first rollout.
    assert [r.run_id for r in runs] == ["registered", "run", "older"]
    reg, run, older = runs
    assert reg.manifest == manifest and reg.rollouts == 0 and not reg.HasField("mean_reward")
    assert (run.rollouts, run.finished_rollouts, run.tasks, run.steps, run.last_policy_version) == (2, 2, 1, 1, 3)
    assert run.mean_reward == pytest.approx(0.5)
    assert not run.HasField("manifest")
    assert run.create_time.ToNanoseconds() == 1_000_000_000
    assert (older.rollouts, older.finished_rollouts) == (1, 0)

    first, token = repo.list_runs(2, "")
    assert [r.run_id for r in first] == ["registered", "run"] and token
    rest, last = repo.list_runs(2, token)
    assert [r.run_id for r in rest] == ["older"] and last == ""
    assert repo.run_summary("run") == run
    with pytest.raises(NotFound):
        repo.run_summary("nope")
    with pytest.raises(InvalidArgument):
        repo.list_runs(0, "not-a-token")
    with pytest.raises(InvalidArgument):
        repo.list_runs(-1, "")


def test_step_metrics_are_paged_in_step_order(repo: SqlRepository) -> None:
    from openforge.trainer.v1 import events_pb2 as trainer_events

    events = []
    for n in (3, 1, 2):
        ev = trainer_events.StepCompleted(
            event_id=f"step/run/{n}", run_id="run", step=n, policy_version=n + 1, metrics={"reward/mean": n / 10}
        )
        ev.time.FromSeconds(100 + n)
        events.append((ev.event_id, ev))
    repo.ingest(events)
    page, token = repo.step_metrics_page("run", 2, "")
    assert [(s.step, s.policy_version, s.metrics["reward/mean"]) for s in page] == [(1, 2, 0.1), (2, 3, 0.2)]
    assert page[0].time.seconds == 101
    rest, last = repo.step_metrics_page("run", 2, token)
    assert [s.step for s in rest] == [3] and last == ""
    # A run known only by its step metrics is listed, seen when its first step finished.
    [run], _ = repo.list_runs(0, "")
    assert (run.run_id, run.steps, run.create_time.seconds) == ("run", 3, 101)
    with pytest.raises(NotFound):
        repo.step_metrics_page("nope", 0, "")
    with pytest.raises(InvalidArgument):
        repo.step_metrics_page("run", 0, "s:x")


def test_a_lost_postgresql_connection_is_opened_again(postgres_dsn: str, pg_repo: SqlRepository) -> None:
    """A server restart or failover kills the store's connection: the statement that finds it lost
    fails (its events are redelivered) and the next one runs on a new connection."""
    import psycopg

    repo = pg_repo
    calls = conversation("r0", 2)
    repo.ingest([recorded(calls[0])])
    pid = repo.db.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        repo.ingest([recorded(calls[1])])
    repo.ingest([recorded(calls[1])])  # redelivered: on a new connection
    assert repo.count_calls() == 2
    assert repo.db.execute("SELECT pg_backend_pid()").fetchone()[0] != pid


def test_call_roles_are_kept_and_each_lineage_is_its_own_sample(repo: SqlRepository) -> None:
    r0 = make_rollout("r0")
    main = conversation("r0", 2)
    sub = [make_call("r0", "s0", [3, 4, 5], [6, 7], t=500)]
    for c in main:
        c.role, c.lineage_id = common_pb2.CALL_ROLE_MAIN, "l0"
    sub[0].role, sub[0].lineage_id = common_pb2.CALL_ROLE_SUB_AGENT, "l1"
    repo.ingest([submitted(r0), *[recorded(c) for c in [main[0], *sub, main[1]]]])
    repo.ingest([_finish(r0, 1.0, 3)])
    rows = repo.db.execute("SELECT call_id, role, lineage_id FROM calls ORDER BY call_id").fetchall()
    assert [tuple(r) for r in rows] == [
        ("c0", common_pb2.CALL_ROLE_MAIN, "l0"),
        ("c1", common_pb2.CALL_ROLE_MAIN, "l0"),
        ("s0", common_pb2.CALL_ROLE_SUB_AGENT, "l1"),
    ]
    samples = repo.samples("r0")
    assert [(s.role, s.lineage_id, list(s.call_ids)) for s in samples] == [
        (common_pb2.CALL_ROLE_MAIN, "l0", ["c0", "c1"]),
        (common_pb2.CALL_ROLE_SUB_AGENT, "l1", ["s0"]),
    ]
