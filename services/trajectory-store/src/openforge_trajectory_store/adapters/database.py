"""The store's SQL database: schema, migrations and one connection per dialect (SQLite, PostgreSQL).

Schema (versioned; :data:`MIGRATIONS` are applied in order and recorded in
``schema_version``):

* ``events_seen``: every applied event id, when it was applied (ingestion is idempotent).
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
* ``calls.role``, ``calls.lineage_id``: the call's ``CallRole`` number (0: recorded before roles,
  read as main) and lineage (schema version 4).

Statements are written with ``?`` placeholders and SQL both dialects accept; :class:`Database`
turns the placeholders into PostgreSQL's.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import structlog

from openforge_core.errors import FailedPrecondition

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
    [
        "ALTER TABLE calls ADD COLUMN role INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE calls ADD COLUMN lineage_id TEXT NOT NULL DEFAULT ''",
    ],
]


class _Conn(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...
    def broken(self) -> bool: ...


class Database:
    """One connection to SQLite (embedded default, WAL) or PostgreSQL, shared by the store's threads.

    Statements outside :meth:`transaction` autocommit and see the latest committed state; hold
    :attr:`lock` around several reads that must see one state (no batch commits between them).

    Args:
        dsn: ``sqlite:///path/to/file.db`` (or a plain path) for SQLite;
            ``postgresql://...`` for PostgreSQL.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.postgres = dsn.startswith(("postgresql://", "postgres://"))
        #: SQL's function for the larger of two values in this dialect.
        self.greatest = "GREATEST" if self.postgres else "MAX"
        self.lock = threading.RLock()
        self._conn: _Conn | None = None
        self._in_tx = False

    def open(self) -> None:
        """Connects and applies pending migrations.

        Raises:
            FailedPrecondition: The database cannot be opened.
        """
        try:
            self._conn = self._connect_postgres() if self.postgres else self._connect_sqlite()
        except Exception as exc:
            raise FailedPrecondition(f"cannot open the store database: {exc}", reason="DB_UNAVAILABLE") from exc
        self._migrate()

    def close(self) -> None:
        """Closes the connection."""
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Runs one statement (``?`` placeholders); returns the DB-API cursor."""
        # inside a transaction never on a new connection: its statements would commit one by one
        conn = self._conn if self._in_tx else self._live()
        assert conn is not None, "open() first"
        return conn.execute(self._sql(sql), params)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Holds :attr:`lock` and runs the block's statements in one transaction: committed when
        the block returns, rolled back when it raises."""
        with self.lock:
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

    def schema_version(self) -> int:
        """The applied schema version."""
        with self.lock:
            return int(self.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def _connect_sqlite(self) -> _Conn:
        path = Path(self.dsn.removeprefix("sqlite:///").removeprefix("sqlite://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)  # owner-only
        os.close(fd)
        os.chmod(path, 0o600)
        old = os.umask(0o077)  # the -wal and -shm files are owner-only too
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        finally:
            os.umask(old)
        return _ExplicitTx(conn)

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

    def _migrate(self) -> None:
        blob, serial = ("BYTEA", "BIGSERIAL PRIMARY KEY") if self.postgres else ("BLOB", "INTEGER PRIMARY KEY")
        with self.transaction():
            self.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            current = self.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            for version, statements in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for stmt in statements:
                    self.execute(stmt.format(blob=blob, serial=serial))
                self.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                log.info("store.migrated", version=version, backend="postgresql" if self.postgres else "sqlite")


class _ExplicitTx:
    """A connection in autocommit mode with explicit BEGIN/COMMIT/ROLLBACK.

    Reads outside a transaction then see the latest committed state and never
    leave a transaction open; writes group into :meth:`Database.transaction`.
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
