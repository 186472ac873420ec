"""Call records onto NATS JetStream as ``openforge.proxy.v1.call_recorded`` events.

The event id (``Nats-Msg-Id``) is ``<rollout_id>/<call_id>/<attempt>``, so a
re-publish is de-duplicated by JetStream and by the store. The proxy keeps no
copy: once JetStream acknowledged it, the record's memory is released.

The event is serialized here: the record's small fields go through protobuf;
the prompt's packed encoding (``prompt_token_ids``, field 8), the request body,
the response bytes and the canonical conversation (fields 19, 21, 22) are
appended as length-delimited fields, and the record is wrapped as
``CallRecorded.record`` (field 2), by hand, in one join, so the prompt is never
converted id by id and the large fields are copied once (a valid encoding:
fields may come in any order). It is published as bytes
(:meth:`EventBus.publish_bytes`). A record of a session that already has an
acknowledged record is coded against it (``RecordDelta``; the store rebuilds the
full record), so events stay a few KB however long the conversation grows.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import struct_pb2

from openforge.common.v1 import common_pb2
from openforge.proxy.v1 import events_pb2
from openforge_core.events import EventBus, MessageTooLarge, subject_for
from openforge_core.protowire import LEN
from openforge_core.record_delta import RecordCut
from openforge_proxy.domain.call_roles import CallRole
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.output import Finish
from openforge_proxy.domain.record import CallRecordData, RecordTooLarge
from openforge_proxy.domain.splice_plan import BreakCause, Span, SpliceReport
from openforge_proxy.domain.tokens import PackedIds, varint

SUBJECT = subject_for("proxy", "call_recorded")

_WIRE = {
    WireApi.ANTHROPIC_MESSAGES: common_pb2.WIRE_API_ANTHROPIC_MESSAGES,
    WireApi.OPENAI_RESPONSES: common_pb2.WIRE_API_OPENAI_RESPONSES,
    WireApi.OPENAI_CHAT: common_pb2.WIRE_API_OPENAI_CHAT_COMPLETIONS,
}
_ROLE = {
    CallRole.MAIN: common_pb2.CALL_ROLE_MAIN,
    CallRole.SUB_AGENT: common_pb2.CALL_ROLE_SUB_AGENT,
    CallRole.COMPACTION: common_pb2.CALL_ROLE_COMPACTION,
    CallRole.SIDE: common_pb2.CALL_ROLE_SIDE,
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


_REUSED_TAG = varint(common_pb2.SpliceReport.REUSED_FIELD_NUMBER << 3 | LEN)
_RENDERED_TAG = varint(common_pb2.SpliceReport.RENDERED_FIELD_NUMBER << 3 | LEN)


def _span_field(tag: bytes, span: Span) -> bytes:
    body = common_pb2.SpliceSpan(start=span.start, end=span.end, source_call_id=span.source_call_id).SerializeToString()
    return tag + varint(len(body)) + body


def _reused_field(span: Span) -> bytes:
    return _span_field(_REUSED_TAG, span)


def _rendered_field(span: Span) -> bytes:
    return _span_field(_RENDERED_TAG, span)


def splice_bytes(report: SpliceReport) -> bytes:
    """The serialized ``SpliceReport`` (equal, parsed, to :func:`splice_proto`'s).

    Each span's field bytes are serialized once per span object (a session's reports share
    their leading spans; see :meth:`Span.derived`).
    """
    tail = common_pb2.SpliceReport(
        break_cause=_BREAK[report.break_cause],
        break_detail=report.break_detail,
        notes=report.notes,
        extends_call_id=report.extends_call_id,
    ).SerializeToString()
    parts = [s.derived("record.reused", _reused_field) for s in report.reused]
    parts += [s.derived("record.rendered", _rendered_field) for s in report.rendered]
    parts.append(tail)
    return b"".join(parts)


def record_proto(
    data: CallRecordData, *, structs: bool = False, prompt: bool = True, large: bool = True, splice: bool = True
) -> common_pb2.CallRecord:
    """``CallRecord`` message of a domain record.

    Args:
        data: The record.
        structs: Also fill the ``request`` and ``canonical_messages`` Structs
            (costly for large bodies: about 1 ms per 100 KB).
        prompt: Fill ``prompt_token_ids`` (:func:`event_bytes` appends them packed instead).
        splice: Fill ``splice`` (:func:`event_bytes` appends :func:`splice_bytes` instead).
        large: Fill ``request_json``, ``response_body`` and ``canonical_json`` (:func:`event_bytes`
            appends them by hand instead).
    """
    import orjson

    rec = common_pb2.CallRecord(
        rollout_id=data.rollout_id,
        call_id=data.call_id,
        attempt=data.attempt,
        run_id=data.run_id,
        wire_api=_WIRE[data.wire_api],
        completion_token_ids=data.completion_ids,
        completion_logprobs=data.logprobs,
        completion_policy_versions=data.policy_versions,
        sampling=data.sampling.to_proto(),
        finish_reason=_FINISH[data.finish],
        http_status=data.http_status,
        request_headers=data.request_headers,
        model=data.model,
        stream=data.stream,
        rollout_attempt=data.rollout_attempt,
        error=data.error,
        role=_ROLE[data.role],
        lineage_id=data.lineage_id,
    )
    if splice:
        rec.splice.CopyFrom(splice_proto(data.splice))
    if large:
        rec.request_json = data.request_json
        rec.response_body = data.response_body
        rec.canonical_json = data.canonical_json
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


_Rec = common_pb2.CallRecord
_RECORD_PROMPT_TAG = varint(_Rec.PROMPT_TOKEN_IDS_FIELD_NUMBER << 3 | LEN)
_RECORD_SPLICE_TAG = varint(_Rec.SPLICE_FIELD_NUMBER << 3 | LEN)
_RECORD_REQUEST_JSON_TAG = varint(_Rec.REQUEST_JSON_FIELD_NUMBER << 3 | LEN)
_RECORD_RESPONSE_BODY_TAG = varint(_Rec.RESPONSE_BODY_FIELD_NUMBER << 3 | LEN)
_RECORD_CANONICAL_JSON_TAG = varint(_Rec.CANONICAL_JSON_FIELD_NUMBER << 3 | LEN)
_RECORD_DELTA_TAG = varint(_Rec.DELTA_FIELD_NUMBER << 3 | LEN)
_EVENT_RECORD_TAG = varint(events_pb2.CallRecorded.RECORD_FIELD_NUMBER << 3 | LEN)


@dataclass(frozen=True)
class EncodedParts:
    """The serialized fields of a ``CallRecord`` that do not depend on the answer (splice report,
    delta, packed prompt ids, request and canonical JSON), and their size in bytes."""

    chunks: tuple[bytes, ...]
    size: int

    @staticmethod
    def of(
        prompt: PackedIds, request_json: bytes, canonical_json: bytes, splice: SpliceReport, cut: RecordCut | None
    ) -> EncodedParts:
        """The fields, each as a length-delimited field (the prompt, request and canonical JSON
        as ``cut`` against its base when given: a ``RecordDelta``)."""
        body = splice_bytes(splice)
        head = _RECORD_SPLICE_TAG + varint(len(body))  # always present, as record_proto sets it
        chunks = [head, body]
        packed = prompt.packed
        if cut is not None:
            packed, request_json, canonical_json = cut.prompt_tail, cut.request_json.middle, cut.canonical_json.middle
            delta = cut.delta_bytes()
            chunks += (_RECORD_DELTA_TAG + varint(len(delta)), delta)
        for tag, value in (
            (_RECORD_PROMPT_TAG, packed),
            (_RECORD_REQUEST_JSON_TAG, request_json),
            (_RECORD_CANONICAL_JSON_TAG, canonical_json),
        ):
            if value:  # proto3: empty fields are not written
                chunks += (tag + varint(len(value)), value)
        return EncodedParts(tuple(chunks), sum(map(len, chunks)))


def event_bytes(data: CallRecordData, *, structs: bool = False) -> bytes:
    """The serialized ``CallRecorded`` event of a record (equal, parsed, to one built by protobuf).

    The large fields (the packed prompt ids, the request body, the canonical conversation and
    the response bytes: hundreds of KB for a Claude Code call) are appended as length-delimited
    fields by hand and the event is joined once, so each byte is copied once, not into the
    message, out of it and again into the event. The splice report (a span per reused turn)
    is appended as :func:`splice_bytes`. These fields come from ``data.parts`` when it holds
    them already (:class:`EncodedParts`, made while the engine generated), else from ``data``.

    With ``data.cut`` set, the prompt, request and canonical JSON are sent as that cut against
    an earlier record (``RecordDelta``, :class:`openforge_core.record_delta.RecordCut`): a
    growing conversation's record carries its new part, not the whole conversation again.
    """
    small = record_proto(data, structs=structs, prompt=False, large=False, splice=False).SerializeToString()
    parts = data.parts
    if not isinstance(parts, EncodedParts):
        parts = EncodedParts.of(data.prompt, data.request_json, data.canonical_json, data.splice, data.cut)
    chunks = [small, *parts.chunks]
    size = len(small) + parts.size
    if data.response_body:
        head = _RECORD_RESPONSE_BODY_TAG + varint(len(data.response_body))
        chunks += (head, data.response_body)
        size += len(head) + len(data.response_body)
    event_head = events_pb2.CallRecorded(event_id=data.event_id).SerializeToString()
    return b"".join([event_head, _EVENT_RECORD_TAG, varint(size), *chunks])


_TYPE_NAME = events_pb2.CallRecorded.DESCRIPTOR.full_name


class NatsRecorder:
    """Publishes each record as one ``CallRecorded`` event and waits for JetStream's ack.

    Args:
        bus: The connected event bus.
        structs: Fill the Struct fields too (see :func:`record_proto`).
    """

    def __init__(self, bus: EventBus, *, structs: bool = False) -> None:
        self._bus = bus
        self._structs = structs

    def encode_parts(
        self,
        prompt: PackedIds,
        request_json: bytes,
        canonical_json: bytes,
        splice: SpliceReport,
        cut: RecordCut | None,
    ) -> EncodedParts:
        """:class:`EncodedParts` of these fields (see :meth:`Recorder.encode_parts`)."""
        return EncodedParts.of(prompt, request_json, canonical_json, splice, cut)

    async def record(self, data: CallRecordData) -> None:
        """Publishes the record (de-duplicated per event id).

        Raises:
            RecordTooLarge: The event with its headers exceeds the server's ``max_payload``
                (refused before sending: the server would close the connection).
        """
        event = event_bytes(data, structs=self._structs)
        try:
            await self._bus.publish_bytes(SUBJECT, event, type_name=_TYPE_NAME, event_id=data.event_id)
        except MessageTooLarge as exc:
            raise RecordTooLarge(exc.size, exc.limit) from exc
