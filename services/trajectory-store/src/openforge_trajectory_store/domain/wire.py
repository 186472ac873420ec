"""Protobuf wire format, just enough to handle call records without unpacking tokens.

A 30k-token prompt is a few tens of KB of packed varints. Turning it into
Python ints costs milliseconds; comparing, cutting and concatenating its bytes
costs microseconds. Varints are self-delimiting and the packed encoding of a
concatenation is the concatenation of the encodings, so prefix tests, token
counts and splices work directly on the bytes
(https://protobuf.dev/programming-guides/encoding/).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_HIGH = bytes(range(128, 256))


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decodes a varint at ``pos``; returns (value, position after it).

    Raises:
        ValueError: Truncated varint.
    """
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def varint(value: int) -> bytes:
    """Encodes a non-negative int (or a negative int64 as 10 bytes, two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fields(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Top-level fields as (number, wire type, start, end); for VARINT, start is the value.

    For LEN fields [start, end) is the payload; for I64/I32 the raw bytes.

    Raises:
        ValueError: Malformed message.
    """
    pos, n = 0, len(data)
    while pos < n:
        key, pos = read_varint(data, pos)
        num, wt = key >> 3, key & 7
        if wt == VARINT:
            value, pos = read_varint(data, pos)
            yield num, wt, value, pos
        elif wt == LEN:
            size, pos = read_varint(data, pos)
            if pos + size > n:
                raise ValueError("truncated field")
            yield num, wt, pos, pos + size
            pos += size
        elif wt == I64:
            yield num, wt, pos, pos + 8
            pos += 8
        elif wt == I32:
            yield num, wt, pos, pos + 4
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")


def len_field(num: int, payload: bytes) -> bytes:
    """A length-delimited field (bytes, string, message, packed repeated)."""
    return varint(num << 3 | LEN) + varint(len(payload)) + payload


def varint_field(num: int, value: int) -> bytes:
    """A varint field; empty for 0 (proto3 omits defaults)."""
    return varint(num << 3 | VARINT) + varint(value) if value else b""


def double_field(num: int, value: float) -> bytes:
    """A double field; empty for 0.0."""
    return varint(num << 3 | I64) + struct.pack("<d", value) if value else b""


def count_varints(packed: bytes) -> int:
    """Tokens in a packed varint stream (one byte in each varint has the high bit clear)."""
    return len(packed) - len(packed.translate(None, delete=bytes(range(128))))


def token_boundary(packed: bytes, n: int) -> int:
    """The largest position <= n that starts a varint in ``packed``."""
    while n > 0 and packed[n - 1] & 0x80:
        n -= 1
    return n


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common byte prefix (binary search over memcmp'd slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def split_field(data: bytes, num: int) -> tuple[bytes, bytes]:
    """(concatenated payloads of LEN field ``num``, the message without that field)."""
    payload, rest, last = [], [], 0
    pos = 0
    for fnum, wt, start, end in fields(data):
        if fnum == num and wt == LEN:
            # the field's key and length precede start; cut from the end of the previous field
            rest.append(data[last:pos])
            payload.append(data[start:end])
            last = end
        pos = end
    rest.append(data[last:])
    return b"".join(payload), b"".join(rest)


# CallRecord field numbers (openforge.common.v1.CallRecord).
CALL_ID, ATTEMPT, PROMPT, COMPLETION, LOGPROBS, VERSIONS, FINISH, RECEIVE_TIME, SPLICE = 2, 3, 8, 9, 10, 11, 13, 14, 17


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
            elif num == RECEIVE_TIME and wt == LEN:
                for n2, w2, x, _ in fields(data[a:b]):
                    if w2 == VARINT:
                        v.receive_ns += x * 1_000_000_000 if n2 == 1 else x if n2 == 2 else 0
            elif num == SPLICE and wt == LEN:
                sub = data[a:b]
                for n2, w2, x, y in fields(sub):
                    if n2 == 3 and w2 == VARINT:
                        v.break_cause = x
                    elif n2 == 4 and w2 == LEN:
                        v.break_detail = sub[x:y].decode()
        v.prompt, v.completion = b"".join(prompt), b"".join(completion)
        v.logprobs, v.versions = b"".join(logprobs), b"".join(versions)
        v.completion_len = count_varints(v.completion)
        return v
