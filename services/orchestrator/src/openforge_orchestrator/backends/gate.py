"""The host end of a local sandbox's proxy socket: requests re-framed, the key bound to the sandbox.

Every local sandbox has its own unix socket to the proxy (``backends/local.py``), so what comes
in on it comes from that sandbox and no other. :class:`RequestGate` serves that socket: it reads
each HTTP/1.1 request, refuses one that presents any key but its own sandbox's (``403``,
before the proxy sees it), and forwards the rest to the proxy's TCP address; responses pass
back untouched (streamed). A rollout's key is therefore good only from inside its own sandbox
(and from the host, which runs the orchestrator): a key read by another sandbox opens nothing.

Soundness rests on the gate and the proxy agreeing where each request ends; otherwise a second
request, with another key, could ride inside a body the gate let through. So the gate never
passes on the harness's head or chunk framing bytes as they came: it parses a strict subset of
HTTP/1.1 (RFC 9112), answers anything outside it with ``400`` and closes, and writes upstream a
canonical form of what it parsed: ``METHOD SP target SP version CRLF``, ``Name: value CRLF``
per field, the body framed by its one ``Content-Length`` or re-chunked without extensions or
trailers. Such a request has one reading for any conforming parser. Refused outright: a
request with both ``Content-Length`` and ``Transfer-Encoding``, several ``Content-Length``, any
transfer coding but ``chunked``, obsolete line folding, bare CR or LF, control characters,
``Upgrade``, ``CONNECT``, and a repeated key field (``Authorization``, ``x-api-key``).

The keys checked are the ones the proxy reads (``x-api-key``, else ``Authorization: Bearer``):
every one present must be the sandbox's own; a request with none passes (the proxy answers it
401 where a key is needed). A refused request ends its connection: with the refusal as the
answer when it was the connection's first request, else (a response to an earlier one could
be half sent) by closing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

#: Longest request head (request line and fields), bytes; also the stream reader's limit.
MAX_HEAD = 64 * 1024
_COPY = 64 * 1024
_METHOD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/1\.[01]")
_NAME = _METHOD
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
_KEY_FIELDS = (b"authorization", b"x-api-key")

LOG_REFUSED = "sandbox.proxy_request_refused"


class Refusal(Exception):
    """A request the gate does not forward: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _ClientGone(Exception):
    """The sandbox side ended inside a request."""


@dataclass(frozen=True)
class Request:
    """One parsed request head.

    Attributes:
        method: The method.
        target: The request target.
        version: ``HTTP/1.1`` or ``HTTP/1.0``.
        fields: ``(name, value)`` in order, values without surrounding whitespace.
        length: Body bytes when framed by ``Content-Length`` (0 when there is no body).
        chunked: The body is chunked (``length`` is then 0).
    """

    method: bytes
    target: bytes
    version: bytes
    fields: tuple[tuple[bytes, bytes], ...]
    length: int
    chunked: bool

    def serialize(self) -> bytes:
        """The canonical head: request line, one ``Name: value`` line per field, blank line."""
        lines = [b"%s %s %s" % (self.method, self.target, self.version)]
        lines += [b"%s: %s" % field for field in self.fields]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def keys(self) -> list[bytes]:
        """The keys presented the way the proxy reads them.

        Raises:
            Refusal: A key field is repeated (which one the proxy takes would be a guess).
        """
        seen: dict[bytes, bytes] = {}
        for name, value in self.fields:
            low = name.lower()
            if low in _KEY_FIELDS:
                if low in seen:
                    raise Refusal(400, f"repeated {low.decode()} field")
                seen[low] = value
        keys = [seen.get(b"x-api-key", b"")]
        auth = seen.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            keys.append(auth[7:].strip(b" \t"))
        return [k for k in keys if k]


def parse_head(head: bytes) -> Request:
    """Parses a request head (ending in an empty line) in the gate's strict subset of HTTP/1.1.

    Raises:
        Refusal: Anything outside the subset (see the module docstring), status 400 or 501.
    """
    lines = head.split(b"\r\n")
    if lines[-2:] != [b"", b""] or any(b"\r" in line or b"\n" in line for line in lines):
        raise Refusal(400, "malformed request head (bare CR or LF)")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _METHOD.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise Refusal(400, "malformed request line")
    method, target, version = parts
    if not _VERSION.fullmatch(version):
        raise Refusal(505, "only HTTP/1.1 and HTTP/1.0 are bridged")
    if method == b"CONNECT":
        raise Refusal(501, "CONNECT is not bridged")
    fields: list[tuple[bytes, bytes]] = []
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for line in lines[1:-2]:
        name, colon, value = line.partition(b":")
        if not colon or not _NAME.fullmatch(name):
            raise Refusal(400, "malformed header field (or obsolete line folding)")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise Refusal(400, "control character in a header field")
        low = name.lower()
        if low == b"content-length":
            lengths.append(value)
        elif low == b"transfer-encoding":
            codings.append(value)
        elif low == b"upgrade":
            raise Refusal(400, "protocol upgrades are not bridged")
        fields.append((name, value))
    if codings:
        if lengths or len(codings) != 1 or codings[0].lower() != b"chunked" or version != b"HTTP/1.1":
            raise Refusal(501, "only one Transfer-Encoding: chunked (and no Content-Length) is bridged")
        return Request(method, target, version, tuple(fields), 0, True)
    if len(lengths) > 1 or (lengths and not (lengths[0].isdigit() and len(lengths[0]) <= 18)):
        raise Refusal(400, "one Content-Length of decimal digits is needed")
    return Request(method, target, version, tuple(fields), int(lengths[0]) if lengths else 0, False)


