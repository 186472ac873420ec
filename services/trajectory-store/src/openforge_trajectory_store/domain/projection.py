"""The event projection: ingested events → stored rollouts, calls, samples and completed groups.

Pure rules over a :class:`~.ports.ProjectionStore`. The adapter runs :meth:`Projection.apply`
inside one transaction per batch and calls :meth:`Projection.committed` after the commit; the
caller acks the batch's events only after that, so an event is never acked before its effects
are committed. Each event id is marked seen in the same transaction as its effects, which makes
ingestion idempotent.

Per batch:

1. every event not seen before is applied: rollouts upserted (a status never goes back,
   :func:`~.query.status_rank`), groups, run manifests and step metrics stored, call records
   rebuilt from their delta (``RecordDelta``), checked and stored with their prompt as a delta
   on the rollout's previous call (:mod:`.tokens`);
2. every rollout the batch ended or gave a call is assembled (:mod:`.assembly`) once it is
   terminal and every call it counted is stored;
3. every group the batch touched completes once all its rollouts are assembled, taking the
   next position in the completion order.

The projection keeps in memory, per rollout, the latest call's token sequence (the prompt base
of the next call) and the latest calls' full parts (the base a ``RecordDelta`` is expanded
against); both change only after a commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
from google.protobuf.message import Message

from openforge.common.v1 import common_pb2
from openforge.orchestrator.v1 import events_pb2 as orch_events
from openforge.proxy.v1 import events_pb2 as proxy_events
from openforge.trainer.v1 import events_pb2 as trainer_events
from openforge_core import record_delta
from openforge_core.errors import InvalidArgument, Unavailable
from openforge_trajectory_store.domain import tokens, wire
from openforge_trajectory_store.domain.assembly import assemble, last_rollout_attempt
from openforge_trajectory_store.domain.lru import CostLru
from openforge_trajectory_store.domain.ports import CompletedGroup, Event, IngestResult, ProjectionStore
from openforge_trajectory_store.domain.query import status_rank

log = structlog.get_logger(__name__)

_TERMINAL = 2  # status_rank of an ended rollout
_RECORD = proxy_events.CallRecorded.RECORD_FIELD_NUMBER
#: (rollout id, call id, attempt) of a stored call.
FullKey = tuple[str, str, int]
#: A rollout's prompt base: (call id, attempt) and packed prompt + completion of its latest call.
PromptBase = tuple[tokens.CallKey, bytes]
#: Bytes a kept delta base costs beyond its three byte strings (key, objects, dict slot).
ENTRY_OVERHEAD = 512


class BaseNotStored(Unavailable):
    """A call record coded against a base (``RecordDelta``) that is not stored yet.

    The proxy publishes a base before any record coded against it, so this is a
    redelivery out of stream order; retrying later succeeds.
    """


@dataclass
class AppliedBatch:
    """A batch applied inside its transaction, not yet committed.

    Attributes:
        now: When it was applied, Unix seconds.
        result: What it changed.
        rollouts: Rollouts it ended or gave a call (to assemble), in order, with repeats.
        groups: Groups it created or whose rollouts it assembled (to complete).
        prompt_bases: rollout id → its newest call's prompt base, kept after the commit.
        full_bases: Full parts of the calls it stored, kept after the commit.
        used_bases: Delta bases its records were expanded against, dropped after the commit (the
            record coded against each is kept instead).
    """

    now: float
    result: IngestResult = field(default_factory=IngestResult)
    rollouts: list[str] = field(default_factory=list)
    groups: set[str] = field(default_factory=set)
    prompt_bases: dict[str, PromptBase] = field(default_factory=dict)
    full_bases: dict[FullKey, record_delta.FullParts] = field(default_factory=dict)
    used_bases: set[FullKey] = field(default_factory=set)


class Projection:
    """Applies ingested events to a :class:`~.ports.ProjectionStore`.

    Args:
        base_cache: Rollouts whose last call sequence is kept in memory to delta-encode the next
            call's prompt.
        delta_base_bytes: Memory for the latest calls' request JSON, canonical JSON and token
            sequence, kept to rebuild the proxy's records coded against them (``RecordDelta``),
            least recently used first out; a miss reads the rollout's calls back from the store.
        clock: Unix seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        base_cache: int = 4096,
        delta_base_bytes: int = 256 * 2**20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._prompt_bases: CostLru[str, PromptBase] = CostLru(base_cache, lambda _: 1)
        self._full_bases: CostLru[FullKey, record_delta.FullParts] = CostLru(
            delta_base_bytes, lambda full: full.size + ENTRY_OVERHEAD
        )
        self.delta_base_misses = 0  # deltas whose base was read back from the store

    def apply(self, store: ProjectionStore, events: Sequence[Event]) -> AppliedBatch:
        """Applies a batch of events; call inside the batch's transaction.

        Args:
            store: The storage operations, all in one transaction.
            events: (event id, event message[, the event's wire bytes]) for ``RolloutsSubmitted``,
                ``RolloutStarted``, ``RolloutFinished``, ``RunRegistered``, ``CallRecorded`` or
                the trainer's ``StepCompleted``. With the wire bytes a call record is stored
                without being serialized again.

        Returns:
            The applied batch, for :meth:`committed` once the transaction committed.

        Raises:
            InvalidArgument: An event without an id, one the store does not record, or a
                malformed one (e.g. logprobs that do not match the sampled tokens).
            BaseNotStored: A call record coded as a delta whose base is not stored yet
                (transient: its event is redelivered).
        """
        batch = AppliedBatch(self._clock())
        for item in events:
            event_id, event = item[0], item[1]
            if not event_id:
                raise InvalidArgument.field("event_id", "events need an id")
            if not store.mark_seen(event_id, batch.now):
                batch.result.duplicates += 1
                continue
            batch.result.applied += 1
            self._apply_event(store, batch, event, item[2] if len(item) > 2 else None)
        for rollout_id in dict.fromkeys(batch.rollouts):
            group_id = _maybe_assemble(store, rollout_id)
            if group_id is not None:
                batch.groups.add(group_id)
        for group_id in sorted(batch.groups):
            done = _maybe_complete_group(store, group_id)
            if done is not None:
                batch.result.completed_groups.append(done)
        return batch

    def committed(self, batch: AppliedBatch) -> IngestResult:
        """Keeps the bases of a committed batch in memory; returns what the batch changed."""
        for rollout_id, base in batch.prompt_bases.items():
            self._prompt_bases.put(rollout_id, base)
        for key in batch.used_bases:
            self._full_bases.pop(key)
        for key, full in batch.full_bases.items():
            self._full_bases.put(key, full)
        return batch.result

    def _apply_event(self, store: ProjectionStore, batch: AppliedBatch, event: Message, raw: bytes | None) -> None:
        if isinstance(event, orch_events.RolloutsSubmitted):
            sizes: dict[str, int] = {}
            for r in event.rollouts:
                sizes[r.group_id] = sizes.get(r.group_id, 0) + 1
            for r in event.rollouts:
                _put_rollout(store, r, 0, 0, batch.now)
                store.add_group(r.group_id, r.run_id, r.task_id, sizes[r.group_id])
                batch.groups.add(r.group_id)
        elif isinstance(event, orch_events.RolloutStarted):
            _put_rollout(store, event.rollout, 0, 0, batch.now)
        elif isinstance(event, orch_events.RolloutFinished):
            _put_rollout(store, event.rollout, event.calls, event.attempts, batch.now)
            batch.rollouts.append(event.rollout.rollout_id)
        elif isinstance(event, orch_events.RunRegistered):
            store.put_run(event.manifest, batch.now)
        elif isinstance(event, trainer_events.StepCompleted):
            store.put_step(event)
        elif isinstance(event, proxy_events.CallRecorded):
            self._record_call(store, batch, event.record, _record_bytes(raw) if raw else None)
            batch.rollouts.append(event.record.rollout_id)
        else:
            raise InvalidArgument(f"the store does not record {type(event).__name__}", reason="UNKNOWN_EVENT")

    def _record_call(
        self, store: ProjectionStore, batch: AppliedBatch, rec: common_pb2.CallRecord, data: bytes | None
    ) -> None:
        """Checks one call record, rebuilds it if delta-coded, and stores it against its rollout's prompt base."""
        if not rec.rollout_id or not rec.call_id:
            raise InvalidArgument("call record without rollout_id or call_id", reason="BAD_CALL_RECORD")
        if data is None:
            data = rec.SerializeToString()
        if rec.HasField("delta"):
            data = self._expand(store, batch, rec, data)
        n = len(rec.completion_token_ids)
        if len(rec.completion_logprobs) not in (0, n) or len(rec.completion_policy_versions) not in (0, n):
            raise InvalidArgument(
                f"call {rec.call_id}: {n} sampled tokens, {len(rec.completion_logprobs)} logprobs, "
                f"{len(rec.completion_policy_versions)} policy versions",
                reason="BAD_CALL_RECORD",
            )
        base = batch.prompt_bases.get(rec.rollout_id) or self._prompt_bases.get(rec.rollout_id)
        stored = tokens.encode(data, base)
        if store.insert_call(rec, stored) and stored.sequence:  # a failed call (no ids) is no base for the next
            batch.prompt_bases[rec.rollout_id] = (stored.key, stored.sequence)
            batch.full_bases[(rec.rollout_id, *stored.key)] = record_delta.FullParts.of(data, stored.sequence)

    def _expand(self, store: ProjectionStore, batch: AppliedBatch, rec: common_pb2.CallRecord, data: bytes) -> bytes:
        """The full record of one coded against an earlier call of its rollout (``RecordDelta``)."""
        d = rec.delta
        if not d.base_call_id or (d.base_call_id, d.base_attempt) == (rec.call_id, rec.attempt):
            raise InvalidArgument(
                f"call {rec.call_id}: a delta must name an earlier call as its base", reason="BAD_CALL_RECORD"
            )
        key = (rec.rollout_id, d.base_call_id, d.base_attempt)
        base = batch.full_bases.get(key) or self._full_bases.get(key)
        if base is None:  # evicted, or the store restarted: read the rollout back (rare)
            self.delta_base_misses += 1
            for view in store.call_views(rec.rollout_id):
                if view.key == key[1:]:
                    base = record_delta.FullParts.of(view.data)
                    self._full_bases.put(key, base)
                    break
        if base is None:
            raise BaseNotStored(
                f"call {rec.call_id} attempt {rec.attempt} of rollout {rec.rollout_id} is coded against "
                f"call {key[1]} attempt {key[2]}, which is not stored yet",
                reason="BASE_NOT_STORED",
            )
        batch.used_bases.add(key)
        try:
            return record_delta.expand_record(data, base)
        except ValueError as exc:
            raise InvalidArgument(
                f"call {rec.call_id}: its delta does not fit its base: {exc}", reason="BAD_CALL_RECORD"
            ) from None


