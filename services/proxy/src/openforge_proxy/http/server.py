"""The harness-facing HTTP server.

Stack choice: **aiohttp's low-level server** (``aiohttp.web.Server``: no
router, no middlewares, access log off) in the service's own asyncio loop,
beside the gRPC server. Why:

* *Latency*: requests are parsed by aiohttp's C ``llhttp`` parser and handed
  straight to one handler coroutine; nothing else runs per request. In the
  benchmark (``tools/bench/proxy_bench.py``) this costs well under a
  millisecond per call.
* *Correct streaming*: ``StreamResponse`` writes each SSE event as an HTTP/1.1
  chunk the moment it is produced (``Transfer-Encoding: chunked``,
  keep-alive), which is what all three harnesses were observed to accept;
  there is no buffering layer in between.
* *One event loop*: it embeds in the running loop (``ServerRunner`` /
  ``TCPSite``), so the HTTP handlers share the session registry and the
  gRPC channels with the control API without threads. uvicorn would install
  its own signal handling and granian runs its own workers, both at odds
  with the service's single graceful shutdown.

Routing is on the path's suffix, so base URLs with or without ``/v1`` and with
any prefix work (Claude Code keeps a base-path prefix and adds
``?beta=true``; OpenClaw's Anthropic adapter has no ``/v1``; reference §5.1);
the query string is ignored. Request bodies may be ``gzip``, ``deflate`` or
``zstd`` encoded; the size limit applies to the decoded body, read
incrementally (a small compressed body cannot expand past it).

Inputs are bounded the same way on every path, before anything is parsed:

* *size*: a declared ``Content-Length`` over the limit is refused unread; otherwise the body
  is read in pieces and refused (413) the moment it passes the limit;
* *time*: a request's line and headers must arrive within ``header_timeout_s`` of its first
  byte (of the connection's opening, for its first request), else the connection is closed
  (408 when some of it came); its body within ``body_timeout_s`` of the headers, else 408;
* *errors*: every error is in the caller's protocol shape (Anthropic's for the Messages
  paths and for clients that send Anthropic's headers, OpenAI's otherwise), also for unknown
  paths and for requests aiohttp cannot parse;
* *disconnects*: a client that goes away while its body is read is logged as
  ``http.client_gone`` (info, no traceback) and nothing of its request is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Mapping
from typing import IO, Any, cast

import structlog
import zstandard
from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError, ClientPayloadError
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from openforge_proxy.domain.call import ClientGone, error_response, new_request_id
from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.handler import CallHandler
from openforge_proxy.domain.offload import OFFLOAD_MIN_BYTES
from openforge_proxy.domain.output import ApiError, ErrorKind
from openforge_proxy.domain.protocols import dumps
from openforge_proxy.http.metrics import HttpMetrics, default_http_metrics

log = structlog.get_logger(__name__)

EV_HTTP_STARTED = "http.started"
EV_HTTP_STOPPED = "http.stopped"
EV_HTTP_ERROR = "http.handler_error"
EV_CLIENT_GONE = "http.client_gone"
EV_HEADER_TIMEOUT = "http.header_timeout"
EV_BODY_TIMEOUT = "http.body_timeout"
EV_BAD_REQUEST = "http.bad_request"

#: Default seconds for a request's line and headers to arrive.
HEADER_TIMEOUT_S = 10.0
#: Default seconds for a request's body to arrive once its headers did.
BODY_TIMEOUT_S = 60.0

_ROUTES: tuple[tuple[str, str, WireApi | None], ...] = (
    ("/messages/count_tokens", "POST", WireApi.ANTHROPIC_MESSAGES),
    ("/messages", "POST", WireApi.ANTHROPIC_MESSAGES),
    ("/responses", "POST", WireApi.OPENAI_RESPONSES),
    ("/chat/completions", "POST", WireApi.OPENAI_CHAT),
    ("/models", "GET", None),
)
_READ = 1 << 16
#: What writing to a client that went away raises.
_CLIENT_GONE = (ConnectionResetError, ClientConnectionResetError)
#: What reading the body of a client that went away raises (the connection was lost, or the
#: body ended before its declared length or last chunk).
_BODY_CUT = (ConnectionError, ClientConnectionResetError, ClientPayloadError, HttpProcessingError)


class BodyTooLarge(Exception):
    """The (decoded) body exceeds the limit."""


class _Responder:
    """:class:`~openforge_proxy.domain.call.Responder` over one aiohttp request."""

    def __init__(self, request: web.BaseRequest) -> None:
        self._request = request
        self.response: web.StreamResponse | None = None
        self._held = b""

    async def send_json(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        # written now, not when the handler returns: what the handler does next (its log
        # line) is not on the caller's wait
        resp = web.Response(status=status, body=body, content_type="application/json", headers=headers)
        self.response = resp
        with contextlib.suppress(*_CLIENT_GONE):  # the client went away
            await resp.prepare(self._request)
            await resp.write_eof()

    async def hold_json(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_type = "application/json"
        resp.content_length = len(body)
        self.response = resp
        self._held = body[-1:]
        with contextlib.suppress(*_CLIENT_GONE):  # the client went away
            await resp.prepare(self._request)
            await resp.write(body[:-1])

    async def release(self) -> None:
        assert self.response is not None
        with contextlib.suppress(*_CLIENT_GONE):
            await self.response.write(self._held)
            await self.response.write_eof()

    def client_gone(self) -> bool:
        transport = self._request.transport
        return transport is None or transport.is_closing()

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    async def begin_stream(self, headers: Mapping[str, str]) -> None:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **headers,
            },
        )
        if self._request.version >= (1, 1):
            resp.enable_chunked_encoding()
        else:  # HTTP/1.0 has no chunks: the stream ends when the connection closes
            resp.force_close()
        try:
            await resp.prepare(self._request)
        except _CLIENT_GONE as exc:
            raise ClientGone() from exc
        self.response = resp

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        try:
            await self.response.write(data)
        except _CLIENT_GONE as exc:
            raise ClientGone() from exc


class _Collected:
    """Decoded bytes gathered in order, refused as soon as they pass ``limit``."""

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self._limit = limit

    def write(self, data: bytes) -> int:
        """Appends ``data``; returns its length.

        Raises:
            BodyTooLarge: The bytes gathered so far exceed ``limit``.
        """
        self.size += len(data)
        if self.size > self._limit:
            raise BodyTooLarge()
        self.parts.append(bytes(data))
        return len(data)


class _ZlibDecoder:
    """``gzip`` (every member of a multi-member body) or ``deflate`` (one zlib stream) into a
    :class:`_Collected`, inflating at most the room left per call."""

    def __init__(self, encoding: str, out: _Collected, limit: int) -> None:
        self._gzip = encoding != "deflate"
        self._out = out
        self._limit = limit
        self._members = 1
        self._z = self._new(first=True)

    def _new(self, *, first: bool) -> zlib._Decompress:
        # the first gzip member may also be zlib-wrapped (auto-detected); later ones are gzip
        return zlib.decompressobj(wbits=(47 if first else 31) if self._gzip else 15)

    def feed(self, chunk: bytes) -> None:
        """Decodes one piece of the body.

        Raises:
            BodyTooLarge: The decoded body exceeds the limit.
            ValueError: Corrupt data, or data after the end of the (last) stream.
        """
        data = chunk
        while data:
            try:
                self._out.write(self._z.decompress(data, self._limit - self._out.size + 1))
            except zlib.error as exc:
                where = f" (member {self._members})" if self._members > 1 else ""
                raise ValueError(f"corrupt {self._name} body{where}: {exc}") from exc
            if self._z.unconsumed_tail:
                raise BodyTooLarge()
            if not self._z.eof:
                return
            data = self._z.unused_data
            if data and not self._gzip:
                raise ValueError("corrupt deflate body: data after the end of the deflate stream")
            if data:
                if data[:2] not in (b"\x1f\x8b", b"\x1f"):
                    raise ValueError(
                        f"corrupt gzip body: {len(data)} byte(s) after gzip member {self._members} "
                        "are not another gzip member"
                    )
                self._members += 1
                self._z = self._new(first=False)

    def finish(self) -> None:
        """Checks the body ended where its last stream ends.

        Raises:
            ValueError: The body stops inside a stream.
        """
        if not self._z.eof:
            raise ValueError(f"corrupt {self._name} body: truncated (the compressed stream does not end)")

    @property
    def _name(self) -> str:
        return "gzip" if self._gzip else "deflate"


class _ZstdDecoder:
    """``zstd`` (every frame of a multi-frame body) into a :class:`_Collected`, at most
    :data:`_READ` decoded bytes per write, so output past the limit is never held."""

    def __init__(self, out: _Collected) -> None:
        self._writer = zstandard.ZstdDecompressor().stream_writer(cast(IO[bytes], out), write_size=_READ)

    def feed(self, chunk: bytes) -> None:
        """Decodes one piece of the body.

        Raises:
            BodyTooLarge: The decoded body exceeds the limit.
            ValueError: Corrupt data, including data after the last frame that is no frame.
        """
        try:
            self._writer.write(chunk)
        except zstandard.ZstdError as exc:
            raise ValueError(f"corrupt zstd body: {exc}") from exc

    def finish(self) -> None:
        """Nothing to check: a body cut inside a frame decodes to its complete part."""


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request body, decoded per ``Content-Encoding``, at most ``limit`` bytes.

    A ``gzip`` body may hold several members and a ``zstd`` body several frames
    (decoded in order and joined); ``limit`` applies to their total. A body from
    :data:`~openforge_proxy.domain.offload.OFFLOAD_MIN_BYTES` is joined in a worker thread
    (``bytes.join`` of that much lets other threads run: the event loop is not held).

    Raises:
        BodyTooLarge: Over ``limit`` (before or after decoding).
        ValueError: Unknown or stacked encoding, corrupt compressed data, or data
            after the last gzip member / deflate stream / zstd frame.
    """
    declared = request.content_length
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if declared is not None and declared > limit and encoding in ("", "identity"):
        raise BodyTooLarge()
    out = _Collected(limit)
    decoder: _ZlibDecoder | _ZstdDecoder | None
    if encoding in ("", "identity"):
        decoder = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        decoder = _ZlibDecoder(encoding, out, limit)
    elif encoding == "zstd":
        decoder = _ZstdDecoder(out)
    else:
        raise ValueError(f"unsupported Content-Encoding {encoding!r} (use one of gzip, deflate or zstd)")
    raw = 0
    while True:
        chunk = await request.content.read(_READ)
        if not chunk:
            break
        raw += len(chunk)
        if raw > limit:
            raise BodyTooLarge()
        if decoder is None:
            out.write(chunk)
        else:
            decoder.feed(chunk)
    if decoder is not None and raw:
        decoder.finish()
    if len(out.parts) > 1 and out.size >= OFFLOAD_MIN_BYTES:
        return await asyncio.to_thread(b"".join, out.parts)
    return b"".join(out.parts)


