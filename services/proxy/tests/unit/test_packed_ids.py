"""Prompts travel as packed varint bytes: the hand-built messages parse exactly as protobuf's own."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import cast

from record_builders import coded_against, make_record

from openforge.common.v1 import common_pb2
from openforge.inference.v1 import inference_pb2
from openforge.proxy.v1 import events_pb2
from openforge_core.events import EventBus
from openforge_core.record_delta import expand_records
from openforge_proxy.adapters.inference import generate_request_bytes
from openforge_proxy.adapters.publisher import NatsRecorder, event_bytes, record_proto
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.engine import Sampling
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import failed_record
from openforge_proxy.domain.scrub import scrub_json_bytes
from openforge_proxy.domain.splice_plan import BreakCause, Span, SpliceReport
from openforge_proxy.domain.tokens import PackedIds, ids_array, pack_ids

IDS = [0, 1, 127, 128, 16383, 16384, 2_097_151, 2_097_152, 151_643, *random.Random(0).choices(range(200_000), k=500)]


def _packed(ids: list[int]) -> PackedIds:
    return PackedIds(ids_array(ids), pack_ids(ids))


def test_pack_ids_is_protobufs_packed_encoding() -> None:
    wire = common_pb2.CallRecord(prompt_token_ids=IDS).SerializeToString()
    payload = pack_ids(IDS)
    assert wire.endswith(payload) and len(wire) - len(payload) <= 4
    assert pack_ids([]) == b""


def test_generate_request_bytes_parse_as_the_protobuf_request() -> None:
    sampling = Sampling(max_tokens=7, temperature=0.5, stop_token_ids=(3,))
    got = inference_pb2.GenerateRequest.FromString(generate_request_bytes("r1", _packed(IDS), sampling))
    assert got.request_id == "r1" and list(got.prompt_token_ids) == IDS
    assert got.sampling.max_tokens == 7 and got.sampling.temperature == 0.5 and list(got.sampling.stop_token_ids) == [3]
    empty = inference_pb2.GenerateRequest.FromString(generate_request_bytes("r2", _packed([]), sampling))
    assert list(empty.prompt_token_ids) == []


def test_event_bytes_parse_as_the_protobuf_event() -> None:
    data = make_record(
        prompt=IDS,
        attempt=2,
        wire_api=WireApi.OPENAI_CHAT,
        request_headers={"h": "v"},
        logprobs=[-0.5, -0.25],
        response_body=b'data: {"x":1}\n\n',
    )
    got = events_pb2.CallRecorded.FromString(event_bytes(data))
    want = events_pb2.CallRecorded(event_id=data.event_id, record=record_proto(data))
    assert got == want
    assert got.record.response_body == data.response_body and got.record.request_json == data.request_json
    data.response_body = b""  # an empty field is left out, as protobuf leaves it out
    raw = event_bytes(data)
    assert events_pb2.CallRecorded.FromString(raw) == events_pb2.CallRecorded(
        event_id=data.event_id, record=record_proto(data)
    )
    assert len(raw) == events_pb2.CallRecorded(event_id=data.event_id, record=record_proto(data)).ByteSize()
    assert list(got.record.prompt_token_ids) == IDS and list(got.record.completion_token_ids) == [5, 6]
    # a report with spans, notes and a cause; serialized twice (the second time from the span memo)
    reused = [Span(0, 3, "call0001-abc"), Span(5, 9, "call0002-def")]
    data.splice = SpliceReport(
        reused=reused,
        rendered=[Span(3, 5), Span(9, 12)],
        break_cause=BreakCause.TEMPLATE_DRIFT,
        break_detail="at 7",
        notes=["kept 1"],
        extends_call_id="call0002-def",
    )
    for _ in range(2):
        raw = event_bytes(data)
        want = events_pb2.CallRecorded(event_id=data.event_id, record=record_proto(data))
        assert events_pb2.CallRecorded.FromString(raw) == want
        assert len(raw) == want.ByteSize()
    assert [s.source_call_id for s in events_pb2.CallRecorded.FromString(raw).record.splice.reused] == [
        "call0001-abc",
        "call0002-def",
    ]
    data.splice = SpliceReport(reused=[*reused, Span(12, 14, "call0003-ghi")])  # shares two span objects
    assert events_pb2.CallRecorded.FromString(event_bytes(data)) == events_pb2.CallRecorded(
        event_id=data.event_id, record=record_proto(data)
    )


def test_a_failed_calls_event_carries_its_error_and_attempts_and_no_ids() -> None:
    data = failed_record(
        rollout_id="ro",
        run_id="run",
        rollout_attempt=2,
        call_id="call0003-abc",
        attempt=3,
        wire_api=WireApi.OPENAI_RESPONSES,
        model="m",
        stream=True,
        sampling=Sampling(max_tokens=9),
        request_headers={"h": "v"},
        error="inference: UNAVAILABLE",
        http_status=200,
        finish=Finish.ERROR,
        receive_time=1.5,
        total_s=0.25,
    )
    raw = event_bytes(data)
    got = events_pb2.CallRecorded.FromString(raw).record
    assert got == record_proto(data) and len(raw) < 200
    assert (got.rollout_attempt, got.attempt, got.error) == (2, 3, "inference: UNAVAILABLE")
    assert got.finish_reason == common_pb2.FINISH_REASON_ERROR and got.http_status == 200
    assert not got.prompt_token_ids and not got.completion_token_ids and not got.request_json
    assert events_pb2.CallRecorded.FromString(raw).event_id == "ro/call0003-abc/3"


def test_event_bytes_against_a_base_rebuild_the_full_event() -> None:
    """A record with a base is sent as its new part (RecordDelta); rebuilt, it is the full event."""
    turns = [{"role": "user", "content": f"turn {i} " + "x" * 400} for i in range(40)]
    prompt0 = IDS * 4
    first = make_record(
        prompt=prompt0,
        completion=[5, 6, 7],
        request_json=json.dumps({"messages": turns[:39], "system": "s" * 3000}).encode(),
        canonical_json=json.dumps({"messages": turns[:39]}).encode(),
    )
    second = dataclasses.replace(
        first,
        call_id="call0002-def",
        request_json=json.dumps({"messages": turns, "system": "s" * 3000}).encode(),
        canonical_json=json.dumps({"messages": turns}).encode(),
        prompt=_packed([*prompt0, 5, 6, 9000, 9001]),  # re-tokenized at the seam: 7 became 9000
        splice=SpliceReport(reused=[Span(0, len(prompt0), "call0001-abc")], extends_call_id="call0001-abc"),
    )
    second = coded_against(second, first.as_base())
    sent = event_bytes(second)
    full = events_pb2.CallRecorded(event_id=second.event_id, record=record_proto(second))
    assert len(sent) < full.ByteSize() // 10
    got = events_pb2.CallRecorded.FromString(sent)
    assert got.record.delta.base_call_id == "call0001-abc" and got.record.delta.base_attempt == 1
    assert got.record.delta.prompt_prefix_tokens == len(prompt0) + 2
    assert list(got.record.prompt_token_ids) == [9000, 9001]
    first_record = events_pb2.CallRecorded.FromString(event_bytes(first)).record
    assert not first_record.HasField("delta")
    assert expand_records([first_record, got.record]) == [record_proto(first), full.record]
    # the same fields encoded ahead (while the engine generates), as the handler passes them
    ahead = NatsRecorder(cast(EventBus, None)).encode_parts(
        second.prompt, second.request_json, second.canonical_json, second.splice, second.cut
    )
    assert event_bytes(dataclasses.replace(second, parts=ahead)) == sent
    full_ahead = NatsRecorder(cast(EventBus, None)).encode_parts(
        first.prompt, first.request_json, first.canonical_json, first.splice, None
    )
    assert event_bytes(dataclasses.replace(first, parts=full_ahead)) == event_bytes(first)


def test_scrub_replaces_identifier_values_only() -> None:
    raw = (
        b'{"metadata":{"user_id":"{\\"device_id\\":\\"abc\\",\\"account_uuid\\":\\"u-1\\"}"},'
        b'"x":"host=box1 | os=linux","ghost=":"keep","deviceId" : "d2","no_device_id":"keep"}'
    )
    out = scrub_json_bytes(raw)
    assert b"abc" not in out and b"u-1" not in out and b"box1" not in out and b"d2" not in out
    assert out.count(b"<scrubbed>") == 4 and b'"ghost=":"keep"' in out and b'"no_device_id":"keep"' in out
    assert scrub_json_bytes(b'{"plain":"text"}') == b'{"plain":"text"}'
