"""Trajectory store benchmark: ingest rate of ~30k-token calls and assembly time.

Prints, in one run:

* ingest rate (calls/s) of ``CallRecorded`` events — decoded from their wire
  bytes and committed in batches, as the consumer does — into SQLite and,
  when ``OPENFORGE_TEST_POSTGRES_DSN`` is set, PostgreSQL;
* the baseline measured in the same run: inserting the same records' raw bytes
  into a bare SQLite table (no decoding, no delta encoding, no bookkeeping);
* the ingest rate of the same calls coded as the proxy publishes them, each against
  the rollout's previous call (``RecordDelta``: the store rebuilds the full record);
* the time to assemble one 100-call rollout: the pure assembly, and the whole
  path from the database (load, rebuild prompts, assemble, store samples).

Calls look like a Claude Code session: a ~20k-token first prompt growing by a
tool result and a completion each turn to ~30k tokens at call 100, token ids up
to 150k (3-byte varints).

Usage: ``python tools/bench/store_bench.py [--rollouts 20] [--batch 256]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2 as proxy
from openforge.trajectory.v1 import trajectory_pb2
from openforge_core.record_delta import FullParts, cut_record
from openforge_trajectory_store.adapters.sql import SqlRepository
from openforge_trajectory_store.domain.assembly import assemble

TURNS = 100


def make_rollout_calls(rollout_id: str, rng: random.Random) -> list[bytes]:
    """Serialized CallRecorded events of one 100-call rollout."""
    prompt = [rng.randrange(1, 150_000) for _ in range(20_000)]
    out = []
    for i in range(TURNS):
        completion = [rng.randrange(1, 150_000) for _ in range(40)]
        rec = common_pb2.CallRecord(
            rollout_id=rollout_id,
            call_id=f"c{i:03d}",
            attempt=1,
            run_id="bench",
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            completion_logprobs=[-0.5] * len(completion),
            completion_policy_versions=[1] * len(completion),
            finish_reason=common_pb2.FINISH_REASON_STOP,
        )
        rec.receive_time.FromNanoseconds(1_000_000_000 * (i + 1))
        eid = f"{rollout_id}/{rec.call_id}/1"
        out.append(proxy.CallRecorded(event_id=eid, record=rec).SerializeToString())
        prompt = prompt + completion + [rng.randrange(1, 150_000) for _ in range(60)]
    return out


def delta_coded(events: list[bytes]) -> list[bytes]:
    """The events as the proxy publishes them: each call coded against its rollout's previous one."""
    last: dict[str, tuple[str, int, FullParts]] = {}
    out = []
    for b in events:
        ev = proxy.CallRecorded.FromString(b)
        rec = ev.record
        data = rec.SerializeToString()
        prev = last.get(rec.rollout_id)
        coded = data if prev is None else cut_record(data, prev[2].as_base(prev[0], prev[1]))
        last[rec.rollout_id] = (rec.call_id, rec.attempt, FullParts.of(data))
        out.append(
            proxy.CallRecorded(event_id=ev.event_id, record=common_pb2.CallRecord.FromString(coded)).SerializeToString()
        )
    return out


def ingest_rate(repo: SqlRepository, events: list[bytes], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(events), batch):
        # As the consumer does: each event is decoded (validated) and its wire bytes passed along.
        chunk = [(proxy.CallRecorded.FromString(b), b) for b in events[i : i + batch]]
        repo.ingest([(e.event_id, e, b) for e, b in chunk])
    return len(events) / (time.perf_counter() - start)


def baseline_rate(path: Path, events: list[bytes], batch: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    start = time.perf_counter()
    for i in range(0, len(events), batch):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO raw (data) VALUES (?)", [(b,) for b in events[i : i + batch]])
        conn.execute("COMMIT")
    rate = len(events) / (time.perf_counter() - start)
    conn.close()
    return rate


def assembly_times(repo: SqlRepository, rollout_id: str, repeats: int = 5) -> tuple[float, float]:
    """(pure assembly ms, load + rebuild prompts + assemble from the database ms), medians."""
    rollout = common_pb2.Rollout(
        rollout_id=rollout_id,
        run_id="bench",
        group_id="g-" + rollout_id,
        status=common_pb2.ROLLOUT_STATUS_SUCCEEDED,
        reward=1.0,
    )
    views = repo.call_views(rollout_id)
    pure, full = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        samples = assemble(rollout, views)
        pure.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        samples = assemble(rollout, repo.call_views(rollout_id))
        full.append((time.perf_counter() - t) * 1e3)
    parsed = trajectory_pb2.Sample.FromString(samples[0])
    assert len(samples) == 1 and len(parsed.call_ids) == TURNS and sum(parsed.loss_mask) == TURNS * 40
    return statistics.median(pure), statistics.median(full)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts of 100 calls each")
    parser.add_argument("--batch", type=int, default=256, help="events per transaction")
    ns = parser.parse_args()
    rng = random.Random(0)
    events: list[bytes] = []
    for i in range(ns.rollouts):
        events += make_rollout_calls(f"r{i}", rng)
    rng.shuffle(events)  # rollouts interleave on the wire
    # ...but each rollout's calls keep their order, as one proxy session publishes them in order
    events.sort(key=lambda b: proxy.CallRecorded.FromString(b).record.call_id)
    mb = sum(len(b) for b in events) / 1e6
    print(f"{len(events)} calls, {mb:.0f} MB on the wire ({mb * 1e3 / len(events):.0f} KB/call), batch {ns.batch}")
    print(f"{'backend':<34}{'calls/s':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_rate(Path(tmp) / "raw.db", events, ns.batch)
        print(f"{'baseline: raw blobs into SQLite':<34}{base:>10.0f}")
        repo = SqlRepository(f"sqlite:///{Path(tmp) / 'store.db'}")
        repo.open()
        rate = ingest_rate(repo, events, ns.batch)
        size = sum(f.stat().st_size for f in Path(tmp).glob("store.db*")) / 1e6
        print(f"{'store on SQLite':<34}{rate:>10.0f}   ({rate / base:.2f}x baseline, {size:.0f} MB on disk)")
        pure, full = assembly_times(repo, "r0")
        repo.close()
        # the same calls as the proxy publishes them: each coded against the previous (RecordDelta)
        coded = delta_coded(events)
        kb = sum(len(b) for b in coded) / 1e3 / len(coded)
        repo = SqlRepository(f"sqlite:///{Path(tmp) / 'store-delta.db'}")
        repo.open()
        rate = ingest_rate(repo, coded, ns.batch)
        records = (proxy.CallRecorded.FromString(b).record for b in events)
        assert repo.calls("r0") == [r for r in records if r.rollout_id == "r0"]  # rebuilt exactly
        repo.close()
        print(f"{'store on SQLite, delta-coded':<34}{rate:>10.0f}   ({rate / base:.2f}x baseline, {kb:.1f} KB/call)")
    dsn = os.environ.get("OPENFORGE_TEST_POSTGRES_DSN")
    if dsn:
        import psycopg

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
        try:
            pg = SqlRepository(f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}")
            pg.open()
            print(f"{'store on PostgreSQL':<34}{ingest_rate(pg, events, ns.batch):>10.0f}")
            pg.close()
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")
    else:
        print("store on PostgreSQL: skipped (set OPENFORGE_TEST_POSTGRES_DSN)")
    print(f"assemble a {TURNS}-call rollout: {pure:.1f} ms (assembly), {full:.1f} ms (read from SQLite + assembly)")


if __name__ == "__main__":
    main()
