"""Stop signals of the CLI's long commands: Ctrl-C, SIGTERM and SIGHUP (the terminal closing)
stop a phase in order, awaitable in each phase's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any


class StopSignal:
    """Whether Ctrl-C/SIGTERM was seen, awaitable in each event loop in turn (one per phase: an
    ``asyncio.Event`` belongs to the loop that first waits on it, so each ``asyncio.run`` binds a
    new one)."""

    def __init__(self) -> None:
        self.requested = False
        self._event: asyncio.Event | None = None

    def bind(self) -> None:
        """Makes a new event for the running loop (set already if a stop was requested)."""
        self._event = asyncio.Event()
        if self.requested:
            self._event.set()

    def set(self) -> None:
        """Requests the stop."""
        self.requested = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self.requested

    async def wait(self) -> None:
        """Returns once a stop is requested (call :meth:`bind` in this loop first)."""
        if self._event is None:
            self.bind()
        assert self._event is not None
        await self._event.wait()


def own_command() -> str:
    """How this CLI was invoked (``.venv/bin/openforge`` from ``make``), to print commands that work
    as printed; ``openforge`` when that cannot be told."""
    exe = Path(sys.argv[0])
    return str(exe) if exe.name == "openforge" else "openforge"


#: The signals that stop a run cleanly (resumable): Ctrl-C, ``kill``, the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_async(coro_fn: Any, stop: StopSignal | None = None) -> Any:
    """Runs a coroutine with SIGINT/SIGTERM/SIGHUP (a closed terminal) setting ``stop`` instead
    of raising: the run stops at a step boundary, resumable, and the services are stopped."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if stop is not None:
            stop.bind()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, stop.set)
        try:
            return await coro_fn()
        finally:
            if stop is not None:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
                interrupt_on_stop_signals()  # removing a loop's handler resets the default action

    return asyncio.run(main())


def interrupt_on_stop_signals() -> None:
    """Outside a phase's event loop, every stop signal raises ``KeyboardInterrupt`` as Ctrl-C
    does, so the paths that stop the services run (the default action of SIGHUP and SIGTERM
    would end the process and leave them running)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler)


async def unless_stopped(coro: Coroutine[Any, Any, None], stop: StopSignal) -> None:
    """Runs ``coro`` unless ``stop`` is set first (then it is cancelled; nothing is recorded)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return
    task.result()
