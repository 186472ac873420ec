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
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Mapping

import structlog
import zstandard
from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError

from openforge_proxy.domain.conversation import WireApi
from openforge_proxy.domain.handler import CallHandler, ClientGone, error_response, new_request_id
from openforge_proxy.domain.output import ApiError, ErrorKind
from openforge_proxy.domain.protocols import dumps

log = structlog.get_logger(__name__)

EV_HTTP_STARTED = "http.started"
EV_HTTP_STOPPED = "http.stopped"
EV_HTTP_ERROR = "http.handler_error"

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


class BodyTooLarge(Exception):
    """The (decoded) body exceeds the limit."""


class _Responder:
    """:class:`~openforge_proxy.domain.handler.Responder` over one aiohttp request."""

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
        resp.enable_chunked_encoding()
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


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request body, decoded per ``Content-Encoding``, at most ``limit`` bytes.

    Raises:
        BodyTooLarge: Over ``limit`` (before or after decoding).
        ValueError: Unknown encoding or corrupt compressed data.
    """
    declared = request.content_length
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if declared is not None and declared > limit and encoding in ("", "identity"):
        raise BodyTooLarge()
    if encoding in ("", "identity"):
        decode = None
    elif encoding in ("gzip", "x-gzip", "deflate"):
        z = zlib.decompressobj(wbits=47 if encoding != "deflate" else 15)

        def decode_zlib(chunk: bytes, room: int) -> bytes:
            out = z.decompress(chunk, room + 1)
            if z.unconsumed_tail:
                raise BodyTooLarge()
            return out

        decode = decode_zlib
    elif encoding == "zstd":
        zd = zstandard.ZstdDecompressor().decompressobj()

        def decode_zstd(chunk: bytes, room: int) -> bytes:
            return zd.decompress(chunk)

        decode = decode_zstd
    else:
        raise ValueError(f"unsupported Content-Encoding {encoding!r} (use gzip, deflate or zstd)")
    parts: list[bytes] = []
    size = 0
    raw = 0
    while True:
        chunk = await request.content.read(_READ)
        if not chunk:
            break
        raw += len(chunk)
        if raw > limit:
            raise BodyTooLarge()
        if decode is not None:
            try:
                chunk = decode(chunk, limit - size)
            except (zlib.error, zstandard.ZstdError) as exc:
                raise ValueError(f"corrupt {encoding} body: {exc}") from exc
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        parts.append(chunk)
    return b"".join(parts)


def route(path: str) -> tuple[str, str, WireApi | None] | None:
    """The route of a request path (prefix and ``/v1`` optional, query string excluded)."""
    p = path.rstrip("/")
    for suffix, method, wire in _ROUTES:
        if p.endswith(suffix):
            return suffix, method, wire
    return None


class HttpServer:
    """Serves the harness-facing APIs.

    Args:
        handler: The call core.
        host: Interface to bind.
        port: TCP port (0 = a free one).
        max_body_bytes: Largest decoded request body.
    """

    def __init__(self, handler: CallHandler, host: str, port: int, max_body_bytes: int) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self._limit = max_body_bytes
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def start(self) -> int:
        """Binds and serves; returns the bound port."""
        server = web.Server(
            self._handle,
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
        received = time.monotonic()
        found = route(request.path)
        if found is None:
            if request.method in ("GET", "HEAD") and request.path.rstrip("/") in ("", "/health", "/healthz"):
                return web.Response(text="ok")
            return _plain_error(WireApi.OPENAI_CHAT, ApiError(ErrorKind.NOT_FOUND, f"no route for {request.path}"))
        suffix, method, wire = found
        headers = {k.lower(): v for k, v in request.headers.items()}
        api = wire or (WireApi.ANTHROPIC_MESSAGES if "anthropic-version" in headers else WireApi.OPENAI_CHAT)
        if request.method != method:
            return _plain_error(
                api,
                ApiError(ErrorKind.NOT_FOUND, f"{request.method} {suffix} is not served (use {method})", status=405),
            )
        if wire is None:
            status, body = self._handler.models(headers)
            return web.Response(status=status, body=body, content_type="application/json")
        try:
            body = await read_body(request, self._limit)
        except BodyTooLarge:
            return _plain_error(api, ApiError(ErrorKind.TOO_LARGE, f"the request body exceeds {self._limit} bytes"))
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
        assert responder.response is not None
        return responder.response


def _plain_error(wire: WireApi, err: ApiError) -> web.Response:
    status, body, headers = error_response(wire, err, new_request_id())
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


__all__ = ["BodyTooLarge", "HttpServer", "dumps", "read_body", "route"]
