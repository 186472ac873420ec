"""Unix seconds as a protobuf ``google.protobuf.Timestamp``: the one conversion every service uses."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp


def to_timestamp(unix_s: float) -> Timestamp:
    """``unix_s`` (seconds since the epoch, float) as a Timestamp, to the nanosecond."""
    ts = Timestamp()
    ts.FromNanoseconds(int(unix_s * 1e9))
    return ts
