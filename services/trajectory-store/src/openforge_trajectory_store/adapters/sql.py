"""The durable record in SQL: SQLite (embedded default, WAL) or PostgreSQL.

One repository, two dialects; the same test suite runs against both. The rules of ingestion
live in the domain (:mod:`..domain.projection`); this module runs them over SQL: all writes of
one ingested batch happen in one transaction, and the caller acks the batch's events only after
:meth:`SqlRepository.ingest` returned, so an event is never acked before it is committed.
Ingestion is idempotent: each event id is recorded in ``events_seen`` in the same transaction
as its effects.

Schema (versioned; :data:`MIGRATIONS` are applied in order and recorded in
``schema_version``):

* ``runs``: run manifests.
* ``tasks``: (run, task) pairs seen.
* ``rollouts``: indexed columns plus the serialized ``Rollout``.
* ``groups_``: one row per group with its size, and ``completed_seq`` — the
  position in the completion order that WatchCompletedGroups cursors use.
* ``calls``: one row per attempt; the serialized ``CallRecord`` with its prompt
  stored as a delta on an earlier call (:mod:`..domain.tokens`).
* ``samples``: serialized ``Sample`` per (rollout, index).
* ``step_metrics``: the trainer's ``StepCompleted`` per (run, step) (schema version 2).
* ``calls.rollout_attempt``, ``rollouts.attempts``: which of the orchestrator's attempts of a
  rollout made each call, and how many it made (schema version 3): only the calls of the last
  attempt are assembled.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import structlog

from openforge.common.v1 import common_pb2
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core.errors import FailedPrecondition, NotFound
from openforge_trajectory_store.domain import tokens, wire
from openforge_trajectory_store.domain.ports import CompletedGroup, Event, GroupRow, IngestResult, RolloutRow
from openforge_trajectory_store.domain.projection import Projection
from openforge_trajectory_store.domain.query import (
    PageCursor,
    RolloutFilter,
    RunCursor,
    page_size,
    step_cursor_decode,
    step_cursor_encode,
)

log = structlog.get_logger(__name__)

# {blob}, {serial} are filled per dialect.
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE events_seen (event_id TEXT PRIMARY KEY, seen_at DOUBLE PRECISION NOT NULL)",
        "CREATE INDEX events_seen_at ON events_seen (seen_at)",
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, create_time DOUBLE PRECISION NOT NULL, manifest {blob})",
        "CREATE TABLE tasks (run_id TEXT NOT NULL, task_id TEXT NOT NULL, first_seen DOUBLE PRECISION NOT NULL,"
        " PRIMARY KEY (run_id, task_id))",
        "CREATE TABLE rollouts (rollout_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL,"
        " group_id TEXT NOT NULL, status INTEGER NOT NULL, reward DOUBLE PRECISION, create_time BIGINT NOT NULL,"
        " expected_calls INTEGER NOT NULL DEFAULT 0, assembled INTEGER NOT NULL DEFAULT 0,"
        " updated_at DOUBLE PRECISION NOT NULL, data {blob} NOT NULL)",
        "CREATE INDEX rollouts_run ON rollouts (run_id, create_time)",
        "CREATE INDEX rollouts_group ON rollouts (group_id)",
        "CREATE TABLE groups_ (group_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_id TEXT NOT NULL,"
        " size INTEGER NOT NULL, completed_seq BIGINT UNIQUE, published INTEGER NOT NULL DEFAULT 0)",
        "CREATE INDEX groups_run ON groups_ (run_id, completed_seq)",
        "CREATE TABLE calls (seq {serial}, rollout_id TEXT NOT NULL, call_id TEXT NOT NULL,"
        " attempt INTEGER NOT NULL, run_id TEXT NOT NULL, receive_time BIGINT NOT NULL,"
        " base_call_id TEXT, base_attempt INTEGER, prefix_len INTEGER NOT NULL DEFAULT 0, data {blob} NOT NULL,"
        " UNIQUE (rollout_id, call_id, attempt))",
        "CREATE TABLE samples (rollout_id TEXT NOT NULL, idx INTEGER NOT NULL, run_id TEXT NOT NULL,"
        " data {blob} NOT NULL, PRIMARY KEY (rollout_id, idx))",
        "CREATE INDEX samples_run ON samples (run_id)",
    ],
    [
        "CREATE TABLE step_metrics (run_id TEXT NOT NULL, step BIGINT NOT NULL, policy_version BIGINT NOT NULL,"
        " data {blob} NOT NULL, PRIMARY KEY (run_id, step))",
    ],
    [
        "ALTER TABLE calls ADD COLUMN rollout_attempt INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE rollouts ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
    ],
]


class _Conn(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...
    def broken(self) -> bool: ...


def _owner_only(path: Path) -> None:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


class SqlRepository:
    """The store's repository over SQLite or PostgreSQL.

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
        self.dsn = dsn
        self.postgres = dsn.startswith(("postgresql://", "postgres://"))
        self._lock = threading.RLock()
        self._conn: _Conn | None = None
        self._in_tx = False
        self._projection = Projection(base_cache=base_cache, delta_base_bytes=delta_base_bytes, clock=clock)
        self._writes = _SqlProjectionStore(self)

    @property
    def delta_base_misses(self) -> int:
        """Deltas whose base was read back from the database (not in memory)."""
        return self._projection.delta_base_misses

    # -- connection ---------------------------------------------------------------------------

    def open(self) -> None:
        """Connects and applies pending migrations.

        Raises:
            FailedPrecondition: The database cannot be opened.
        """
        try:
            if self.postgres:
                self._conn = self._connect_postgres()
            else:
                path = Path(self.dsn.removeprefix("sqlite:///").removeprefix("sqlite://"))
                path.parent.mkdir(parents=True, exist_ok=True)
                _owner_only(path)
                old = os.umask(0o077)  # the -wal and -shm files are owner-only too
                try:
                    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("PRAGMA foreign_keys=ON")
                finally:
                    os.umask(old)
                self._conn = _ExplicitTx(conn)
        except Exception as exc:
            raise FailedPrecondition(f"cannot open the store database: {exc}", reason="DB_UNAVAILABLE") from exc
        self._migrate()

    def close(self) -> None:
        """Closes the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def _connect_postgres(self) -> _Conn:
        import psycopg

        return _ExplicitTx(psycopg.connect(self.dsn, autocommit=True))

    def _live(self) -> _Conn:
        """The connection, opened again when it was lost: the statement that found it lost
        failed (its events are redelivered), the next one runs on a new connection."""
        conn = self._conn
        assert conn is not None, "open() first"
        if self.postgres and conn.broken():  # a SQLite file is not lost this way
            log.warning("store.reconnecting")
            with contextlib.suppress(Exception):
                conn.close()
            self._conn = conn = self._connect_postgres()
        return conn

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        # inside a transaction never on a new connection: its statements would commit one by one
        conn = self._conn if self._in_tx else self._live()
        assert conn is not None, "open() first"
        return conn.execute(self._sql(sql), params)

    @contextmanager
    def _tx(self) -> Iterator[None]:
        with self._lock:
            conn = self._live()
            conn.execute(self._sql("BEGIN" if self.postgres else "BEGIN IMMEDIATE"))
            self._in_tx = True
            try:
                yield
            except BaseException:
                if not conn.broken():
                    conn.rollback()
                raise
            finally:
                self._in_tx = False
            conn.commit()

    def _migrate(self) -> None:
        blob, serial = ("BYTEA", "BIGSERIAL PRIMARY KEY") if self.postgres else ("BLOB", "INTEGER PRIMARY KEY")
        with self._tx():
            self._x("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._x("SELECT MAX(version) FROM schema_version").fetchone()
            current = row[0] or 0
            for version, statements in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for stmt in statements:
                    self._x(stmt.format(blob=blob, serial=serial))
                self._x("INSERT INTO schema_version (version) VALUES (?)", (version,))
                log.info("store.migrated", version=version, backend="postgresql" if self.postgres else "sqlite")

    def schema_version(self) -> int:
        """The applied schema version."""
        with self._lock:
            return int(self._x("SELECT MAX(version) FROM schema_version").fetchone()[0])

    # -- ingestion ----------------------------------------------------------------------------

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
        with self._tx():
            batch = self._projection.apply(self._writes, events)
        return self._projection.committed(batch)

    def _load_calls(self, rollout_id: str) -> list[wire.CallView]:
        rows = self._x(
            "SELECT data, base_call_id, base_attempt, prefix_len FROM calls WHERE rollout_id = ? ORDER BY seq",
            (rollout_id,),
        ).fetchall()
        views = tokens.decode((bytes(d), (bc, ba) if bc is not None else None, pl) for d, bc, ba, pl in rows)
        views.sort(key=lambda v: (v.receive_ns, v.call_id, v.attempt))
        return views

    # -- reads --------------------------------------------------------------------------------

    def rollout(self, rollout_id: str) -> common_pb2.Rollout:
        """One rollout. Raises NotFound."""
        with self._lock:
            row = self._x("SELECT data FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
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
        if flt.run_id:
            where.append("run_id = ?")
            params.append(flt.run_id)
        if flt.task_id:
            where.append("task_id = ?")
            params.append(flt.task_id)
        if flt.status:
            where.append("status = ?")
            params.append(flt.status)
        if flt.min_reward is not None:
            where.append("reward >= ?")
            params.append(flt.min_reward)
        if flt.max_reward is not None:
            where.append("reward <= ?")
            params.append(flt.max_reward)
        if token:
            cur = PageCursor.decode(token)
            where.append("(create_time < ? OR (create_time = ? AND rollout_id > ?))")
            params += [cur.create_time_ns, cur.create_time_ns, cur.rollout_id]
        sql = (
            f"SELECT data, create_time, rollout_id FROM rollouts WHERE {' AND '.join(where)}"
            " ORDER BY create_time DESC, rollout_id ASC LIMIT ?"
        )
        with self._lock:
            rows = self._x(sql, [*params, limit + 1]).fetchall()
        page = [common_pb2.Rollout.FromString(bytes(r[0])) for r in rows[:limit]]
        next_token = PageCursor(rows[limit - 1][1], rows[limit - 1][2]).encode() if len(rows) > limit else ""
        return page, next_token

    def call_views(self, rollout_id: str) -> list[wire.CallView]:
        """Every attempt of every call as full serialized records (tokens left packed), in receive order."""
        with self._lock:
            return self._load_calls(rollout_id)

    def calls(self, rollout_id: str) -> list[common_pb2.CallRecord]:
        """Every attempt of every call, in receive order. Raises NotFound if nothing is known of the rollout."""
        with self._lock:
            calls = [common_pb2.CallRecord.FromString(v.data) for v in self._load_calls(rollout_id)]
            if not calls and self._x("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
                raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
        return calls

    def samples(self, rollout_id: str) -> list[trajectory_pb2.Sample]:
        """A rollout's samples.

        Raises:
            NotFound: Unknown rollout.
            FailedPrecondition: The rollout has not ended (or its calls are still arriving).
        """
        with self._lock:
            row = self._x("SELECT assembled FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
            if row is None:
                raise NotFound(f"no rollout {rollout_id!r}", metadata={"rollout_id": rollout_id})
            if not row[0]:
                raise FailedPrecondition(f"rollout {rollout_id} is not assembled yet", reason="NOT_ASSEMBLED")
            rows = self._x("SELECT data FROM samples WHERE rollout_id = ? ORDER BY idx", (rollout_id,)).fetchall()
        return [trajectory_pb2.Sample.FromString(bytes(r[0])) for r in rows]

    def completed_groups(self, run_id: str, after_seq: int, limit: int = 100) -> list[CompletedGroup]:
        """Completed groups of a run after a cursor position, in completion order."""
        with self._lock:
            rows = self._x(
                "SELECT completed_seq, group_id, run_id, task_id, size FROM groups_"
                " WHERE run_id = ? AND completed_seq > ? ORDER BY completed_seq LIMIT ?",
                (run_id, after_seq, limit),
            ).fetchall()
        return [CompletedGroup(int(r[0]), r[1], r[2], r[3], int(r[4])) for r in rows]

    def group_contents(self, group_id: str) -> tuple[list[common_pb2.Rollout], list[trajectory_pb2.Sample]]:
        """The rollouts (by group index) and their samples of one group."""
        with self._lock:
            rollouts = [
                common_pb2.Rollout.FromString(bytes(r[0]))
                for r in self._x("SELECT data FROM rollouts WHERE group_id = ?", (group_id,)).fetchall()
            ]
            rollouts.sort(key=lambda r: r.group_index)
            samples: list[trajectory_pb2.Sample] = []
            for r in rollouts:
                samples += [
                    trajectory_pb2.Sample.FromString(bytes(row[0]))
                    for row in self._x(
                        "SELECT data FROM samples WHERE rollout_id = ? ORDER BY idx", (r.rollout_id,)
                    ).fetchall()
                ]
        return rollouts, samples

    def run_samples(self, run_id: str) -> list[tuple[common_pb2.Rollout, trajectory_pb2.Sample]]:
        """Every sample of a run with its rollout, in rollout creation order.

        Raises:
            NotFound: The run has no rollouts.
        """
        with self._lock:
            rollouts = self._x(
                "SELECT rollout_id, data FROM rollouts WHERE run_id = ? ORDER BY create_time, rollout_id",
                (run_id,),
            ).fetchall()
            if not rollouts:
                raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id})
            out = []
            for rid, data in rollouts:
                r = common_pb2.Rollout.FromString(bytes(data))
                for (sdata,) in self._x(
                    "SELECT data FROM samples WHERE rollout_id = ? ORDER BY idx", (rid,)
                ).fetchall():
                    out.append((r, trajectory_pb2.Sample.FromString(bytes(sdata))))
        return out

    def step_metrics(self, run_id: str) -> list[trainer_events.StepCompleted]:
        """The trainer's per-step metrics of a run, in step order."""
        with self._lock:
            rows = self._x("SELECT data FROM step_metrics WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
        return [trainer_events.StepCompleted.FromString(bytes(r[0])) for r in rows]

    def list_runs(self, size: int, token: str) -> tuple[list[trajectory_pb2.RunSummary], str]:
        """A page of runs, newest first (by when the store first saw them), and the next page token.

        A run is known once registered (``RunRegistered``), or once it has a rollout or a step metric.

        Raises:
            InvalidArgument: Negative size or malformed token.
        """
        limit = page_size(size)
        cursor = RunCursor.decode(token) if token else None
        with self._lock:
            seen = self._first_seen()
            order = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
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
        with self._lock:
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
        with self._lock:
            if run_id not in self._first_seen(run_id):
                raise NotFound(f"no run {run_id!r}", metadata={"run_id": run_id})
            rows = self._x(
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

    def _first_seen(self, run_id: str | None = None) -> dict[str, float]:
        """run id → when the store first saw it, unix seconds (registration, first rollout, first step)."""
        one = " WHERE run_id = ?" if run_id is not None else ""
        params: tuple[Any, ...] = (run_id,) if run_id is not None else ()
        seen: dict[str, float] = {}
        for rid, t in self._x(f"SELECT run_id, create_time FROM runs{one}", params).fetchall():
            seen[rid] = float(t)
        for rid, t in self._x(f"SELECT run_id, MIN(create_time) FROM rollouts{one} GROUP BY run_id", params).fetchall():
            if rid not in seen:
                seen[rid] = int(t) / 1e9
        for rid, data in self._x(f"SELECT run_id, data FROM step_metrics{one} ORDER BY step", params).fetchall():
            if rid not in seen:
                seen[rid] = trainer_events.StepCompleted.FromString(bytes(data)).time.ToNanoseconds() / 1e9
        return seen

    def _summary(self, run_id: str, first_seen_s: float) -> trajectory_pb2.RunSummary:
        terminal = [int(common_pb2.ROLLOUT_STATUS_SUCCEEDED), int(common_pb2.ROLLOUT_STATUS_FAILED)]
        terminal += [int(common_pb2.ROLLOUT_STATUS_TIMED_OUT), int(common_pb2.ROLLOUT_STATUS_CANCELLED)]
        n, done, mean, rewarded, tasks = self._x(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN status IN (?, ?, ?, ?) THEN 1 ELSE 0 END), 0),"
            " AVG(reward), COUNT(reward), COUNT(DISTINCT task_id) FROM rollouts WHERE run_id = ?",
            (*terminal, run_id),
        ).fetchone()
        steps, last_version = self._x(
            "SELECT COUNT(*), COALESCE(MAX(policy_version), 0) FROM step_metrics WHERE run_id = ?", (run_id,)
        ).fetchone()
        row = self._x("SELECT manifest FROM runs WHERE run_id = ?", (run_id,)).fetchone()
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

    def run_manifest(self, run_id: str) -> common_pb2.RunManifest | None:
        """The run's manifest, if one was registered."""
        with self._lock:
            row = self._x("SELECT manifest FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return common_pb2.RunManifest.FromString(bytes(row[0])) if row and row[0] is not None else None

    def unpublished_groups(self) -> list[CompletedGroup]:
        """Completed groups whose GroupCompleted event is not yet confirmed published."""
        with self._lock:
            rows = self._x(
                "SELECT completed_seq, group_id, run_id, task_id, size FROM groups_"
                " WHERE completed_seq IS NOT NULL AND published = 0 ORDER BY completed_seq"
            ).fetchall()
        return [CompletedGroup(int(r[0]), r[1], r[2], r[3], int(r[4])) for r in rows]

    def mark_published(self, group_id: str) -> None:
        """Records that a group's GroupCompleted event was published."""
        with self._tx():
            self._x("UPDATE groups_ SET published = 1 WHERE group_id = ?", (group_id,))

    def count_calls(self) -> int:
        """Stored call attempts (all rollouts)."""
        with self._lock:
            return int(self._x("SELECT COUNT(*) FROM calls").fetchone()[0])

    # -- retention ----------------------------------------------------------------------------

    def delete_runs_older_than(self, cutoff_unix_s: float) -> list[str]:
        """Deletes every run whose newest rollout (or registration) is older than the cutoff.

        Returns:
            The deleted run ids.
        """
        cutoff_ns = int(cutoff_unix_s * 1e9)
        with self._tx():
            rows = self._x(
                "SELECT run_id FROM (SELECT run_id, MAX(create_time) AS newest FROM rollouts GROUP BY run_id) t"
                " WHERE newest < ?",
                (cutoff_ns,),
            ).fetchall()
            old_registered = self._x(
                "SELECT run_id FROM runs WHERE create_time < ? AND run_id NOT IN (SELECT run_id FROM rollouts)",
                (cutoff_unix_s,),
            ).fetchall()
            runs = sorted({r[0] for r in rows} | {r[0] for r in old_registered})
            for run_id in runs:
                for table in ("calls", "samples", "rollouts", "groups_", "tasks", "runs", "step_metrics"):
                    self._x(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self._x("DELETE FROM events_seen WHERE seen_at < ?", (cutoff_unix_s,))
        for run_id in runs:
            log.info("retention.deleted_run", run_id=run_id)
        return runs


class _SqlProjectionStore:
    """:class:`~..domain.ports.ProjectionStore` in SQL; its statements run in the caller's transaction."""

    def __init__(self, repo: SqlRepository) -> None:
        self._repo = repo
        self._x = repo._x

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
        larger = "GREATEST" if self._repo.postgres else "MAX"
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
            " base_attempt, prefix_len, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
                stored.data,
            ),
        )
        return bool(cur.rowcount)

    def call_views(self, rollout_id: str) -> list[wire.CallView]:
        return self._repo._load_calls(rollout_id)

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


class _ExplicitTx:
    """A connection in autocommit mode with explicit BEGIN/COMMIT/ROLLBACK.

    Reads outside a transaction then see the latest committed state and never
    leave a transaction open; writes group into :meth:`SqlRepository._tx`.
    """

    def __init__(self, conn: Any) -> None:
        self._c = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._c.execute(sql, params)

    def commit(self) -> None:
        self._c.execute("COMMIT")

    def rollback(self) -> None:
        self._c.execute("ROLLBACK")

    def close(self) -> None:
        self._c.close()

    def broken(self) -> bool:
        """Whether the connection was lost (a PostgreSQL server restart, a failover, a kill)."""
        return bool(getattr(self._c, "broken", False) or getattr(self._c, "closed", False))
