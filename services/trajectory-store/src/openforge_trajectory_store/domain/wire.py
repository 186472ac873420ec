"""The parts of serialized call records that sample assembly reads, without unpacking tokens.

The generic wire-format helpers live in :mod:`openforge_core.protowire` and are
re-exported here for the store's modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2

from openforge.common.v1 import common_pb2
from openforge_core.protowire import (
    I32,
    I64,
    LEN,
    VARINT,
    common_prefix,
    count_varints,
    double_field,
    fields,
    len_field,
    read_varint,
    split_field,
    token_boundary,
    varint,
    varint_field,
)

__all__ = [
    "I32",
    "I64",
    "LEN",
    "VARINT",
    "CallView",
    "common_prefix",
    "count_varints",
    "double_field",
    "fields",
    "len_field",
    "read_varint",
    "split_field",
    "token_boundary",
    "varint",
    "varint_field",
]


_Rec = common_pb2.CallRecord
CALL_ID = _Rec.CALL_ID_FIELD_NUMBER
ATTEMPT = _Rec.ATTEMPT_FIELD_NUMBER
PROMPT = _Rec.PROMPT_TOKEN_IDS_FIELD_NUMBER
COMPLETION = _Rec.COMPLETION_TOKEN_IDS_FIELD_NUMBER
LOGPROBS = _Rec.COMPLETION_LOGPROBS_FIELD_NUMBER
VERSIONS = _Rec.COMPLETION_POLICY_VERSIONS_FIELD_NUMBER
FINISH = _Rec.FINISH_REASON_FIELD_NUMBER
RECEIVE_TIME = _Rec.RECEIVE_TIME_FIELD_NUMBER
SPLICE = _Rec.SPLICE_FIELD_NUMBER
ROLLOUT_ATTEMPT = _Rec.ROLLOUT_ATTEMPT_FIELD_NUMBER
ROLE = _Rec.ROLE_FIELD_NUMBER
LINEAGE_ID = _Rec.LINEAGE_ID_FIELD_NUMBER
ERROR = _Rec.ERROR_FIELD_NUMBER
_SECONDS = timestamp_pb2.Timestamp.SECONDS_FIELD_NUMBER
_NANOS = timestamp_pb2.Timestamp.NANOS_FIELD_NUMBER
_BREAK_CAUSE = common_pb2.SpliceReport.BREAK_CAUSE_FIELD_NUMBER
_BREAK_DETAIL = common_pb2.SpliceReport.BREAK_DETAIL_FIELD_NUMBER


@dataclass
class CallView:
    """The parts of a serialized ``CallRecord`` assembly needs, tokens left packed.

    Attributes:
        call_id: Call id.
        attempt: Attempt number.
        prompt: Packed varints of the prompt token ids.
        completion: Packed varints of the sampled token ids.
        logprobs: Packed little-endian float32 logprobs ("" when not recorded).
        versions: Packed varints of per-token policy versions ("" when not recorded).
        finish_reason: FinishReason number.
        receive_ns: Receive time, Unix nanoseconds.
        break_cause: Splice report's BreakCause number.
        break_detail: Splice report's detail.
        rollout_attempt: The orchestrator's attempt of the rollout (1 when not recorded).
        error: Why the call failed; empty when it was answered.
        role: CallRole number (main when not recorded).
        lineage_id: The call's lineage (empty when not recorded, or for compaction and side calls).
    """

    call_id: str = ""
    attempt: int = 0
    prompt: bytes = b""
    completion: bytes = b""
    logprobs: bytes = b""
    versions: bytes = b""
    finish_reason: int = 0
    receive_ns: int = 0
    break_cause: int = 0
    break_detail: str = ""
    completion_len: int = 0
    rollout_attempt: int = 1
    error: str = ""
    role: int = common_pb2.CALL_ROLE_MAIN
    lineage_id: str = ""
    data: bytes = field(default=b"", repr=False)

    @property
    def key(self) -> tuple[str, int]:
        """(call_id, attempt)."""
        return self.call_id, self.attempt

    @staticmethod
    def parse(data: bytes) -> CallView:
        """Reads a serialized CallRecord (kept in ``data``).

        Raises:
            ValueError: Malformed record.
        """
        v = CallView(data=data)
        prompt, completion, logprobs, versions = [], [], [], []
        for num, wt, a, b in fields(data):
            if num == PROMPT and wt == LEN:
                prompt.append(data[a:b])
            elif num == COMPLETION and wt == LEN:
                completion.append(data[a:b])
            elif num == LOGPROBS and wt == LEN:
                logprobs.append(data[a:b])
            elif num == VERSIONS and wt == LEN:
                versions.append(data[a:b])
            elif num == CALL_ID and wt == LEN:
                v.call_id = data[a:b].decode()
            elif num == ATTEMPT and wt == VARINT:
                v.attempt = a
            elif num == FINISH and wt == VARINT:
                v.finish_reason = a
            elif num == ROLLOUT_ATTEMPT and wt == VARINT:
                v.rollout_attempt = max(1, a)
            elif num == ERROR and wt == LEN:
                v.error = data[a:b].decode()
            elif num == ROLE and wt == VARINT:
                v.role = a or common_pb2.CALL_ROLE_MAIN
            elif num == LINEAGE_ID and wt == LEN:
                v.lineage_id = data[a:b].decode()
            elif num == RECEIVE_TIME and wt == LEN:
                for n2, w2, x, _ in fields(data[a:b]):
                    if w2 == VARINT:
                        v.receive_ns += x * 1_000_000_000 if n2 == _SECONDS else x if n2 == _NANOS else 0
            elif num == SPLICE and wt == LEN:
                sub = data[a:b]
                for n2, w2, x, y in fields(sub):
                    if n2 == _BREAK_CAUSE and w2 == VARINT:
                        v.break_cause = x
                    elif n2 == _BREAK_DETAIL and w2 == LEN:
                        v.break_detail = sub[x:y].decode()
        v.prompt, v.completion = b"".join(prompt), b"".join(completion)
        v.logprobs, v.versions = b"".join(logprobs), b"".join(versions)
        v.completion_len = count_varints(v.completion)
        return v
