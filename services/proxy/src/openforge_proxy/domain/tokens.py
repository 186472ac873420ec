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

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.decoders import ByteLevel, DecodeStream
from tokenizers.models import BPE

from openforge_core.errors import FailedPrecondition
from openforge_core.manifest import sha256_digest
from openforge_core.protowire import varint

__all__ = [
    "ChunkCache",
    "IdsBuilder",
    "PackedIds",
    "SharedChunks",
    "StreamDecoder",
    "TokenizerCodec",
    "ids_array",
    "pack_ids",
    "varint",
]


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

    __slots__ = ("ids", "packed_len", "parts")

    def __init__(self) -> None:
        self.ids: array[int] = array("i")
        self.parts: list[bytes] = []
        self.packed_len = 0

    def add(self, ids: array[int], packed: bytes) -> None:
        self.ids.extend(ids)
        self.parts.append(packed)
        self.packed_len += len(packed)

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


class SharedChunks:
    """Token ids of large chunks that several sessions sent, shared by all sessions of the process.

    Every session of a harness starts with the same system prompt and tool definitions
    (a Claude Code request is ~35k tokens of them), so a session's first call would otherwise
    tokenize text the process tokenized for the previous session already. Ids are a pure
    function of the chunk text and the tokenizer, so sharing them changes no prompt.

    Only chunks of at least ``min_chars`` characters are kept (small chunks are cheap to encode),
    and only once a second session misses them: a chunk one session alone sends (its first user
    message, its tool results) leaves just its hash in a bounded list of recent ones, so closed
    sessions leave nothing behind that grows with the number of calls.

    Safe to use from several threads.

    Args:
        max_chars: Most characters of chunk text kept; least recently used chunks go first.
        min_chars: Smallest chunk kept.
        max_seen: Hashes of chunks seen once that are remembered.
    """

    def __init__(self, max_chars: int = 16_000_000, min_chars: int = 2048, max_seen: int = 4096) -> None:
        self._max = max_chars
        self.min_chars = min_chars
        self._max_seen = max_seen
        self._chars = 0
        self._entries: OrderedDict[str, tuple[str, array[int], bytes]] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()
        # a large request's prompt may be encoded in a worker thread while other sessions' are
        # encoded on the event loop
        self._lock = threading.Lock()

    def get(self, chunk: str) -> tuple[str, array[int], bytes] | None:
        """The chunk's kept key object and ids, if kept."""
        hash(chunk)  # computed (and kept by the string) outside the lock
        with self._lock:
            entry = self._entries.get(chunk)
            if entry is not None:
                self._entries.move_to_end(chunk)
            return entry

    def offer(self, chunk: str, ids: array[int], packed: bytes) -> None:
        """Keeps a chunk a session just encoded if it is large and another session encoded it before."""
        if len(chunk) < self.min_chars:
            return
        hash(chunk)
        with self._lock:
            self._offer(chunk, ids, packed)

    def _offer(self, chunk: str, ids: array[int], packed: bytes) -> None:
        if chunk in self._entries:
            return
        h = hash(chunk)
        if h not in self._seen:
            self._seen[h] = None
            if len(self._seen) > self._max_seen:
                self._seen.popitem(last=False)
            return
        del self._seen[h]
        self._entries[chunk] = (chunk, ids, packed)
        self._chars += len(chunk)
        while self._chars > self._max and len(self._entries) > 1:
            old, _ = self._entries.popitem(last=False)
            self._chars -= len(old)

    def __len__(self) -> int:
        return len(self._entries)


