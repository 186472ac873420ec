"""Call records onto NATS JetStream as ``openforge.proxy.v1.call_recorded`` events.

The event id (``Nats-Msg-Id``) is ``<rollout_id>/<call_id>/<attempt>``, so a
re-publish is de-duplicated by JetStream and by the store. The proxy keeps no
copy: once JetStream acknowledged it, the record's memory is released.

The event is serialized here: the record without its prompt ids goes through
protobuf, the prompt's packed encoding is appended as ``prompt_token_ids``
(field 8), and the record is wrapped as ``CallRecorded.record`` (field 2) by
hand, so the prompt is never converted id by id (a valid encoding: fields may
come in any order).
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import struct_pb2
from google.protobuf.message import Message

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2
from openforge_core.events import EventBus, subject_for
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.splice import BreakCause, SpliceReport
from openforge_proxy.domain.tokens import varint

SUBJECT = subject_for("proxy", "call_recorded")

_WIRE = {
    WireApi.ANTHROPIC_MESSAGES: common_pb2.WIRE_API_ANTHROPIC_MESSAGES,
    WireApi.OPENAI_RESPONSES: common_pb2.WIRE_API_OPENAI_RESPONSES,
    WireApi.OPENAI_CHAT: common_pb2.WIRE_API_OPENAI_CHAT_COMPLETIONS,
}
_FINISH = {
    Finish.STOP: common_pb2.FINISH_REASON_STOP,
    Finish.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    Finish.ABORT: common_pb2.FINISH_REASON_ABORT,
    Finish.ERROR: common_pb2.FINISH_REASON_ERROR,
}
_BREAK = {
    BreakCause.NONE: common_pb2.BREAK_CAUSE_NONE,
    BreakCause.COMPACTION: common_pb2.BREAK_CAUSE_COMPACTION,
    BreakCause.SUB_AGENT: common_pb2.BREAK_CAUSE_SUB_AGENT,
    BreakCause.RETRY: common_pb2.BREAK_CAUSE_RETRY,
    BreakCause.TEMPLATE_DRIFT: common_pb2.BREAK_CAUSE_TEMPLATE_DRIFT,
    BreakCause.OTHER: common_pb2.BREAK_CAUSE_OTHER,
}


def splice_proto(report: SpliceReport) -> common_pb2.SpliceReport:
    """``SpliceReport`` message of a domain report."""
    return common_pb2.SpliceReport(
        reused=[
            common_pb2.SpliceSpan(start=s.start, end=s.end, source_call_id=s.source_call_id) for s in report.reused
        ],
        rendered=[common_pb2.SpliceSpan(start=s.start, end=s.end) for s in report.rendered],
        break_cause=_BREAK[report.break_cause],
        break_detail=report.break_detail,
        notes=report.notes,
        extends_call_id=report.extends_call_id,
    )


def record_proto(data: CallRecordData, *, structs: bool = False, prompt: bool = True) -> common_pb2.CallRecord:
    """``CallRecord`` message of a domain record.

    Args:
        data: The record.
        structs: Also fill the ``request`` and ``canonical_messages`` Structs
            (costly for large bodies: about 1 ms per 100 KB).
        prompt: Fill ``prompt_token_ids`` (:func:`event_bytes` appends them packed instead).
    """
    import orjson

    s = data.sampling
    sampling = common_pb2.SamplingParams(
        max_tokens=int(s.get("max_tokens", 0)), stop_token_ids=[int(i) for i in s.get("stop_token_ids", [])]
    )
    for name in ("temperature", "top_p"):
        if name in s:
            setattr(sampling, name, float(s[name]))
    if "top_k" in s:
        sampling.top_k = int(s["top_k"])
    if "seed" in s:
        sampling.seed = int(s["seed"])
    rec = common_pb2.CallRecord(
        rollout_id=data.rollout_id,
        call_id=data.call_id,
        attempt=data.attempt,
        run_id=data.run_id,
        wire_api=_WIRE[data.wire_api],
        completion_token_ids=data.completion_ids,
        completion_logprobs=data.logprobs,
        completion_policy_versions=data.policy_versions,
        sampling=sampling,
        finish_reason=_FINISH[data.finish],
        splice=splice_proto(data.splice),
        http_status=data.http_status,
        request_json=data.request_json,
        request_headers=data.request_headers,
        response_body=data.response_body,
        canonical_json=data.canonical_json,
        model=data.model,
        stream=data.stream,
    )
    if prompt:
        rec.prompt_token_ids.extend(data.prompt.ids)
    rec.receive_time.FromNanoseconds(int(data.receive_time * 1e9))
    rec.time_to_first_byte.FromNanoseconds(int(data.ttfb_s * 1e9))
    rec.total_time.FromNanoseconds(int(data.total_s * 1e9))
    if structs:
        request = struct_pb2.Struct()
        request.update(orjson.loads(data.request_json))
        rec.request.CopyFrom(request)
        rec.canonical_messages.update(orjson.loads(data.canonical_json))
    return rec


_RECORD_PROMPT_TAG = varint(8 << 3 | 2)  # CallRecord.prompt_token_ids
_EVENT_RECORD_TAG = varint(2 << 3 | 2)  # CallRecorded.record


def event_bytes(data: CallRecordData, *, structs: bool = False) -> bytes:
    """The serialized ``CallRecorded`` event of a record (equal, parsed, to one built by protobuf)."""
    record = record_proto(data, structs=structs, prompt=False).SerializeToString()
    packed = data.prompt.packed
    if packed:
        record += _RECORD_PROMPT_TAG + varint(len(packed)) + packed
    head = events_pb2.CallRecorded(event_id=data.event_id).SerializeToString()
    return head + _EVENT_RECORD_TAG + varint(len(record)) + record


class _Serialized:
    """A message already serialized, for :meth:`EventBus.publish` (which reads only these two attributes)."""

    DESCRIPTOR = events_pb2.CallRecorded.DESCRIPTOR

    def __init__(self, data: bytes) -> None:
        self._data = data

    def SerializeToString(self, **_: Any) -> bytes:
        return self._data


class NatsRecorder:
    """Publishes each record as one ``CallRecorded`` event and waits for JetStream's ack.

    Args:
        bus: The connected event bus.
        structs: Fill the Struct fields too (see :func:`record_proto`).
    """

    def __init__(self, bus: EventBus, *, structs: bool = False) -> None:
        self._bus = bus
        self._structs = structs

    async def record(self, data: CallRecordData) -> None:
        """Publishes the record (de-duplicated per event id)."""
        event = _Serialized(event_bytes(data, structs=self._structs))
        await self._bus.publish(SUBJECT, cast(Message, event), event_id=data.event_id)
