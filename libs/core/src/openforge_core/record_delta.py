"""Call records coded against an earlier record of their rollout (``openforge.common.v1.RecordDelta``).

Each call of a growing conversation carries the whole conversation again: the
harness's request, its canonical form and the prompt ids. Sent in full, a
100-turn Claude Code call is ~450 KB on NATS, and the record of every call grows
with the conversation until it passes the server's message limit (1 MB by
default). The proxy therefore sends, for each large field, only what differs
from its previous record of the session (the base): the prompt after the ids it
shares with the base's prompt + completion, and the request and canonical JSON
between the prefix and the suffix they share with the base's, with long runs of
the base between them left out too (:class:`BytesCut`). The trajectory store
rebuilds the full record (:func:`expand_record`) before keeping it.

Everything works on serialized bytes (:mod:`.protowire`): token ids are never
unpacked into Python ints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from openforge.common.v1 import common_pb2
from openforge_core import protowire as pw

_R = common_pb2.CallRecord
PROMPT, COMPLETION = _R.PROMPT_TOKEN_IDS_FIELD_NUMBER, _R.COMPLETION_TOKEN_IDS_FIELD_NUMBER
REQUEST_JSON, CANONICAL_JSON = _R.REQUEST_JSON_FIELD_NUMBER, _R.CANONICAL_JSON_FIELD_NUMBER
DELTA = _R.DELTA_FIELD_NUMBER
_LARGE = frozenset((PROMPT, REQUEST_JSON, CANONICAL_JSON, DELTA))
_FULL = frozenset((PROMPT, COMPLETION, REQUEST_JSON, CANONICAL_JSON, DELTA))

#: A delta is sent only when it leaves out at least this many bytes.
MIN_SAVED_BYTES = 4096


#: Runs of the base shorter than this are not copied into a delta's middle (bytes).
MIN_COPY = 256
#: Most runs copied into one middle.
MAX_COPIES = 8
#: Bytes of the base looked up in the full string to find the next run.
_ANCHOR = 64
#: Where, after the end of the last run (or the prefix), the next run is looked for in the
#: base: right there, else after bytes the full string dropped or changed.
_SKIPS = (0, 64, 512, 4096)


@dataclass(frozen=True)
class BytesCut:
    """A byte string coded against a base: the base's first ``prefix`` and last ``suffix`` bytes
    around a middle, which is the carried bytes with runs of the base inserted.

    Attributes:
        prefix: Leading bytes of the base.
        suffix: Trailing bytes of the base.
        middle: The carried bytes (the runs excluded).
        copies: ``(at, offset, length)`` per run, in order: ``base[offset:offset + length]``
            goes after the first ``at`` carried bytes.
    """

    prefix: int
    suffix: int
    middle: bytes
    copies: tuple[tuple[int, int, int], ...] = ()

    @staticmethod
    def between(base: bytes, full: bytes) -> BytesCut:
        """The cut of ``full`` against ``base``: the longest common prefix, then the longest
        suffix that does not overlap it, then runs of at least :data:`MIN_COPY` bytes of the
        base's middle found in order in the full string's middle (greedy, at most
        :data:`MAX_COPIES`; each found by a 64-byte anchor and extended by ``memcmp``).

        Every run is checked equal when it is found, so the cut always rebuilds ``full``;
        the search only decides how much is left out.
        """
        prefix = pw.common_prefix(base, full)
        suffix = pw.common_suffix(base, full, min(len(base), len(full)) - prefix)
        b, b_end = prefix, len(base) - suffix
        n, n_end = prefix, len(full) - suffix
        parts: list[bytes] = []
        copies: list[tuple[int, int, int]] = []
        at = 0
        while len(copies) < MAX_COPIES and n_end - n >= MIN_COPY:
            run = _next_run(base, b, b_end, full, n, n_end)
            if run is None:
                break
            s, k, length = run
            parts.append(full[n:k])
            at += k - n
            copies.append((at, s, length))
            n, b = k + length, s + length
        if not copies:
            return BytesCut(prefix, suffix, full[prefix:n_end])
        parts.append(full[n:n_end])
        return BytesCut(prefix, suffix, b"".join(parts), tuple(copies))

    @property
    def size(self) -> int:
        """Bytes of the full string."""
        return self.saved + len(self.middle)

    def apply(self, base: bytes, size: int | None = None) -> bytes:
        """The full byte string.

        Args:
            base: The base it was cut against.
            size: The full string's size when known (a delta's own): checked before anything
                is built.

        Raises:
            ValueError: The base is shorter than the prefix and suffix together; a run lies
                outside the base's middle (between its prefix and suffix), overlaps or precedes
                the previous run, or lies outside the carried bytes; or the string would not
                be ``size`` bytes. Runs as :meth:`between` makes them never repeat base bytes,
                so a rebuilt string is never longer than the base and the carried bytes.
        """
        if self.prefix + self.suffix > len(base):
            raise ValueError(f"base of {len(base)} bytes, delta takes {self.prefix} + {self.suffix}")
        pos, after = 0, self.prefix  # carried bytes used, base bytes copied up to
        for at, offset, length in self.copies:
            if not pos <= at <= len(self.middle):
                raise ValueError(f"a run at {at} of {len(self.middle)} carried bytes, after {pos}")
            if offset < after or offset + length > len(base) - self.suffix:
                raise ValueError(
                    f"a run of {length} bytes at {offset} of a base of {len(base)}, outside "
                    f"{after}..{len(base) - self.suffix}"
                )
            pos, after = at, offset + length
        if size is not None and self.size != size:
            raise ValueError(f"rebuilt to {self.size} bytes, the delta says {size}")
        out = [base[: self.prefix]]
        pos = 0
        for at, offset, length in self.copies:
            out.append(self.middle[pos:at])
            out.append(base[offset : offset + length])
            pos = at
        out.append(self.middle[pos:])
        out.append(base[len(base) - self.suffix :])
        return b"".join(out)

    def proto(self) -> common_pb2.BytesDelta:
        """The ``BytesDelta`` message (the carried bytes travel in the record's own field)."""
        return common_pb2.BytesDelta(
            prefix=self.prefix,
            suffix=self.suffix,
            size=self.size,
            copies=[common_pb2.BytesCopy(at=a, offset=o, length=n) for a, o, n in self.copies],
        )

    @staticmethod
    def of_proto(delta: common_pb2.BytesDelta, middle: bytes) -> BytesCut:
        """The cut a ``BytesDelta`` and its carried bytes describe."""
        return BytesCut(delta.prefix, delta.suffix, middle, tuple((c.at, c.offset, c.length) for c in delta.copies))

    @property
    def saved(self) -> int:
        """Bytes left out."""
        return self.prefix + self.suffix + sum(c[2] for c in self.copies)


def _next_run(base: bytes, b: int, b_end: int, full: bytes, n: int, n_end: int) -> tuple[int, int, int] | None:
    """The next run of ``base[b:b_end]`` in ``full[n:n_end]``: (offset in base, offset in full,
    length), at least :data:`MIN_COPY` bytes, or None."""
    for skip in _SKIPS:
        s = b + skip
        if b_end - s < MIN_COPY:
            return None
        k = full.find(base[s : s + _ANCHOR], n, n_end)
        if k >= 0:
            length = pw.common_run(base, s, full, k, min(b_end - s, n_end - k))
            if length >= MIN_COPY:
                return s, k, length
    return None


@dataclass(frozen=True)
class FullParts:
    """The large fields of a full record, as a base for :func:`expand_record` and :class:`RecordCut`.

    Attributes:
        request_json: The request body.
        canonical_json: The canonical conversation.
        sequence: Packed varints of the prompt ids followed by the sampled ids.
    """

    request_json: bytes
    canonical_json: bytes
    sequence: bytes

    @property
    def size(self) -> int:
        """Bytes held."""
        return len(self.request_json) + len(self.canonical_json) + len(self.sequence)

    @staticmethod
    def of(record: bytes, sequence: bytes | None = None) -> FullParts:
        """The parts of a full serialized ``CallRecord``.

        Args:
            record: The record.
            sequence: Its packed prompt + sampled ids, when the caller already joined them.

        Raises:
            ValueError: Malformed record, or one that is itself a delta.
        """
        parts, _ = pw.split_fields(record, _FULL)
        if DELTA in parts:
            raise ValueError("a base must be a full record, not a delta")
        if sequence is None:
            sequence = parts.get(PROMPT, b"") + parts.get(COMPLETION, b"")
        return FullParts(parts.get(REQUEST_JSON, b""), parts.get(CANONICAL_JSON, b""), sequence)

    def as_base(self, call_id: str, attempt: int) -> RecordBase:
        """These parts as the base of a later record."""
        return RecordBase(self.request_json, self.canonical_json, self.sequence, call_id, attempt)


@dataclass(frozen=True)
class RecordBase(FullParts):
    """What a later record of the same rollout may be coded against: a full record's parts and
    its key.

    Attributes:
        call_id: The base record's call.
        attempt: Its attempt.
    """

    call_id: str
    attempt: int


@dataclass(frozen=True)
class RecordCut:
    """A record's large fields coded against a base.

    Attributes:
        base: The base.
        prompt_prefix_tokens: Leading ids taken from the base's sequence.
        prompt_tail: Packed varints of the prompt ids after them.
        prompt_tokens: Ids in the whole prompt.
        request_json: The request body's cut.
        canonical_json: The canonical conversation's cut.
    """

    base: RecordBase
    prompt_prefix_tokens: int
    prompt_tail: bytes
    prompt_tokens: int
    request_json: BytesCut
    canonical_json: BytesCut

    @staticmethod
    def of(
        base: RecordBase, prompt: bytes, request_json: bytes, canonical_json: bytes, prompt_ids: int | None = None
    ) -> RecordCut | None:
        """The cut of a record's packed prompt, request and canonical JSON against ``base``, or
        None when it would leave out fewer than :data:`MIN_SAVED_BYTES`.

        ``prompt_ids`` (the number of ids in ``prompt``, when the caller knows it) saves
        counting the shared part's varints.
        """
        shared = pw.token_boundary(prompt, pw.common_prefix(base.sequence, prompt))
        req = BytesCut.between(base.request_json, request_json)
        canon = BytesCut.between(base.canonical_json, canonical_json)
        if shared + req.saved + canon.saved < MIN_SAVED_BYTES:
            return None
        tail = prompt[shared:]
        if prompt_ids is None:
            prompt_ids = pw.count_varints(prompt)
        return RecordCut(base, prompt_ids - pw.count_varints(tail), tail, prompt_ids, req, canon)

    def delta_bytes(self) -> bytes:
        """The serialized ``RecordDelta``."""
        return common_pb2.RecordDelta(
            base_call_id=self.base.call_id,
            base_attempt=self.base.attempt,
            prompt_prefix_tokens=self.prompt_prefix_tokens,
            request_json=self.request_json.proto(),
            canonical_json=self.canonical_json.proto(),
            prompt_tokens=self.prompt_tokens,
        ).SerializeToString()


def cut_record(record: bytes, base: RecordBase) -> bytes:
    """A full serialized ``CallRecord`` coded against ``base`` (as the proxy publishes it), or the
    record unchanged when the delta would leave out fewer than :data:`MIN_SAVED_BYTES`.

    Raises:
        ValueError: Malformed record.
    """
    parts, rest = pw.split_fields(record, _LARGE)
    cut = RecordCut.of(base, parts.get(PROMPT, b""), parts.get(REQUEST_JSON, b""), parts.get(CANONICAL_JSON, b""))
    if cut is None:
        return record
    out = [rest, pw.len_field(DELTA, cut.delta_bytes())]
    for num, value in (
        (PROMPT, cut.prompt_tail),
        (REQUEST_JSON, cut.request_json.middle),
        (CANONICAL_JSON, cut.canonical_json.middle),
    ):
        if value:
            out.append(pw.len_field(num, value))
    return b"".join(out)


def base_key(record: bytes) -> tuple[str, int] | None:
    """(call id, attempt) of the base a serialized ``CallRecord`` is coded against, or None.

    Raises:
        ValueError: Malformed record.
    """
    for num, wt, a, b in pw.fields(record):
        if num == DELTA and wt == pw.LEN:
            delta = common_pb2.RecordDelta.FromString(record[a:b])
            return delta.base_call_id, delta.base_attempt
    return None


def expand_record(record: bytes, base: FullParts) -> bytes:
    """The full serialized ``CallRecord`` of a record coded as a delta (without its ``delta`` field).

    A record that is not a delta is returned as it is.

    Args:
        record: The serialized record.
        base: The parts of the full record its delta names.

    Raises:
        ValueError: Malformed record, or a base that cannot be the one it was coded against
            (too short for the delta, or rebuilt sizes that differ from the delta's).
    """
    parts, rest = pw.split_fields(record, _LARGE)
    if DELTA not in parts:
        return record
    delta = common_pb2.RecordDelta.FromString(parts[DELTA])
    cut = pw.varint_offset(base.sequence, delta.prompt_prefix_tokens)
    tail = parts.get(PROMPT, b"")
    prompt = base.sequence[:cut] + tail
    got = delta.prompt_prefix_tokens + pw.count_varints(tail)
    if got != delta.prompt_tokens:
        raise ValueError(f"prompt rebuilt to {got} ids, the delta says {delta.prompt_tokens}")
    fields = []
    for name, num, d, base_value in (
        ("request_json", REQUEST_JSON, delta.request_json, base.request_json),
        ("canonical_json", CANONICAL_JSON, delta.canonical_json, base.canonical_json),
    ):
        try:
            value = BytesCut.of_proto(d, parts.get(num, b"")).apply(base_value, d.size)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        fields.append((num, value))
    out = [rest]
    for num, value in ((PROMPT, prompt), *fields):
        if value:  # proto3: empty fields are not written
            out.append(pw.len_field(num, value))
    return b"".join(out)


def expand_records(records: Iterable[common_pb2.CallRecord]) -> list[common_pb2.CallRecord]:
    """Full records of ``CallRecord`` messages read off the stream, in stream order.

    For readers of the proxy's events other than the store (tools, tests): each delta's base
    is an earlier record of the same rollout in ``records``.

    Raises:
        ValueError: A delta whose base is not among the earlier records.
    """
    full: dict[tuple[str, str, int], FullParts] = {}
    out = []
    for rec in records:
        data = rec.SerializeToString()
        key = base_key(data)
        if key is not None:
            try:
                base = full[(rec.rollout_id, *key)]
            except KeyError:
                raise ValueError(f"call {rec.call_id}: base {key} is not an earlier record") from None
            data = expand_record(data, base)
        expanded = common_pb2.CallRecord.FromString(data)
        full[(expanded.rollout_id, expanded.call_id, expanded.attempt)] = FullParts.of(data)
        out.append(expanded)
    return out
