"""Work on a large request in a worker thread without starving the event loop: :func:`off_loop`,
and the interpreter's switch interval while such work runs."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

from openforge_proxy.domain.output import ApiError

#: Request bodies from this size (bytes) are parsed, rendered and tokenized in a worker thread,
#: so that other sessions' calls are served meanwhile.
OFFLOAD_MIN_BYTES = 1 << 20


#: The interpreter's thread switch interval (seconds; CPython's default is 0.005) while such a
#: conversion runs: the event loop waits at most this long for the interpreter lock each time
#: it takes it back from the worker (it does so at every system call), not 5 ms.
OFFLOAD_SWITCH_INTERVAL_S = 0.0005


_T = TypeVar("_T")


class _SwitchInterval:
    """Sets the interpreter's switch interval to :data:`OFFLOAD_SWITCH_INTERVAL_S` while at least
    one worker conversion runs, and back to what it was after the last (event loop thread only)."""

    def __init__(self) -> None:
        self._running = 0
        self._previous = 0.0

    def enter(self) -> None:
        if self._running == 0:
            self._previous = sys.getswitchinterval()
            sys.setswitchinterval(min(self._previous, OFFLOAD_SWITCH_INTERVAL_S))
        self._running += 1

    def leave(self) -> None:
        self._running -= 1
        if self._running == 0:
            sys.setswitchinterval(self._previous)


_switching = _SwitchInterval()


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread. If the caller is cancelled meanwhile, it still waits for
    the thread to end (what it touches is not used by two threads at once), then re-raises.

    An :class:`ApiError` from ``fn`` is raised again here without the worker's traceback: that
    traceback's frames hold the request (tens of MiB for a large one) and, through the futures
    that carried the error, would form a reference cycle only a full collection frees.
    """

    def call() -> tuple[_T | None, ApiError | None]:
        try:
            return fn(*args), None
        except ApiError as exc:
            return None, ApiError(exc.kind, exc.message, status=exc.status, retry_after_s=exc.retry_after_s)

    future = asyncio.ensure_future(asyncio.to_thread(call))
    _switching.enter()
    try:
        result, err = await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await future
        raise
    finally:
        _switching.leave()
        del future
    if err is not None:
        try:
            raise err
        finally:  # the frame would hold the error its traceback holds the frame of
            del err
    return cast(_T, result)