def _refusal_response(refusal: Refusal) -> bytes:
    body = b'{"type":"error","error":{"type":"%s","message":"%s"}}' % (
        b"permission_error" if refusal.status == 403 else b"invalid_request_error",
        refusal.message.replace("\\", "\\\\").replace('"', '\\"').encode(),
    )
    reason = {400: b"Bad Request", 403: b"Forbidden", 431: b"Request Header Fields Too Large"}.get(
        refusal.status, b"Refused"
    )
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        refusal.status,
        reason,
        len(body),
        body,
    )


class RequestGate:
    """Serves one sandbox's proxy socket (see the module docstring).

    Args:
        key: The sandbox's rollout key; empty = the sandbox has none, so any key is refused.
        proxy_host: The proxy's HTTP host.
        proxy_port: The proxy's HTTP port.
        rollout_id: For the log.
        connect_timeout_s: Longest wait for the proxy's TCP connection, seconds.
    """

    def __init__(
        self, key: str, proxy_host: str, proxy_port: int, rollout_id: str = "", connect_timeout_s: float = 10.0
    ) -> None:
        self._key = key.encode()
        self._host, self._port = proxy_host, proxy_port
        self._rollout_id = rollout_id
        self._connect_timeout_s = connect_timeout_s
        #: Connections accepted.
        self.connections = 0
        #: Requests refused (a foreign key, or outside the bridged subset).
        self.refused = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def cancel(self) -> None:
        """Ends every connection still open (the sandbox is gone)."""
        for task in list(self._tasks):
            task.cancel()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serves one connection from the sandbox until either side ends it.

        The ``client_connected_cb`` of ``asyncio.start_unix_server`` (with ``limit=MAX_HEAD``).
        """
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        back: asyncio.Task[None] | None = None
        try:
            try:
                up_reader, up = await asyncio.wait_for(
                    asyncio.open_connection(self._host, self._port), self._connect_timeout_s
                )
            except (OSError, TimeoutError):
                return
            up_writer = up
            back = asyncio.create_task(self._pump(up_reader, writer))
            forwarded = [0]
            try:
                refusal = await self._requests(reader, up, forwarded)
            except (_ClientGone, ConnectionError, OSError):
                return
            if refusal is None:  # the sandbox side is done sending: pass the half-close on
                with contextlib.suppress(OSError, RuntimeError):
                    up.write_eof()
                await back
                return
            self.refused += 1
            log.warning(LOG_REFUSED, rollout_id=self._rollout_id, status=refusal.status, reason=refusal.message)
            back.cancel()
            if not forwarded[0]:  # else a response may be half sent: the connection just ends
                with contextlib.suppress(OSError, RuntimeError):
                    writer.write(_refusal_response(refusal))
                    await writer.drain()
        finally:
            if back is not None:
                back.cancel()
            for w in (up_writer, writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _requests(
        self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, forwarded: list[int]
    ) -> Refusal | None:
        """Forwards requests until the sandbox side ends (None) or one is refused; counts them."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial.strip(b"\r\n"):
                    raise _ClientGone from None
                return None
            except asyncio.LimitOverrunError:
                return Refusal(431, f"request head over {MAX_HEAD} bytes")
            while head.startswith(b"\r\n"):  # empty lines before a request line are ignored (RFC 9112 2.2)
                head = head[2:]
            if not head:
                continue
            try:
                request = parse_head(head)
                if any(not hmac.compare_digest(k, self._key) for k in request.keys()):
                    raise Refusal(403, "this key does not belong to this sandbox")
                up.write(request.serialize())
                forwarded[0] += 1
                if request.chunked:
                    await self._chunks(reader, up)
                else:
                    await self._copy(reader, up, request.length)
            except Refusal as refusal:  # after a partial request upstream too: the connection ends
                return refusal
            await up.drain()

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, up: asyncio.StreamWriter, n: int) -> None:
        while n:
            data = await reader.read(min(n, _COPY))
            if not data:
                raise _ClientGone
            up.write(data)
            await up.drain()
            n -= len(data)

    async def _chunks(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        """Re-chunks a chunked body: sizes in lower-case hex, no extensions, no trailer fields."""
        while True:
            line = await self._line(reader)
            size_text = line.split(b";", 1)[0].strip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise Refusal(400, "malformed chunk size")
            size = int(size_text, 16)
            if size == 0:
                while await self._line(reader):  # trailer fields: dropped
                    pass
                up.write(b"0\r\n\r\n")
                return
            up.write(b"%x\r\n" % size)
            await self._copy(reader, up, size)
            try:
                end = await reader.readexactly(2)
            except asyncio.IncompleteReadError:
                raise _ClientGone from None
            if end != b"\r\n":
                raise Refusal(400, "chunk data longer than its size")
            up.write(b"\r\n")

    @staticmethod
    async def _line(reader: asyncio.StreamReader) -> bytes:
        """One CRLF-ended line without its CRLF.

        Raises:
            Refusal: A bare CR or LF, or a line over :data:`MAX_HEAD`.
        """
        try:
            line = (await reader.readuntil(b"\r\n"))[:-2]
        except asyncio.IncompleteReadError:
            raise _ClientGone from None
        except asyncio.LimitOverrunError:
            raise Refusal(400, "chunk line too long") from None
        if b"\r" in line or b"\n" in line or b"\0" in line:
            raise Refusal(400, "bare CR or LF in a chunk line")
        return line

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Responses back to the sandbox, as they come; the sandbox side closes when the proxy's does."""
        try:
            while chunk := await src.read(_COPY):
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
