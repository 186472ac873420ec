"""Compact storage of call records: prompts stored as a delta on an earlier call.

Within a rollout each call's prompt usually extends the previous call's prompt
plus completion, so storing every prompt in full costs O(turns²) tokens. A call
is stored with ``prompt_token_ids`` cut to the part after the longest prefix it
shares with a base call's full sequence (prompt + completion), and the base's
key plus the prefix length kept beside it. Token arrays are protobuf packed
varints (1–3 bytes per id), never JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from openforge.common.v1 import common_pb2

CallKey = tuple[str, int]  # (call_id, attempt)

#: A base is used only when it saves at least this many tokens.
MIN_SHARED_PREFIX = 16


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (binary search on slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class StoredCall:
    """A call record as stored.

    Attributes:
        key: (call_id, attempt).
        data: The serialized ``CallRecord`` with the shared prompt prefix removed.
        base: Key of the call whose sequence the prefix comes from, or None.
        prefix_len: Tokens of the prompt taken from the base's sequence.
        sequence: The full prompt + completion, for use as the next base.
    """

    key: CallKey
    data: bytes
    base: CallKey | None
    prefix_len: int
    sequence: list[int]


def encode(record: common_pb2.CallRecord, base: tuple[CallKey, list[int]] | None) -> StoredCall:
    """Encodes a record against an optional base (key, full sequence of the base)."""
    prompt = list(record.prompt_token_ids)
    sequence = prompt + list(record.completion_token_ids)
    key = (record.call_id, record.attempt)
    shared = common_prefix(base[1], prompt) if base is not None else 0
    if base is None or shared < MIN_SHARED_PREFIX:
        return StoredCall(key, record.SerializeToString(), None, 0, sequence)
    stripped = common_pb2.CallRecord()
    stripped.CopyFrom(record)
    del stripped.prompt_token_ids[:]
    stripped.prompt_token_ids.extend(prompt[shared:])
    return StoredCall(key, stripped.SerializeToString(), base[0], shared, sequence)


def decode(rows: Iterable[tuple[bytes, CallKey | None, int]]) -> list[common_pb2.CallRecord]:
    """Rebuilds full records from stored rows given in storage order (every base before its users).

    Args:
        rows: (data, base key or None, prefix length) per stored call.

    Returns:
        The full records, in the same order.

    Raises:
        ValueError: A row names a base that is not among the earlier rows.
    """
    sequences: dict[CallKey, list[int]] = {}
    out: list[common_pb2.CallRecord] = []
    for data, base, prefix_len in rows:
        rec = common_pb2.CallRecord.FromString(data)
        if base is not None:
            try:
                prefix = sequences[base][:prefix_len]
            except KeyError:
                raise ValueError(f"call {rec.call_id}/{rec.attempt}: base {base} not stored before it") from None
            suffix = list(rec.prompt_token_ids)
            del rec.prompt_token_ids[:]
            rec.prompt_token_ids.extend(prefix + suffix)
        sequences[(rec.call_id, rec.attempt)] = [*rec.prompt_token_ids, *rec.completion_token_ids]
        out.append(rec)
    return out
