"""The store's reads (:class:`~..domain.ports.TrajectoryReads` and the consumer's) in SQL."""

from __future__ import annotations

from typing import Any

from openforge.common.v1 import common_pb2
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core.errors import FailedPrecondition, NotFound
from openforge_trajectory_store.adapters.database import Database
from openforge_trajectory_store.domain import tokens, wire
from openforge_trajectory_store.domain.ports import CompletedGroup
from openforge_trajectory_store.domain.query import (
    PageCursor,
    RolloutFilter,
    RunCursor,
    page_size,
    step_cursor_decode,
    step_cursor_encode,
)

_TERMINAL_STATUSES = (
    int(common_pb2.ROLLOUT_STATUS_SUCCEEDED),
    int(common_pb2.ROLLOUT_STATUS_FAILED),
    int(common_pb2.ROLLOUT_STATUS_TIMED_OUT),
    int(common_pb2.ROLLOUT_STATUS_CANCELLED),
)
_GROUP_COLUMNS = "SELECT completed_seq, group_id, run_id, task_id, size FROM groups_"


def load_calls(db: Database, rollout_id: str) -> list[wire.CallView]:
    """Every stored attempt of every call of a rollout as full records (prompts rebuilt from
    their bases, tokens left packed), in receive order."""
    rows = db.execute(
        "SELECT data, base_call_id, base_attempt, prefix_len FROM calls WHERE rollout_id = ? ORDER BY seq",
        (rollout_id,),
    ).fetchall()
    views = tokens.decode((bytes(d), (bc, ba) if bc is not None else None, pl) for d, bc, ba, pl in rows)
    views.sort(key=lambda v: (v.receive_ns, v.call_id, v.attempt))
    return views


