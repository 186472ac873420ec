"""The repository on each backend: SQLite (a file in tmp) and PostgreSQL (a fresh schema)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from openforge_trajectory_store.adapters.sql import SqlRepository


@pytest.fixture(params=["sqlite", "postgresql"])
def repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlRepository]:
    """A migrated repository on SQLite (a file in tmp) or PostgreSQL (a fresh schema)."""
    if request.param == "sqlite":
        r = SqlRepository(f"sqlite:///{tmp_path / 'db' / 'store.db'}")
        r.open()
        yield r
        r.close()
        return
    yield from _postgres_repo(request.getfixturevalue("postgres_dsn"))


@pytest.fixture
def pg_repo(postgres_dsn: str) -> Iterator[SqlRepository]:
    """A migrated repository on PostgreSQL (a fresh schema)."""
    yield from _postgres_repo(postgres_dsn)


def _postgres_repo(dsn: str) -> Iterator[SqlRepository]:
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    r = SqlRepository(f"{dsn}{sep}options=-csearch_path%3D{schema}")
    r.open()
    yield r
    r.close()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
