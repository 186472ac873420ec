"""Protobuf wire format, just enough to cut and join serialized messages without parsing them.

A 30k-token prompt is a few tens of KB of packed varints. Turning it into
Python ints costs milliseconds; comparing, cutting and concatenating its bytes
costs microseconds. Varints are self-delimiting and the packed encoding of a
concatenation is the concatenation of the encodings, so prefix tests, token
counts and splices work directly on the bytes; a message may carry its fields
in any order, and a repeated or bytes field split in two is read as one
(https://protobuf.dev/programming-guides/encoding/).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5
_LOW = bytes(range(128))


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
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
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


def split_fields(data: bytes, nums: frozenset[int]) -> tuple[dict[int, bytes], bytes]:
    """Takes the LEN fields numbered in ``nums`` out of a message.

    Returns:
        (the concatenated payloads of each such field that occurs, the message without them).

    Raises:
        ValueError: Malformed message.
    """
    payloads: dict[int, list[bytes]] = {}
    rest: list[bytes] = []
    last = pos = 0
    for fnum, wt, start, end in fields(data):
        if fnum in nums and wt == LEN:
            rest.append(data[last:pos])  # the field's key and length lie between pos and start
            payloads.setdefault(fnum, []).append(data[start:end])
            last = end
        pos = end
    rest.append(data[last:])
    return {k: b"".join(v) for k, v in payloads.items()}, b"".join(rest)


def split_field(data: bytes, num: int) -> tuple[bytes, bytes]:
    """(concatenated payloads of LEN field ``num``, the message without that field)."""
    payloads, rest = split_fields(data, frozenset((num,)))
    return payloads.get(num, b""), rest


def count_varints(packed: bytes) -> int:
    """Ids in a packed varint stream (one byte in each varint has the high bit clear)."""
    return len(packed) - len(packed.translate(None, delete=_LOW))


def token_boundary(packed: bytes, n: int) -> int:
    """The largest position <= n that starts a varint in ``packed``."""
    while n > 0 and packed[n - 1] & 0x80:
        n -= 1
    return n


def varint_offset(packed: bytes, count: int) -> int:
    """Byte offset in ``packed`` where its ``count``-th varint ends.

    Each varint is at least one byte, so a window of ``count - seen`` bytes holds at most
    that many varints: windows are counted until ``count`` is reached, never overshooting.
    The last window then holds only one-byte varints, so it ends where a varint ends.

    Raises:
        ValueError: ``packed`` holds fewer than ``count`` varints.
    """
    if count <= 0:
        return 0
    pos = min(count, len(packed))
    seen = count_varints(packed[:pos])
    while seen < count:
        if pos >= len(packed):
            raise ValueError(f"{count} ids asked of a packed stream of {seen}")
        step = count - seen
        seen += count_varints(packed[pos : pos + step])
        pos += step
    return pos


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common byte prefix.

    Binary search over ``bytes.startswith`` of memoryview slices: each probe is one
    ``memcmp``, and nothing is copied.
    """
    n = min(len(a), len(b))
    mb = memoryview(b)
    if a.startswith(mb[:n]):
        return n
    lo, hi = 0, n  # the first lo bytes match, the first hi bytes do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(mb[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def common_run(a: bytes, a0: int, b: bytes, b0: int, limit: int) -> int:
    """Length of the longest common prefix of ``a[a0:]`` and ``b[b0:]``, at most ``limit``
    (as :func:`common_prefix`: a binary search of ``memcmp`` probes, nothing copied)."""
    n = min(len(a) - a0, len(b) - b0, limit)
    if n <= 0:
        return 0
    mb = memoryview(b)
    if a.startswith(mb[b0 : b0 + n], a0):
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(mb[b0 + lo : b0 + mid], a0 + lo):
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """Length of the longest common byte suffix, at most ``limit`` (as :func:`common_prefix`)."""
    la, lb = len(a), len(b)
    n = min(la, lb, limit)
    if n <= 0:
        return 0
    mb = memoryview(b)
    if a.endswith(mb[lb - n :]):
        return n
    lo, hi = 0, n  # the last lo bytes match, the last hi bytes do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.endswith(mb[lb - mid : lb - lo], 0, la - lo):
            lo = mid
        else:
            hi = mid
    return lo