def _byte_of() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` (Radford et al. 2019, ``encoder.py``), inverted: the
    character that spells each byte in a byte-level BPE vocabulary → the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF = _byte_of()


def text_floor(text: str, longest: int, above: int = 0, normalize: Callable[[str], str] | None = None) -> int:
    """A lower bound of a text's token count: ``ceil(n / longest)``, ``n`` its UTF-8 bytes after
    ``normalize`` (a token stands for at most ``longest`` bytes; see
    :meth:`TokenizerCodec.min_tokens`). 0 when ``longest`` is 0 (no bound known).

    Args:
        text: The text.
        longest: The vocabulary's longest piece, UTF-8 bytes.
        above: 0 is also returned, without normalizing the text, where its length alone shows
            the bound is at most ``above``; a smaller bound than the best may be returned where
            that one already exceeds ``above``.
        normalize: The tokenizer's normalizer (None: it has none; the text is bounded as is).
    """
    if not longest or not text or -(-4 * len(text) // longest) <= above:
        return 0
    if normalize is None:
        by_chars = -(-len(text) // longest)  # a text has at least as many bytes as characters
        if by_chars > above:
            return by_chars
        normalized = text
    else:
        normalized = normalize(text)
    return -(-len(normalized.encode("utf-8", "surrogatepass")) // longest)


class TokenizerCodec:
    """A ``tokenizers.Tokenizer`` with chunked encoding and streaming decoding.

    Args:
        tokenizer: The model's tokenizer.
        split_marker: Special-token text before which prompts are cut into
            chunks (e.g. ``<|im_start|>``); "" disables chunking.
        file_hash: ``sha256:<hex>`` of the ``tokenizer.json`` bytes it was built from ("" when
            not built from a file).
    """

    def __init__(self, tokenizer: Tokenizer, split_marker: str = "", file_hash: str = "") -> None:
        self._tok = tokenizer
        self.split_marker = split_marker
        self.file_hash = file_hash
        if split_marker and tokenizer.token_to_id(split_marker) is None:
            raise FailedPrecondition(f"{split_marker!r} is not a token of this tokenizer", reason="BAD_TOKENIZER")
        self._varints = [varint(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
        self.shared = SharedChunks()
        self._token_bytes: dict[int, bytes] = {}
        self._max_piece: int | None = None
        normalizer = tokenizer.normalizer  # read once: each read builds a new wrapper object
        self._normalize = normalizer.normalize_str if normalizer is not None else None

    @classmethod
    def from_dir(cls, model_dir: Path, split_marker: str = "") -> TokenizerCodec:
        """Loads ``tokenizer.json`` from a model directory, read once: the tokenizer and its
        :attr:`file_hash` (what inference's GetModelInfo reports) come from the same bytes.

        Raises:
            FailedPrecondition: The file is missing or unreadable.
        """
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FailedPrecondition(f"tokenizer.json missing in {model_dir}", reason="BAD_MODEL_DIR")
        try:
            data = path.read_bytes()
            tok = Tokenizer.from_buffer(data)
        except Exception as exc:
            raise FailedPrecondition(f"tokenizer.json does not load: {exc}", reason="BAD_MODEL_DIR") from exc
        return cls(tok, split_marker, sha256_digest(data))

    def token_id(self, token: str) -> int | None:
        """The id of a token (special or not), if it is one token."""
        return self._tok.token_to_id(token)

    def min_tokens(self, text: str, *, above: int = 0) -> int:
        """A lower bound of ``len(encode(text))``, found without encoding (0 when none is known):
        :func:`text_floor` with this tokenizer's longest piece and normalizer.

        Every token stands for at most as many bytes of the (normalized) text as its vocabulary
        piece is long in UTF-8 bytes (a byte-level piece spells one byte per character; a
        ``▁`` or ``<0x0A>`` piece is longer than what it stands for). Only for vocabularies where
        no token stands for more than its piece: byte-level BPE (GPT-2, Qwen, Llama 3) or BPE with
        byte fallback; a vocabulary with an unknown-token piece has none (0).

        Args:
            text: The text.
            above: As :func:`text_floor`'s.
        """
        return text_floor(text, self._longest_piece(), above, self._normalize)

    @property
    def plain_floor_piece(self) -> int:
        """The longest piece (UTF-8 bytes) where :func:`text_floor` needs nothing else of this
        tokenizer to bound a text (it has no normalizer), else 0."""
        return self._longest_piece() if self._normalize is None else 0

    def _longest_piece(self) -> int:
        if self._max_piece is None:
            model = self._tok.model
            bounded = isinstance(self._tok.decoder, ByteLevel) or (isinstance(model, BPE) and model.byte_fallback)
            if not bounded or (isinstance(model, BPE) and model.unk_token and not model.byte_fallback):
                self._max_piece = 0
            else:
                vocab = self._tok.get_vocab(with_added_tokens=True)
                self._max_piece = max((len(piece.encode("utf-8", "surrogatepass")) for piece in vocab), default=0)
        return self._max_piece

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
        chunks.extend([marker + p for p in parts[1:]])
        get = cache.get
        got = [get(c) for c in chunks]
        missing = [c for c, g in zip(chunks, got, strict=True) if g is None]
        if missing:
            shared = self.shared
            fresh: dict[str, tuple[str, array[int], bytes]] = {}
            to_encode: list[str] = []
            for c in dict.fromkeys(missing):  # a chunk twice in one text is encoded once
                kept = shared.get(c) if len(c) >= shared.min_chars else None
                if kept is None:
                    to_encode.append(c)
                else:
                    fresh[c] = kept
            if to_encode:
                encoded = self._tok.encode_batch_fast(to_encode, add_special_tokens=False)
                for c, enc in zip(to_encode, encoded, strict=True):
                    ids = enc.ids
                    ids_arr, packed = array("i", ids), self.pack(ids)
                    fresh[c] = (c, ids_arr, packed)
                    shared.offer(c, ids_arr, packed)
            for c in missing:
                key, ids_arr, packed = fresh[c]
                cache.put(key, (ids_arr, packed))  # the shared key object: one copy of the text in memory
            got = [g if g is not None else fresh[c][1:] for c, g in zip(chunks, got, strict=True)]
        add_ids = out.ids.extend
        add_packed = out.parts.append
        n = 0
        for g in got:
            assert g is not None
            add_ids(g[0])
            add_packed(g[1])
            n += len(g[1])
        out.packed_len += n

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, also where they are part of a UTF-8 character.

        Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) spell each byte as one character of
        GPT-2's ``bytes_to_unicode`` table; added tokens (``<|im_end|>``) are their UTF-8 text.
        For other vocabularies, the token's own decoded text.
        """
        got = self._token_bytes.get(token_id)
        if got is None:
            piece = self._tok.id_to_token(token_id) or ""
            if isinstance(self._tok.decoder, ByteLevel) and all(c in _BYTE_OF for c in piece):
                got = bytes(_BYTE_OF[c] for c in piece)
            else:
                got = self._tok.decode([token_id], skip_special_tokens=False).encode()
            self._token_bytes[token_id] = got
        return got

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
