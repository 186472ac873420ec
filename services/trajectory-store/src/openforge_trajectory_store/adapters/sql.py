"""The durable record in SQL: SQLite (embedded default, WAL) or PostgreSQL.

One repository, two dialects; the same test suite runs against both. The rules of ingestion
live in the domain (:mod:`..domain.projection`); this module runs them over SQL: all writes of
one ingested batch happen in one transaction, and the caller acks the batch's events only after
:meth:`SqlRepository.ingest` returned, so an event is never acked before it is committed.
Ingestion is idempotent: each event id is recorded in ``events_seen`` in the same transaction
as its effects. The schema and the dialects are in :mod:`.database`, the reads in
:mod:`.sql_reads`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from openforge.common.v1 import common_pb2
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge_trajectory_store.adapters.database import Database
from openforge_trajectory_store.adapters.sql_reads import SqlReads, load_calls
from openforge_trajectory_store.domain import tokens, wire
from openforge_trajectory_store.domain.ports import Event, GroupRow, IngestResult, RolloutRow
from openforge_trajectory_store.domain.projection import Projection

log = structlog.get_logger(__name__)


class SqlRepository(SqlReads):
    """The store's repository over SQLite or PostgreSQL: the reads (:class:`.sql_reads.SqlReads`)
    plus ingestion, publication marks and retention.

    Args:
        dsn: ``sqlite:///path/to/file.db`` (or a plain path) for SQLite;
            ``postgresql://...`` for PostgreSQL.
        base_cache: Rollouts whose last call sequence is kept in memory to
            delta-encode the next call's prompt.
        delta_base_bytes: Memory for the latest calls' request JSON, canonical JSON and token
            sequence, kept to rebuild the proxy's records coded against them (``RecordDelta``),
            least recently used first out; a miss reads the rollout's calls back from the
            database.
        clock: Unix seconds (injectable for tests).
    """

    def __init__(
        self,
        dsn: str,
        *,
        base_cache: int = 4096,
        delta_base_bytes: int = 256 * 2**20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(Database(dsn))
        self.dsn = dsn
        self._projection = Projection(base_cache=base_cache, delta_base_bytes=delta_base_bytes, clock=clock)
        self._writes = _SqlProjectionStore(self.db)

    @property
    def delta_base_misses(self) -> int:
        """Deltas whose base was read back from the database (not in memory)."""
        return self._projection.delta_base_misses

    def open(self) -> None:
        """Connects and applies pending migrations.

        Raises:
            FailedPrecondition: The database cannot be opened.
        """
        self.db.open()

    def close(self) -> None:
        """Closes the connection."""
        self.db.close()

    def schema_version(self) -> int:
        """The applied schema version."""
        return self.db.schema_version()

    def ingest(self, events: Sequence[Event]) -> IngestResult:
        """Applies a batch of events in one transaction; idempotent per event id.

        Args:
            events: (event id, event message[, the event's wire bytes]); see
                :meth:`..domain.projection.Projection.apply`.

        Returns:
            What changed.

        Raises:
            InvalidArgument: An event is not one the store records, or is
                malformed (e.g. logprobs that do not match the sampled tokens).
            BaseNotStored: A call record coded as a delta whose base is not stored yet
                (transient: its event is redelivered).
        """
        with self.db.transaction():
            batch = self._projection.apply(self._writes, events)
        return self._projection.committed(batch)

    def mark_published(self, group_id: str) -> None:
        """Records that a group's GroupCompleted event was published."""
        with self.db.transaction():
            self.db.execute("UPDATE groups_ SET published = 1 WHERE group_id = ?", (group_id,))

    def delete_runs_older_than(self, cutoff_unix_s: float) -> list[str]:
        """Deletes every run whose newest rollout (or registration) is older than the cutoff.

        Returns:
            The deleted run ids.
        """
        cutoff_ns = int(cutoff_unix_s * 1e9)
        x = self.db.execute
        with self.db.transaction():
            rows = x(
                "SELECT run_id FROM (SELECT run_id, MAX(create_time) AS newest FROM rollouts GROUP BY run_id) t"
                " WHERE newest < ?",
                (cutoff_ns,),
            ).fetchall()
            old_registered = x(
                "SELECT run_id FROM runs WHERE create_time < ? AND run_id NOT IN (SELECT run_id FROM rollouts)",
                (cutoff_unix_s,),
            ).fetchall()
            runs = sorted({r[0] for r in rows} | {r[0] for r in old_registered})
            for run_id in runs:
                for table in ("calls", "samples", "rollouts", "groups_", "tasks", "runs", "step_metrics"):
                    x(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            x("DELETE FROM events_seen WHERE seen_at < ?", (cutoff_unix_s,))
        for run_id in runs:
            log.info("retention.deleted_run", run_id=run_id)
        return runs


class _SqlProjectionStore:
    """:class:`~..domain.ports.ProjectionStore` in SQL; its statements run in the caller's transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._x = db.execute

    def mark_seen(self, event_id: str, now: float) -> bool:
        cur = self._x(
            "INSERT INTO events_seen (event_id, seen_at) VALUES (?, ?) ON CONFLICT DO NOTHING", (event_id, now)
        )
        return bool(cur.rowcount)

    def rollout_row(self, rollout_id: str) -> RolloutRow | None:
        row = self._x(
            "SELECT status, expected_calls, attempts, assembled, group_id, run_id, data FROM rollouts"
            " WHERE rollout_id = ?",
            (rollout_id,),
        ).fetchone()
        if row is None:
            return None
        status, expected, attempts, assembled, group_id, run_id, data = row
        return RolloutRow(int(status), int(expected), int(attempts), bool(assembled), group_id, run_id, bytes(data))

    def insert_rollout(self, r: common_pb2.Rollout, expected_calls: int, attempts: int, now: float) -> None:
        self._x(
            "INSERT INTO rollouts (rollout_id, run_id, task_id, group_id, status, reward, create_time,"
            " expected_calls, attempts, updated_at, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r.rollout_id,
                r.run_id,
                r.task_id,
                r.group_id,
                int(r.status),
                _reward(r),
                r.create_time.ToNanoseconds(),
                expected_calls,
                attempts,
                now,
                r.SerializeToString(),
            ),
        )
        self._x(
            "INSERT INTO tasks (run_id, task_id, first_seen) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (r.run_id, r.task_id, now),
        )

    def update_rollout(self, r: common_pb2.Rollout, expected_calls: int, attempts: int, now: float) -> None:
        larger = self._db.greatest
        self._x(
            f"UPDATE rollouts SET status = ?, reward = ?, expected_calls = {larger}(expected_calls, ?),"
            f" attempts = {larger}(attempts, ?), updated_at = ?, data = ? WHERE rollout_id = ?",
            (int(r.status), _reward(r), expected_calls, attempts, now, r.SerializeToString(), r.rollout_id),
        )

    def add_group(self, group_id: str, run_id: str, task_id: str, size: int) -> None:
        self._x(
            "INSERT INTO groups_ (group_id, run_id, task_id, size) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (group_id, run_id, task_id, size),
        )

    def put_run(self, manifest: common_pb2.RunManifest, now: float) -> None:
        self._x(
            "INSERT INTO runs (run_id, create_time, manifest) VALUES (?, ?, ?)"
            " ON CONFLICT (run_id) DO UPDATE SET manifest = excluded.manifest",
            (manifest.run_id, now, manifest.SerializeToString()),
        )

    def put_step(self, step: trainer_events.StepCompleted) -> None:
        self._x(
            "INSERT INTO step_metrics (run_id, step, policy_version, data) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run_id, step) DO UPDATE SET policy_version = excluded.policy_version,"
            " data = excluded.data",
            (step.run_id, step.step, step.policy_version, step.SerializeToString()),
        )

    def insert_call(self, rec: common_pb2.CallRecord, stored: tokens.StoredCall) -> bool:
        base_call, base_attempt = stored.base if stored.base else (None, None)
        cur = self._x(
            "INSERT INTO calls (rollout_id, call_id, attempt, rollout_attempt, run_id, receive_time, base_call_id,"
            " base_attempt, prefix_len, role, lineage_id, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (
                rec.rollout_id,
                rec.call_id,
                rec.attempt,
                max(1, rec.rollout_attempt),  # schema 3's default: calls of an unknown attempt are of the first
                rec.run_id,
                rec.receive_time.ToNanoseconds(),
                base_call,
                base_attempt,
                stored.prefix_len,
                rec.role,
                rec.lineage_id,
                stored.data,
            ),
        )
        return bool(cur.rowcount)

    def call_views(self, rollout_id: str) -> list[wire.CallView]:
        return load_calls(self._db, rollout_id)

    def distinct_calls(self, rollout_id: str, rollout_attempt: int) -> int:
        return int(
            self._x(
                "SELECT COUNT(DISTINCT call_id) FROM calls WHERE rollout_id = ? AND (rollout_attempt = ? OR ? = 0)",
                (rollout_id, rollout_attempt, rollout_attempt),
            ).fetchone()[0]
        )

    def put_samples(self, rollout_id: str, run_id: str, samples: Sequence[bytes]) -> None:
        self._x("DELETE FROM samples WHERE rollout_id = ?", (rollout_id,))
        for index, sample in enumerate(samples):
            self._x(
                "INSERT INTO samples (rollout_id, idx, run_id, data) VALUES (?, ?, ?, ?)",
                (rollout_id, index, run_id, sample),
            )
        self._x("UPDATE rollouts SET assembled = 1 WHERE rollout_id = ?", (rollout_id,))

    def group_row(self, group_id: str) -> GroupRow | None:
        row = self._x(
            "SELECT run_id, task_id, size, completed_seq FROM groups_ WHERE group_id = ?", (group_id,)
        ).fetchone()
        if row is None:
            return None
        return GroupRow(row[0], row[1], int(row[2]), None if row[3] is None else int(row[3]))

    def assembled_rollouts(self, group_id: str) -> int:
        return int(
            self._x("SELECT COUNT(*) FROM rollouts WHERE group_id = ? AND assembled = 1", (group_id,)).fetchone()[0]
        )

    def complete_group(self, group_id: str) -> int:
        seq = int(self._x("SELECT COALESCE(MAX(completed_seq), 0) + 1 FROM groups_").fetchone()[0])
        self._x("UPDATE groups_ SET completed_seq = ? WHERE group_id = ?", (seq, group_id))
        return seq


def _reward(r: common_pb2.Rollout) -> float | None:
    return r.reward if r.HasField("reward") else None