def _put_rollout(store: ProjectionStore, r: common_pb2.Rollout, expected_calls: int, attempts: int, now: float) -> None:
    """Stores a rollout, or replaces the stored one unless that one is further along."""
    row = store.rollout_row(r.rollout_id)
    if row is None:
        store.insert_rollout(r, expected_calls, attempts, now)
    elif status_rank(r.status) >= status_rank(row.status):
        store.update_rollout(r, expected_calls, attempts, now)


def _maybe_assemble(store: ProjectionStore, rollout_id: str) -> str | None:
    """Assembles an ended rollout whose counted calls are all stored; returns its group id if it did."""
    row = store.rollout_row(rollout_id)
    if row is None or status_rank(row.status) < _TERMINAL:
        return None
    group = store.group_row(row.group_id)
    if group is not None and group.completed_seq is not None:
        if row.assembled:
            log.warning("call.after_group_completed", rollout_id=rollout_id, group_id=row.group_id)
        return None
    # the calls of the rollout's last attempt (every call when the attempts are not known)
    distinct = store.distinct_calls(rollout_id, row.attempts)
    if distinct < row.expected_calls:
        return None  # waiting for call events still in flight
    rollout = common_pb2.Rollout.FromString(row.data)
    samples = assemble(rollout, last_rollout_attempt(store.call_views(rollout_id), row.attempts))
    store.put_samples(rollout_id, row.run_id, samples)
    log.info("rollout.assembled", rollout_id=rollout_id, samples=len(samples), calls=distinct)
    return row.group_id


def _maybe_complete_group(store: ProjectionStore, group_id: str) -> CompletedGroup | None:
    """Completes a group whose rollouts are all assembled."""
    group = store.group_row(group_id)
    if group is None or group.completed_seq is not None:
        return None
    if store.assembled_rollouts(group_id) < group.size:
        return None
    seq = store.complete_group(group_id)
    log.info("group.completed", group_id=group_id, seq=seq, rollouts=group.size)
    return CompletedGroup(seq, group_id, group.run_id, group.task_id, group.size)


def _record_bytes(event: bytes) -> bytes:
    """The serialized ``CallRecord`` inside a serialized ``CallRecorded``."""
    for num, wt, start, end in wire.fields(event):
        if num == _RECORD and wt == wire.LEN:
            return event[start:end]
    return b""
