"""pytest fixtures: free ports, a real NATS server, PostgreSQL, service processes.

* ``free_port``: a free TCP port on 127.0.0.1.
* ``nats_server``: a real ``nats-server`` (JetStream) for the session; tests
  isolate themselves by stream/consumer names or use ``nats_server_fn``.
* ``nats_server_fn``: a fresh server for one test.
* ``postgres_dsn``: ``OPENFORGE_TEST_POSTGRES_DSN`` (skips when unset).
* ``service_process``: factory starting ``python -m <module>`` with settings
  and waiting for SERVING; logs go to the test's tmp folder and are printed
  on start failure; every process is stopped at teardown.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import pytest

from openforge_testing.servers import NatsServer, ServiceProcess, free_port

# Plain asserts in the shared end-to-end checks get pytest's detailed messages too.
pytest.register_assert_rewrite("openforge_testing.rollouts")

POSTGRES_ENV = "OPENFORGE_TEST_POSTGRES_DSN"


@pytest.fixture(name="free_port")
def free_port_fixture() -> int:
    """A TCP port free on 127.0.0.1."""
    return free_port()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real NATS server with JetStream, shared by the test session."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def nats_server_fn(tmp_path: Path) -> Iterator[NatsServer]:
    """A real NATS server with JetStream for one test."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def postgres_dsn() -> str:
    """The DSN of a real PostgreSQL for tests; skips when the variable is unset."""
    dsn = os.environ.get(POSTGRES_ENV)
    if not dsn:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    return dsn


class ServiceFactory(Protocol):
    """``start(module, env, timeout_s=60.0) -> ServiceProcess`` (SERVING when it returns)."""

    def __call__(self, module: str, env: Mapping[str, str], timeout_s: float = 60.0) -> ServiceProcess: ...


@pytest.fixture
def service_process(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Starts services in their own processes; all are stopped at teardown."""
    started: list[ServiceProcess] = []

    def start(module: str, env: Mapping[str, str], timeout_s: float = 60.0) -> ServiceProcess:
        proc = ServiceProcess(module, env, tmp_path / "logs" / f"{module}-{len(started)}.log")
        started.append(proc)
        return proc.start(timeout_s)

    yield start
    for proc in reversed(started):
        proc.stop()
