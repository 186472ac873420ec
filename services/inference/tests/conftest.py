"""Fixtures of the inference engine tests: the 1m tiny model (built once per session), perturbed
checkpoints standing in for a trainer's, and engines running on a private event loop thread.

An engine lives on one event loop for its whole life (vLLM's output handler is a task of the
loop that first used it), so engine fixtures own a loop on a background thread and tests run
coroutines on it with ``harness.run(coro)``; the tests themselves stay plain ``def`` functions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

#: Seconds a single coroutine may take on the engine loop before the test fails.
RUN_TIMEOUT_S = 240.0


class LoopThread:
    """An asyncio event loop running on a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = RUN_TIMEOUT_S) -> T:
        """Runs ``coro`` on the loop and returns its result (re-raising its exception)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        """Stops the loop and joins the thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 1m tiny model (random init, seed 0), built once per session."""
    pytest.importorskip("torch", reason="the tiny model needs torch (requirements/inference-cpu.txt)")
    pytest.importorskip("transformers", reason="needs transformers (requirements/inference-cpu.txt)")
    from openforge_inference.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny1m"), size="1m", seed=0)


@pytest.fixture(scope="session")
def checkpoint_factory(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``make(seed) -> Path``: a perturbed copy of the tiny model (cached per seed)."""
    from openforge_inference.tiny_model import perturb_checkpoint

    cache: dict[int, Path] = {}

    def make(seed: int) -> Path:
        if seed not in cache:
            out = tmp_path_factory.mktemp(f"ckpt{seed}")
            cache[seed] = perturb_checkpoint(tiny_model_dir, out, seed=seed, scale=0.5)
        return cache[seed]

    return make


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    """One background event loop for every engine of the session."""
    thread = LoopThread()
    yield thread
    thread.close()
