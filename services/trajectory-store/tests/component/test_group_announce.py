"""A completed group whose announcement failed is announced again, without waiting for a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from google.protobuf.message import Message
from store_builders import conversation, finished, make_rollout, recorded, submitted

from openforge.common.v1 import common_pb2
from openforge_core.events import Delivery, EventBus
from openforge_trajectory_store.adapters.consumer import GROUP_COMPLETED, EventIngestor
from openforge_trajectory_store.adapters.sql import SqlRepository


class FlakyBus:
    """A fake event bus (a test double, no NATS): its first ``fail`` publishes time out."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.published: list[tuple[str, str]] = []

    async def publish(self, subject: str, message: Message, *, event_id: str) -> bool:
        if self.fail:
            self.fail -= 1
            raise TimeoutError("no acknowledgement")
        self.published.append((subject, event_id))
        return True


async def test_a_failed_group_announcement_is_retried_until_it_lands(tmp_path: Path) -> None:
    repo = SqlRepository(f"sqlite:///{tmp_path / 'store.db'}")
    repo.open()
    bus = FlakyBus(fail=2)
    groups: list[int] = []
    ingestor = EventIngestor(repo, cast(EventBus, bus), lambda: groups.append(1))
    r = make_rollout("r0")
    done = common_pb2.Rollout()
    done.CopyFrom(r)
    done.status = common_pb2.ROLLOUT_STATUS_SUCCEEDED
    done.reward = 1.0
    events: list[tuple[str, Any]] = [submitted(r), *[recorded(c) for c in conversation("r0", 2)], finished(done, 2)]
    batch = [
        (e, Delivery(subject="s", event_id=eid, num_delivered=1, stream_sequence=i))
        for i, (eid, e) in enumerate(events)
    ]
    try:
        await ingestor.handle_batch(batch)  # commits; the announcement fails, and is not the batch's fault
        assert groups == [1] and bus.published == []
        assert [g.group_id for g in repo.unpublished_groups()] == ["g1"]
        for _ in range(60):  # retried after 1 s, then 2 s
            if bus.published:
                break
            await asyncio.sleep(0.1)
        assert bus.published == [(GROUP_COMPLETED, "group/g1")]
        assert repo.unpublished_groups() == []
    finally:
        repo.close()
