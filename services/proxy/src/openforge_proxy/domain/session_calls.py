"""One session's state across its calls (:class:`SessionCalls`): the splicer, the calls seen,
the conversation memos, the record bases."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from openforge_core.record_delta import RecordBase
from openforge_proxy.domain.call_roles import LineageTracker
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.protocols.codec import ParseContext
from openforge_proxy.domain.protocols.memo import BodyMemo, ConversationMemo
from openforge_proxy.domain.record import CallRecordData
from openforge_proxy.domain.scrub import BodyScrubber
from openforge_proxy.domain.splice import Splicer

#: Acknowledged records a session keeps as bases for the next record's delta.
_BASES_KEPT = 4


@dataclass
class CallState:
    """A call of the session (one prompt and tools), and how many attempts it had."""

    call_id: str
    attempts: int


class SessionCalls:
    """Per-session state: the splicer, the calls seen (for attempt numbering), the previous
    Messages and Chat Completions requests (their unchanged start is not converted again), the
    previous body (only what changed is scanned for identifiers), and the last acknowledged
    records, which the next record is coded against (``RecordDelta``)."""

    def __init__(self, splicer: Splicer, bodies: BodyMemo | None = None) -> None:
        self.splicer = splicer
        self.calls: dict[str, CallState] = {}
        self.counter = 0
        self._memos: dict[WireApi, ConversationMemo] = {}
        self.body = bodies if bodies is not None else BodyMemo()
        self.scrubber = BodyScrubber()
        self.bases: OrderedDict[str, RecordBase] = OrderedDict()
        self.lineages = LineageTracker()
        # the last call key's hash: (tools key, bytes starting with the prompt hashed, the
        # prompt's length, the hash state after it)
        self._key: tuple[str, bytes, int, hashlib.blake2b] | None = None

    def drop_caches(self) -> None:
        """Forgets what was kept from earlier requests only to make the next one cheaper (parsed
        bodies and conversations, renders, encoded chunks, the last call key's hash): a refused
        request leaves nothing behind. The calls seen, generated turns and record bases stay."""
        self._memos.clear()
        self.body = BodyMemo()
        self._key = None
        self.splicer.drop_caches()

    def parse_context(self, wire: WireApi, *, memos: bool = True) -> ParseContext:
        """What this session lends the parse of its next request of ``wire``'s API (its previous
        conversation of that API only with ``memos``)."""
        memo = self._memos.setdefault(wire, ConversationMemo()) if memos else None
        return ParseContext(memo, self.splicer.turn_of_ref)

    def call_key(self, tools_key: str, packed: bytes) -> str:
        """The call's identity: hex BLAKE2b-128 of ``tools_key`` (UTF-8) then ``packed`` (the
        prompt's packed ids). A prompt that extends the previous call's (a conversation's next
        call) hashes only its new bytes, continuing from the hash state after the previous
        prompt: the digest is the same (a hash's input may be given in pieces)."""
        last = self._key
        if (
            last is not None
            and last[0] == tools_key
            and len(packed) >= last[2]
            and packed.startswith(last[1][: last[2]])
        ):
            digest = last[3].copy()
            digest.update(memoryview(packed)[last[2] :])
        else:
            digest = hashlib.blake2b(tools_key.encode(), digest_size=16)
            digest.update(packed)
        self._key = (tools_key, packed, len(packed), digest)
        return digest.hexdigest()

    def base_for(self, extends_call_id: str) -> RecordBase | None:
        """The acknowledged record to code the next one against: the call its prompt extends,
        else the latest."""
        base = self.bases.get(extends_call_id)
        if base is None and self.bases:
            base = next(reversed(self.bases.values()))
        return base

    def recorded(self, record: CallRecordData, turn_id: str) -> None:
        """Keeps an acknowledged record as a base: one per conversation thread (a record
        replaces the one its prompt extends), the last few threads of the session."""
        head = self.splicer.heads.get(turn_id)  # holds the packed prompt + sampled ids
        extends = record.splice.extends_call_id
        if extends and extends != record.call_id:
            self.bases.pop(extends, None)
        self.bases[record.call_id] = record.as_base(head.packed if head is not None else None)
        key = self._key
        if key is not None and head is not None and key[1] is record.prompt.packed:
            # the base's bytes start with the prompt: the prompt alone need not be kept for the hash
            self._key = (key[0], head.packed, key[2], key[3])
        self.bases.move_to_end(record.call_id)
        while len(self.bases) > _BASES_KEPT:
            self.bases.popitem(last=False)
