"""Tokenization of rendered prompts, incremental across the calls of a session.

The ``tokenizers`` library splits added (special) tokens out of the text
first and pre-tokenizes and encodes each piece between them on its own
(``AddedVocabulary.extract_and_normalize``). Text cut just before a special
token therefore encodes to exactly the ids of the whole text, concatenated.
The proxy cuts rendered prompts before each message-start token
(``<|im_start|>`` for ChatML families) and remembers the ids of each chunk per
session (:class:`ChunkCache`), so a call only encodes the messages that are new
since the previous call: the cost of a call grows with its new part, not with
the length of the conversation.

Ids are held as ``array('i')`` (4 bytes a token, copied with ``memcpy``), never
as lists of Python ints (40 bytes a token, converted one by one), and each
chunk also keeps its protobuf *packed varint* encoding: a prompt is sent to the
engine and recorded as the concatenation of its chunks' encodings
(:class:`PackedIds`), so a 35k-token prompt is never converted id by id.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from openforge_core.errors import FailedPrecondition


def varint(value: int) -> bytes:
    """The protobuf varint encoding of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def pack_ids(ids: Iterable[int]) -> bytes:
    """Protobuf packed encoding of ids (a ``repeated int32`` field's payload, ids >= 0)."""
    return b"".join(varint(i) for i in ids)


def ids_array(ids: Iterable[int] = ()) -> array[int]:
    """An ``array('i')`` of ids."""
    return array("i", ids)


@dataclass(frozen=True)
class PackedIds:
    """Token ids with their protobuf packed encoding.

    Attributes:
        ids: The ids.
        packed: Their packed varint encoding (what ``repeated int32`` carries on the wire).
    """

    ids: array[int]
    packed: bytes

    def __len__(self) -> int:
        return len(self.ids)

    def tolist(self) -> list[int]:
        return self.ids.tolist()


class IdsBuilder:
    """Concatenates id runs and their packed encodings."""

    __slots__ = ("ids", "parts")

    def __init__(self) -> None:
        self.ids: array[int] = array("i")
        self.parts: list[bytes] = []

    def add(self, ids: array[int], packed: bytes) -> None:
        self.ids.extend(ids)
        self.parts.append(packed)

    def __len__(self) -> int:
        return len(self.ids)

    def build(self) -> PackedIds:
        return PackedIds(self.ids, b"".join(self.parts))


class ChunkCache:
    """Token ids of prompt chunks already encoded in one session.

    Least recently used chunks are dropped once ``max_chars`` characters are held.

    Args:
        max_chars: Most characters of chunk text kept (memory bound).
    """

    def __init__(self, max_chars: int = 8_000_000) -> None:
        self._max = max_chars
        self._chars = 0
        self._ids: OrderedDict[str, tuple[array[int], bytes]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, chunk: str) -> tuple[array[int], bytes] | None:
        ids = self._ids.get(chunk)
        if ids is not None:
            self._ids.move_to_end(chunk)
            self.hits += 1
        return ids

    def put(self, chunk: str, ids: tuple[array[int], bytes]) -> None:
        self.misses += 1
        if chunk in self._ids:
            return
        self._ids[chunk] = ids
        self._chars += len(chunk)
        while self._chars > self._max and len(self._ids) > 1:
            old, _ = self._ids.popitem(last=False)
            self._chars -= len(old)

    def __len__(self) -> int:
        return len(self._ids)


class TokenizerCodec:
    """A ``tokenizers.Tokenizer`` with chunked encoding and streaming decoding.

    Args:
        tokenizer: The model's tokenizer.
        split_marker: Special-token text before which prompts are cut into
            chunks (e.g. ``<|im_start|>``); "" disables chunking.
    """

    def __init__(self, tokenizer: Tokenizer, split_marker: str = "") -> None:
        self._tok = tokenizer
        self.split_marker = split_marker
        if split_marker and tokenizer.token_to_id(split_marker) is None:
            raise FailedPrecondition(f"{split_marker!r} is not a token of this tokenizer", reason="BAD_TOKENIZER")
        self._varints = [varint(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]

    @classmethod
    def from_dir(cls, model_dir: Path, split_marker: str = "") -> TokenizerCodec:
        """Loads ``tokenizer.json`` from a model directory.

        Raises:
            FailedPrecondition: The file is missing or unreadable.
        """
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FailedPrecondition(f"tokenizer.json missing in {model_dir}", reason="BAD_MODEL_DIR")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise FailedPrecondition(f"tokenizer.json does not load: {exc}", reason="BAD_MODEL_DIR") from exc
        return cls(tok, split_marker)

    @staticmethod
    def file_hash(model_dir: Path) -> str:
        """``sha256:<hex>`` of ``tokenizer.json`` (what inference's GetModelInfo reports)."""
        return "sha256:" + hashlib.sha256((model_dir / "tokenizer.json").read_bytes()).hexdigest()

    def token_id(self, token: str) -> int | None:
        """The id of a token (special or not), if it is one token."""
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (no BOS/EOS added, as ``apply_chat_template`` tokenizes)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def pack(self, ids: Sequence[int]) -> bytes:
        """:func:`pack_ids`, by table lookup for ids of the vocabulary."""
        table = self._varints
        n = len(table)
        if not ids or (min(ids) >= 0 and max(ids) < n):
            return b"".join(map(table.__getitem__, ids))
        return pack_ids(ids)

    def packed(self, ids: Sequence[int]) -> PackedIds:
        """Ids with their packed encoding."""
        return PackedIds(array("i", ids), self.pack(ids))

    def encode_chunked(self, text: str, cache: ChunkCache | None) -> list[int]:
        """Ids of ``text``, reusing the ids of chunks seen before.

        Equal to :meth:`encode` (chunks end right before a special token).
        """
        out = IdsBuilder()
        self.encode_into(text, cache, out)
        return out.ids.tolist()

    def encode_into(self, text: str, cache: ChunkCache | None, out: IdsBuilder) -> None:
        """Appends the ids of ``text`` (and their packed encoding) to ``out``, reusing cached chunks."""
        if not text:
            return
        if cache is None or not self.split_marker:
            ids = self.encode(text)
            out.add(array("i", ids), self.pack(ids))
            return
        marker = self.split_marker
        parts = text.split(marker)
        chunks = [parts[0]] if parts[0] else []
        chunks.extend(marker + p for p in parts[1:])
        missing = [c for c in chunks if cache.get(c) is None]
        if missing:
            encoded = self._tok.encode_batch_fast(missing, add_special_tokens=False)
            for c, enc in zip(missing, encoded, strict=True):
                ids = enc.ids
                cache.put(c, (array("i", ids), self.pack(ids)))
        for c in chunks:
            got = cache.get(c)
            assert got is not None
            out.add(*got)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens kept."""
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def decoder(self) -> StreamDecoder:
        """A streaming decoder for one generation."""
        return StreamDecoder(self._tok)


class StreamDecoder:
    """Decodes ids one at a time into text deltas (multi-byte characters held until complete)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._stream = DecodeStream(skip_special_tokens=False)

    def step(self, token_id: int) -> str:
        """The text that ``token_id`` completes ("" while a character is incomplete)."""
        out = self._stream.step(self._tok, token_id)
        return out or ""