def caller_api(path: str, headers: Mapping[str, str]) -> WireApi:
    """The protocol whose error shape a caller reads: Anthropic's for a Messages path or a client
    that sends Anthropic's headers (``anthropic-version``, ``anthropic-beta``, ``x-api-key``),
    else OpenAI's. ``headers`` as received (any case)."""
    found = route(path)
    if found is not None and found[2] is not None:
        return found[2]
    names = {k.lower() for k in headers}
    if names & {"anthropic-version", "anthropic-beta", "x-api-key"} or "/messages" in path:
        return WireApi.ANTHROPIC_MESSAGES
    return WireApi.OPENAI_CHAT


def route(path: str) -> tuple[str, str, WireApi | None] | None:
    """The route of a request path (prefix and ``/v1`` optional, query string excluded)."""
    p = path.rstrip("/")
    for suffix, method, wire in _ROUTES:
        if p.endswith(suffix):
            return suffix, method, wire
    return None


class _Connection(RequestHandler):
    """aiohttp's HTTP/1.1 connection, with a deadline for each request's line and headers and
    errors of aiohttp's own parser answered as JSON in the caller's shape.

    The deadline runs from the connection's opening (its first request) or from the first
    byte after the previous request was handled, so connections kept alive idle between calls
    (as harnesses keep them) are not affected; aiohttp's keep-alive timeout bounds those.
    """

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True  # bytes that arrive now begin a request
        self._partial = False  # bytes of the awaited request arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            self._partial = True
            if self._header_timer is None:
                self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def headers_received(self) -> None:
        """The handler got a request: its line and headers are in."""
        self._awaiting_headers = False
        self._partial = False
        self._disarm()

    def request_done(self) -> None:
        """The handler is done with its request: bytes from now on begin the next one."""
        self._awaiting_headers = True

    def _arm(self) -> None:
        if self._header_timeout > 0:
            self._header_timer = asyncio.get_running_loop().call_later(self._header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or getattr(self, "_messages", None):  # parsed, not yet handled
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        log.info(EV_HEADER_TIMEOUT, timeout_s=self._header_timeout, partial=self._partial)
        if self._partial:  # part of a request came: it is answered (the caller's shape is unknown)
            err = ApiError(
                ErrorKind.INVALID_REQUEST,
                f"the request line and headers did not arrive within {self._header_timeout:g} s",
                status=408,
            )
            status, body, headers = error_response(WireApi.OPENAI_CHAT, err, new_request_id())
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            transport.write(
                f"HTTP/1.1 {status} Request Timeout\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode()
                + body
            )
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's parser refused a request (400, 413, 431...): answered as JSON in the
        caller's shape and logged without a traceback. Other errors are aiohttp's."""
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        log.info(EV_BAD_REQUEST, status=status, error=message or str(exc))
        self._disarm()
        wire = caller_api(request.path, request.headers)
        resp = _plain_error(
            wire, ApiError(ErrorKind.INVALID_REQUEST, message or str(exc) or "bad request", status=status)
        )
        resp.force_close()
        return resp


class _Server(web.Server):
    """aiohttp's low-level server, its connections :class:`_Connection`."""

    def __init__(self, handler: Any, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._header_timeout_s = header_timeout_s

    def __call__(self) -> RequestHandler:
        return _Connection(self, header_timeout_s=self._header_timeout_s, loop=self._loop, **self._kwargs)


class HttpServer:
    """Serves the harness-facing APIs.

    Args:
        handler: The call core.
        host: Interface to bind.
        port: TCP port (0 = a free one).
        max_body_bytes: Largest decoded request body, bytes.
        header_timeout_s: Most seconds for a request's line and headers to arrive (0 = none).
        body_timeout_s: Most seconds for a request's body to arrive once its headers did
            (0 = none).
        metrics: Where answers are counted (default: the process's
            :func:`~openforge_proxy.http.metrics.default_http_metrics`).
    """

    def __init__(
        self,
        handler: CallHandler,
        host: str,
        port: int,
        max_body_bytes: int,
        *,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        metrics: HttpMetrics | None = None,
    ) -> None:
        self._handler = handler
        self._metrics = metrics or default_http_metrics()
        self._host = host
        self._port = port
        self._limit = max_body_bytes
        self._header_timeout = header_timeout_s
        self._body_timeout = body_timeout_s
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def start(self) -> int:
        """Binds and serves; returns the bound port."""
        server = _Server(
            self._handle,
            header_timeout_s=self._header_timeout,
            access_log=None,
            auto_decompress=False,
            max_field_size=65536,
            keepalive_timeout=3630,
        )
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port
        log.info(EV_HTTP_STARTED, address=f"{self._host}:{self.port}")
        return self.port

    async def stop(self) -> None:
        """Stops accepting, lets in-flight responses finish briefly, closes."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info(EV_HTTP_STOPPED)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if isinstance(connection, _Connection):
            connection.headers_received()
        t0 = time.monotonic()
        status = 500
        try:
            resp = await self._serve(request)
            status = resp.status
            return resp
        finally:
            found = route(request.path)
            harness = self._handler.harness_of(request.headers)
            self._metrics.observe(found[0] if found else "other", status, time.monotonic() - t0, harness)
            # a body left unread (refused while read) is read and dropped by aiohttp, then the
            # connection is closed: those bytes begin no request
            if isinstance(connection, _Connection) and request.content.is_eof():
                connection.request_done()

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        received = time.monotonic()
        found = route(request.path)
        if found is None:
            if request.method in ("GET", "HEAD") and request.path.rstrip("/") in ("", "/health", "/healthz"):
                return web.Response(text="ok")
            return _plain_error(
                caller_api(request.path, request.headers),
                ApiError(ErrorKind.NOT_FOUND, f"no route for {request.path}"),
            )
        suffix, method, wire = found
        headers = {k.lower(): v for k, v in request.headers.items()}
        api = caller_api(request.path, headers)
        if request.method != method:
            return _plain_error(
                api,
                ApiError(ErrorKind.NOT_FOUND, f"{request.method} {suffix} is not served (use {method})", status=405),
            )
        if wire is None:
            status, body = self._handler.models(headers)
            return web.Response(status=status, body=body, content_type="application/json")
        try:
            async with asyncio.timeout(self._body_timeout or None):
                body = await read_body(request, self._limit)
        except BodyTooLarge:  # aiohttp reads what is left of the body for a while, then closes
            return _plain_error(api, ApiError(ErrorKind.TOO_LARGE, f"the request body exceeds {self._limit} bytes"))
        except TimeoutError:
            log.info(EV_BODY_TIMEOUT, path=suffix, timeout_s=self._body_timeout)
            err = ApiError(
                ErrorKind.INVALID_REQUEST,
                f"the request body did not arrive within {self._body_timeout:g} s",
                status=408,
            )
            return await _answer_and_close(request, _plain_error(api, err))
        except _BODY_CUT as exc:  # the client went away (or cut its body short): nobody reads an answer
            log.info(EV_CLIENT_GONE, path=suffix, error=str(exc) or type(exc).__name__)
            err = ApiError(ErrorKind.INVALID_REQUEST, f"the request body could not be read: {exc}")
            return await _answer_and_close(request, _plain_error(api, err))
        except ValueError as exc:
            return _plain_error(api, ApiError(ErrorKind.INVALID_REQUEST, str(exc)))
        if suffix == "/messages/count_tokens":
            status, payload = await self._handler.count_tokens(body, headers)
            return web.Response(status=status, body=payload, content_type="application/json")
        responder = _Responder(request)
        try:
            await self._handler.handle(api, body, headers, responder, received=received)
        except Exception:
            log.exception(EV_HTTP_ERROR, path=suffix)
            if responder.response is None or not responder.response.prepared:
                return _plain_error(api, ApiError(ErrorKind.INTERNAL, "internal error"))
        if responder.response is None:  # the client left before anything was sent: nobody reads this
            return web.Response(status=499)
        return responder.response


def _plain_error(wire: WireApi, err: ApiError) -> web.Response:
    status, body, headers = error_response(wire, err, new_request_id())
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


async def _answer_and_close(request: web.BaseRequest, resp: web.Response) -> web.Response:
    """Sends ``resp``, then closes the connection: what is left of the request's body is not
    read (aiohttp would otherwise read and drop it for a while first)."""
    resp.force_close()
    with contextlib.suppress(*_CLIENT_GONE):
        await resp.prepare(request)
        await resp.write_eof()
    request.protocol.force_close()
    return resp


__all__ = ["BodyTooLarge", "HttpServer", "caller_api", "dumps", "read_body", "route"]