class SqlReads:
    """Reads of the durable record; each sees one committed state.

    Args:
        db: The database.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    def rollout(self, rollout_id: str) -> common_pb2.Rollout:
        """One rollout. Raises NotFound."""
        with self.db.lock:
            row = self.db.execute("SELECT data FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        return common_pb2.Rollout.FromString(bytes(row[0]))

    def list_rollouts(self, flt: RolloutFilter, size: int, token: str) -> tuple[list[common_pb2.Rollout], str]:
        """A page of rollouts, newest first, and the next page token ("" on the last page).

        Raises:
            InvalidArgument: Negative size or malformed token.
        """
        limit = page_size(size)
        where: list[str] = ["1 = 1"]
        params: list[Any] = []
        for column, op, value in (
            ("run_id", "=", flt.run_id or None),
            ("task_id", "=", flt.task_id or None),
            ("status", "=", flt.status or None),
            ("reward", ">=", flt.min_reward),
            ("reward", "<=", flt.max_reward),
        ):
            if value is not None:
                where.append(f"{column} {op} ?")
                params.append(value)
        if token:
            cur = PageCursor.decode(token)
            where.append("(create_time < ? OR (create_time = ? AND rollout_id > ?))")
            params += [cur.create_time_ns, cur.create_time_ns, cur.rollout_id]
        sql = (
            f"SELECT data, create_time, rollout_id FROM rollouts WHERE {' AND '.join(where)}"
            " ORDER BY create_time DESC, rollout_id ASC LIMIT ?"
        )
        with self.db.lock:
            rows = self.db.execute(sql, [*params, limit + 1]).fetchall()
        page = [common_pb2.Rollout.FromString(bytes(r[0])) for r in rows[:limit]]
        next_token = PageCursor(rows[limit - 1][1], rows[limit - 1][2]).encode() if len(rows) > limit else ""
        return page, next_token

    def call_views(self, rollout_id: str) -> list[wire.CallView]:
        """Every attempt of every call as full serialized records (tokens left packed), in receive order."""
        with self.db.lock:
            return load_calls(self.db, rollout_id)

    def calls(self, rollout_id: str) -> list[common_pb2.CallRecord]:
        """Every attempt of every call, in receive order. Raises NotFound if nothing is known of the rollout."""
        with self.db.lock:
            calls = [common_pb2.CallRecord.FromString(v.data) for v in load_calls(self.db, rollout_id)]
            if not calls and self._one("SELECT 1 FROM rollouts WHERE rollout_id = ?", rollout_id) is None:
                raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        return calls

    def samples(self, rollout_id: str) -> list[trajectory_pb2.Sample]:
        """A rollout's samples.

        Raises:
            NotFound: Unknown rollout.
            FailedPrecondition: The rollout has not ended (or its calls are still arriving).
        """
        with self.db.lock:
            row = self._one("SELECT assembled FROM rollouts WHERE rollout_id = ?", rollout_id)
            if row is None:
                raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
            if not row[0]:
                raise FailedPrecondition(f"rollout {rollout_id} is not assembled yet", reason="NOT_ASSEMBLED")
            return self._samples_of(rollout_id)

    def completed_groups(self, run_id: str, after_seq: int, limit: int = 100) -> list[CompletedGroup]:
        """Completed groups of a run after a cursor position, in completion order."""
        return self._groups(
            f"{_GROUP_COLUMNS} WHERE run_id = ? AND completed_seq > ? ORDER BY completed_seq LIMIT ?",
            (run_id, after_seq, limit),
        )

    def unpublished_groups(self) -> list[CompletedGroup]:
        """Completed groups whose GroupCompleted event is not yet confirmed published."""
        return self._groups(
            f"{_GROUP_COLUMNS} WHERE completed_seq IS NOT NULL AND published = 0 ORDER BY completed_seq"
        )

    def group_contents(self, group_id: str) -> tuple[list[common_pb2.Rollout], list[trajectory_pb2.Sample]]:
        """The rollouts (by group index) and their samples of one group."""
        with self.db.lock:
            rows = self.db.execute("SELECT data FROM rollouts WHERE group_id = ?", (group_id,)).fetchall()
            rollouts = sorted((common_pb2.Rollout.FromString(bytes(r[0])) for r in rows), key=lambda r: r.group_index)
            samples = [s for r in rollouts for s in self._samples_of(r.rollout_id)]
        return rollouts, samples

    def run_samples(self, run_id: str) -> list[tuple[common_pb2.Rollout, trajectory_pb2.Sample]]:
        """Every sample of a run with its rollout, in rollout creation order.

        Raises:
            NotFound: The run has no rollouts.
        """
        with self.db.lock:
            rows = self.db.execute(
                "SELECT rollout_id, data FROM rollouts WHERE run_id = ? ORDER BY create_time, rollout_id",
                (run_id,),
            ).fetchall()
            if not rows:
                raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id})
            out = []
            for rid, data in rows:
                r = common_pb2.Rollout.FromString(bytes(data))
                out += [(r, s) for s in self._samples_of(rid)]
        return out

    def step_metrics(self, run_id: str) -> list[trainer_events.StepCompleted]:
        """The trainer's per-step metrics of a run, in step order."""
        with self.db.lock:
            rows = self.db.execute("SELECT data FROM step_metrics WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
        return [trainer_events.StepCompleted.FromString(bytes(r[0])) for r in rows]

    def list_runs(self, size: int, token: str) -> tuple[list[trajectory_pb2.RunSummary], str]:
        """A page of runs, newest first (by when the store first saw them), and the next page token.

        A run is known once registered (``RunRegistered``), or once it has a rollout or a step metric.

        Raises:
            InvalidArgument: Negative size or malformed token.
        """
        limit = page_size(size)
        cursor = RunCursor.decode(token) if token else None
        with self.db.lock:
            order = sorted(self._first_seen().items(), key=lambda kv: (-kv[1], kv[0]))
            if cursor is not None:
                order = [(rid, t) for rid, t in order if cursor.after(t, rid)]
            page = order[: limit + 1]
            runs = [self._summary(rid, t) for rid, t in page[:limit]]
        next_token = RunCursor(page[limit - 1][1], page[limit - 1][0]).encode() if len(page) > limit else ""
        return runs, next_token

    def run_summary(self, run_id: str) -> trajectory_pb2.RunSummary:
        """One run's manifest and counts.

        Raises:
            NotFound: The store knows nothing of the run.
        """
        with self.db.lock:
            seen = self._first_seen(run_id)
            if run_id not in seen:
                raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id})
            return self._summary(run_id, seen[run_id])

    def step_metrics_page(self, run_id: str, size: int, token: str) -> tuple[list[trajectory_pb2.StepMetrics], str]:
        """A page of a run's step metrics in step order, and the next page token ("" on the last page).

        Raises:
            InvalidArgument: Negative size or malformed token.
            NotFound: The store knows nothing of the run.
        """
        limit = page_size(size)
        after = step_cursor_decode(token)
        with self.db.lock:
            if run_id not in self._first_seen(run_id):
                raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id})
            rows = self.db.execute(
                "SELECT data FROM step_metrics WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?",
                (run_id, after, limit + 1),
            ).fetchall()
        steps = []
        for (data,) in rows[:limit]:
            ev = trainer_events.StepCompleted.FromString(bytes(data))
            m = trajectory_pb2.StepMetrics(step=ev.step, policy_version=ev.policy_version, metrics=dict(ev.metrics))
            if ev.HasField("time"):
                m.time.CopyFrom(ev.time)
            steps.append(m)
        next_token = step_cursor_encode(steps[-1].step) if len(rows) > limit else ""
        return steps, next_token

    def run_manifest(self, run_id: str) -> common_pb2.RunManifest | None:
        """The run's manifest, if one was registered."""
        with self.db.lock:
            row = self._one("SELECT manifest FROM runs WHERE run_id = ?", run_id)
        return common_pb2.RunManifest.FromString(bytes(row[0])) if row and row[0] is not None else None

    def count_calls(self) -> int:
        """Stored call attempts (all rollouts)."""
        with self.db.lock:
            return int(self.db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])

    def _one(self, sql: str, key: str) -> Any:
        """The first row of a query by one key, or None."""
        return self.db.execute(sql, (key,)).fetchone()

    def _samples_of(self, rollout_id: str) -> list[trajectory_pb2.Sample]:
        rows = self.db.execute("SELECT data FROM samples WHERE rollout_id = ? ORDER BY idx", (rollout_id,)).fetchall()
        return [trajectory_pb2.Sample.FromString(bytes(r[0])) for r in rows]

    def _groups(self, sql: str, params: tuple[Any, ...] = ()) -> list[CompletedGroup]:
        with self.db.lock:
            rows = self.db.execute(sql, params).fetchall()
        return [CompletedGroup(int(r[0]), r[1], r[2], r[3], int(r[4])) for r in rows]

    def _first_seen(self, run_id: str | None = None) -> dict[str, float]:
        """run id → when the store first saw it, unix seconds (registration, first rollout, first step)."""
        one = " WHERE run_id = ?" if run_id is not None else ""
        params: tuple[Any, ...] = (run_id,) if run_id is not None else ()
        seen: dict[str, float] = {}
        for rid, t in self.db.execute(f"SELECT run_id, create_time FROM runs{one}", params).fetchall():
            seen[rid] = float(t)
        for rid, t in self.db.execute(
            f"SELECT run_id, MIN(create_time) FROM rollouts{one} GROUP BY run_id", params
        ).fetchall():
            seen.setdefault(rid, int(t) / 1e9)
        steps = self.db.execute(f"SELECT run_id, data FROM step_metrics{one} ORDER BY step", params).fetchall()
        for rid, data in steps:
            if rid not in seen:
                seen[rid] = trainer_events.StepCompleted.FromString(bytes(data)).time.ToNanoseconds() / 1e9
        return seen

    def _summary(self, run_id: str, first_seen_s: float) -> trajectory_pb2.RunSummary:
        n, done, mean, rewarded, tasks = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN status IN (?, ?, ?, ?) THEN 1 ELSE 0 END), 0),"
            " AVG(reward), COUNT(reward), COUNT(DISTINCT task_id) FROM rollouts WHERE run_id = ?",
            (*_TERMINAL_STATUSES, run_id),
        ).fetchone()
        steps, last_version = self.db.execute(
            "SELECT COUNT(*), COALESCE(MAX(policy_version), 0) FROM step_metrics WHERE run_id = ?", (run_id,)
        ).fetchone()
        row = self._one("SELECT manifest FROM runs WHERE run_id = ?", run_id)
        out = trajectory_pb2.RunSummary(
            run_id=run_id,
            rollouts=int(n),
            finished_rollouts=int(done),
            tasks=int(tasks),
            steps=int(steps),
            last_policy_version=int(last_version),
        )
        if row is not None and row[0] is not None:
            out.manifest.ParseFromString(bytes(row[0]))
        if int(rewarded):
            out.mean_reward = float(mean)
        out.create_time.FromNanoseconds(int(first_seen_s * 1e9))
        return out
