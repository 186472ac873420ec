"""Trajectory store settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from openforge_core.settings import ServiceSettings


class DatabaseSettings(BaseModel):
    """Where the record is kept.

    Attributes:
        dsn: ``sqlite:///path/trajectories.db`` (embedded default; the file is
            created owner-only) or ``postgresql://user@host:5432/db``
            (``OPENFORGE_STORE__DSN``).
        retention_days: Runs whose newest rollout is older than this are
            deleted; 0 keeps everything (``OPENFORGE_STORE__RETENTION_DAYS``).
        retention_check_s: Seconds between retention sweeps.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dsn: str = "sqlite:///openforge-trajectories.db"
    retention_days: float = Field(default=0.0, ge=0)
    retention_check_s: float = Field(default=3600.0, gt=0)


class StoreSettings(ServiceSettings):
    """Settings of the trajectory store.

    Attributes:
        store: Database and retention.
        consumer_name: Durable JetStream consumer name prefix; the position in
            each stream survives restarts under this name.
        ingest_batch: Events fetched and committed per transaction.
        export_dir: The one folder ``Export`` writes into (created owner-only on first use);
            callers name a file in it, never a path (``OPENFORGE_EXPORT_DIR``). Unset: ``exports``
            next to the SQLite database file, or in the working folder with PostgreSQL.
    """

    service_name: ClassVar[str] = "trajectory-store"

    store: DatabaseSettings = DatabaseSettings()
    consumer_name: str = "trajectory-store"
    ingest_batch: int = Field(default=256, ge=1, le=4096)
    export_dir: Path | None = None

    def exports_folder(self) -> Path:
        """Where exports are written: ``export_dir``, or its default (see the class docstring)."""
        if self.export_dir is not None:
            return self.export_dir
        dsn = self.store.dsn
        if dsn.startswith(("postgresql://", "postgres://")):
            return Path("exports").absolute()
        return Path(dsn.removeprefix("sqlite:///").removeprefix("sqlite://")).absolute().parent / "exports"
