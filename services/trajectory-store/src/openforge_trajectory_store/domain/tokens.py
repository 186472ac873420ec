"""Compact storage of call records: prompts stored as a delta on an earlier call.

Within a rollout each call's prompt usually extends the previous call's prompt
plus completion, so storing every prompt in full costs O(turns²) tokens. A call
is stored with its prompt cut to the part after the longest prefix it shares
with a base call's full sequence (prompt + completion); the base's key and the
prefix length (in bytes of packed varints, always at a token boundary) are kept
beside it. Everything works on the serialized bytes (:mod:`.wire`): token ids
are never unpacked into Python ints on this path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from openforge_trajectory_store.domain import wire

CallKey = tuple[str, int]  # (call_id, attempt)

#: A base is used only when it saves at least this many bytes.
MIN_SHARED_BYTES = 32


@dataclass(frozen=True)
class StoredCall:
    """A call record as stored.

    Attributes:
        key: (call_id, attempt).
        data: The serialized ``CallRecord``, its prompt cut to the part after ``prefix_len``.
        base: Key of the call whose sequence the prefix comes from, or None.
        prefix_len: Bytes of the packed prompt taken from the base's sequence.
        sequence: Packed varints of the full prompt + completion, for use as the next base.
    """

    key: CallKey
    data: bytes
    base: CallKey | None
    prefix_len: int
    sequence: bytes


def encode(record: bytes, base: tuple[CallKey, bytes] | None) -> StoredCall:
    """Encodes a serialized record against an optional base (key, packed sequence of the base).

    Raises:
        ValueError: Malformed record.
    """
    view = wire.CallView.parse(record)
    sequence = view.prompt + view.completion
    shared = 0
    if base is not None:
        shared = wire.token_boundary(view.prompt, wire.common_prefix(base[1], view.prompt))
    if base is None or shared < MIN_SHARED_BYTES:
        return StoredCall(view.key, record, None, 0, sequence)
    _, rest = wire.split_field(record, wire.PROMPT)
    data = rest + wire.len_field(wire.PROMPT, view.prompt[shared:])
    return StoredCall(view.key, data, base[0], shared, sequence)


def decode(rows: Iterable[tuple[bytes, CallKey | None, int]]) -> list[wire.CallView]:
    """Rebuilds full records from stored rows given in storage order (every base before its users).

    Args:
        rows: (data, base key or None, prefix length in bytes) per stored call.

    Returns:
        A view per row, in the same order, whose ``data`` is the full serialized record.

    Raises:
        ValueError: A row names a base that is not among the earlier rows, or is malformed.
    """
    sequences: dict[CallKey, bytes] = {}
    out: list[wire.CallView] = []
    for data, base, prefix_len in rows:
        if base is not None:
            try:
                prefix = sequences[base][:prefix_len]
            except KeyError:
                raise ValueError(f"base {base} not stored before a call that uses it") from None
            suffix, rest = wire.split_field(data, wire.PROMPT)
            data = rest + wire.len_field(wire.PROMPT, prefix + suffix)
        view = wire.CallView.parse(data)
        sequences[view.key] = view.prompt + view.completion
        out.append(view)
    return out
