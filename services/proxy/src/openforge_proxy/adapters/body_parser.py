"""Large request bodies parsed in a separate process.

A worker thread does not take the parse of a large body off the event loop: ``orjson`` holds
the interpreter lock for the whole of a call, about 100-300 ms for a 30 MiB body on two busy
cores, and every other session's call waits that long. :class:`ProcessBodyParser` sends the
body to a child process (``python -m openforge_proxy.adapters.body_parser``), which parses it
with :func:`~openforge_proxy.domain.json_text.parse_object` (the reference every other body is
parsed with) and sends back the result pickled. Here only the pickle is loaded: far less work
than the parse (no JSON grammar, no escapes; a string is one UTF-8 decode), and the bytes are
moved by a worker thread with the lock released (``os.write``/``os.readv`` into an anonymous
``mmap``, whose pages are touched by the kernel's copy, not by a ``memset`` under the lock).

A body sent with a :class:`~openforge_proxy.domain.screen.Screen` is also screened there
(:func:`~openforge_proxy.domain.screen.screen`): where its prompt cannot fit, only the
:class:`~openforge_proxy.domain.screen.TooLong` comes back, and the proxy never builds its
strings (a fresh 30 MiB string is 15-20 ms of page faults under the interpreter lock).

Framing, both ways: 8 bytes of little-endian length, then that many bytes. Request: ``pickle``
of the screen (or None), then the body. Reply: ``pickle`` of ``(parsed, fixed, None, None)``,
``fixed`` the recorded body when it differs from the one sent (lone surrogates replaced) else
None; ``(None, None, error, None)``, ``error`` an
:class:`~openforge_proxy.domain.output.ApiError`'s ``(kind, message, status)``; or
``(None, None, None, too_long)``.

The child runs at a lower CPU priority (:data:`NICENESS`): where cores are short, the proxy's
own process, which serves every other session, runs first. One body is parsed at a time (one
child). If the child cannot be started, dies, or has not answered within ``timeout_s`` (it is
then killed), the body is parsed in this process instead (in a worker thread, as without this
parser) and a new child is started for the next one: a failing child costs time, never an
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import pickle
import signal
import subprocess
import sys
import threading
from typing import IO, Any

import structlog

from openforge_proxy.domain.json_text import parse_object
from openforge_proxy.domain.output import ApiError, ErrorKind
from openforge_proxy.domain.screen import Screen, TooLong, screen

log = structlog.get_logger(__name__)

EV_PARSER_FAILED = "body_parser.failed"

_HEAD = 8
#: How much lower than the proxy's the child's CPU priority is (``nice``).
NICENESS = 10
#: Default most seconds a body may take in the child (from being sent to its reply being read).
TIMEOUT_S = 30.0
#: The child's recursion limit: pickling a value takes a level per nesting level, and
#: ``orjson`` parses up to 1023 (the interpreter's default limit is 1000).
_RECURSION_LIMIT = 4096
_Reply = tuple[dict[str, Any] | None, bytes | None, tuple[str, str, int] | None, TooLong | None]


class ParserGone(Exception):
    """The child process could not be reached (not started, exited, or its pipe broke)."""


class ProcessBodyParser:
    """:class:`~openforge_proxy.domain.admission.BodyParser` in a child process.

    Args:
        min_bytes: Bodies from this size (bytes) are parsed in the child; smaller ones are
            left to the caller (:attr:`min_bytes`).
        timeout_s: Most seconds a body may take in the child; then the child is killed and
            the body parsed in this process.
    """

    def __init__(self, min_bytes: int, timeout_s: float = TIMEOUT_S) -> None:
        self.min_bytes = min_bytes
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = asyncio.Lock()
        self._start_lock = threading.Lock()
        # guards ``_proc`` against ``_busy``: a child whose pipes an exchange is using is not
        # closed under it (its descriptors could be reused meanwhile), only killed
        self._io_lock = threading.RLock()
        self._busy: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it is started or once it is stopped)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Starts the child now (else on the first body); blocking, so call it in a thread."""
        with self._io_lock, self._start_lock:
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:  # it exited: its pipes go
                    self.close()
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", __name__],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    bufsize=0,
                )

    def warm(self) -> bool:
        """Starts the child ahead of the first large body; False (logged) when it cannot be
        started, and large bodies are then parsed in this process until one can. Blocking."""
        try:
            self.start()
        except OSError as exc:
            log.warning(EV_PARSER_FAILED, error=f"the body parser cannot be started: {exc!r}")
            return False
        return True

    async def parse(self, body: bytes, call: Screen | None = None) -> tuple[dict[str, Any], bytes] | TooLong:
        """The body parsed as :func:`~openforge_proxy.domain.json_text.parse_object` parses it,
        or, with ``call``, :func:`~openforge_proxy.domain.screen.screen`'s refusal where it has one.

        Raises:
            ApiError: As ``parse_object`` raises it (the same kind, message and status).
        """
        async with self._lock:
            future = asyncio.ensure_future(asyncio.to_thread(self._exchange, body, call))
            # a child that has not answered by then is killed: its exchange ends, and the body
            # is parsed here instead
            deadline = asyncio.get_running_loop().call_later(self.timeout_s, self._kill_hung)
            try:
                reply = await asyncio.shield(future)
            except asyncio.CancelledError:
                # the child's reply is still read, however often this is cancelled: the next
                # body's exchange starts after this one's ended, never beside it on the pipes
                while not future.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([future])
                raise
            finally:
                deadline.cancel()
                del future
        parsed, fixed, error, too_long = reply
        if too_long is not None:
            return too_long
        if error is not None:
            kind, message, status = error
            raise ApiError(ErrorKind(kind), message, status=status)
        assert parsed is not None
        return parsed, body if fixed is None else fixed

    def close(self) -> None:
        """Stops the child (it exits when its input closes). While an exchange uses its pipes,
        the child is killed instead: the exchange then ends (its body is parsed here) and
        closes the pipes itself."""
        with self._io_lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            if proc is self._busy:
                proc.kill()
                return
        _stop(proc)

    def _kill_hung(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            log.warning(EV_PARSER_FAILED, error=f"no reply within {self.timeout_s:g} s: the child is killed")
            proc.kill()

    def _exchange(self, body: bytes, call: Screen | None) -> _Reply:
        proc = None
        try:
            with self._io_lock:
                self.start()
                proc = self._busy = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            out, inp = proc.stdin.fileno(), proc.stdout.fileno()
            head = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
            _write_all(out, len(head).to_bytes(_HEAD, "little") + head + len(body).to_bytes(_HEAD, "little"))
            _write_all(out, body)
            size = int.from_bytes(_read_exact(inp, _HEAD), "little")
            with mmap.mmap(-1, max(size, 1)) as buf:
                with memoryview(buf) as view:
                    _read_into(inp, view[:size])
                    reply: _Reply = pickle.loads(view[:size])
            return reply
        except Exception as exc:  # whatever the child did, the body still gets its answer
            log.warning(EV_PARSER_FAILED, error=repr(exc))
            self.close()
        finally:
            with self._io_lock:
                self._busy = None
                orphan = proc is not None and proc is not self._proc
            if orphan:  # closed while this exchange used its pipes: they are closed here
                assert proc is not None
                _stop(proc)
        # parsed here instead, with the reference (this thread: the caller awaits it)
        return _reply(body, None)


def _reply(body: bytes, call: Screen | None) -> _Reply:
    """The reply for ``body``: its parse (as ``parse_object``), its parse error, or, with
    ``call``, :func:`~openforge_proxy.domain.screen.screen`'s refusal."""
    try:
        parsed, recorded = parse_object(body)
    except ApiError as err:
        return None, None, (err.kind.value, err.message, err.status), None
    if call is not None and (too_long := screen(parsed, call)) is not None:
        return None, None, None, too_long
    return parsed, None if recorded is body else recorded, None, None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _write_all(fd: int, data: bytes) -> None:
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise ParserGone("the body parser's output ended")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _read_into(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:]])
        if not got:
            raise ParserGone("the body parser's output ended")
        done += got


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: reads bodies from ``inp`` and writes replies to ``out`` until ``inp``
    ends (the proxy closed it, or exited)."""
    while True:
        frames = []
        for _ in range(2):  # the screen, then the body
            head = inp.read(_HEAD)
            if len(head) < _HEAD:
                return
            size = int.from_bytes(head, "little")
            frames.append(inp.read(size))
            if len(frames[-1]) < size:
                return
        call: Screen | None = pickle.loads(frames[0])
        body = frames.pop()
        reply = _reply(body, call)
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        del reply, body
        out.write(len(data).to_bytes(_HEAD, "little"))
        out.write(data)
        out.flush()
        del data


if __name__ == "__main__":
    # a Ctrl-C in the proxy's terminal reaches the whole process group: the proxy stops this
    # child by closing its input
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # on a busy machine the proxy's own process (every other session's calls) runs first
    os.nice(NICENESS)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), _RECURSION_LIMIT))
    # replies go to a private copy of the output; anything else written to it goes to stderr
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, replies)
