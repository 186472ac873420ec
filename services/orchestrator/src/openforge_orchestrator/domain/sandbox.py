"""The sandbox backend interface: run one rollout's harness, then its verifier, then clean up.

A backend gets an :class:`ExecutionPlan` (the task, the harness launch the adapter built, the
timeouts) and returns an :class:`ExecutionResult`. It owns everything between: the private
filesystem with the task's workspace, network isolation with the proxy as the only way out,
resource limits, the timeout kill, the verifier run (also after a timeout), and removing
everything afterwards. Cancelling the coroutine stops the sandbox and cleans up.

Backends: ``local`` (bubblewrap, :mod:`openforge_orchestrator.backends.local`) and
``kubernetes`` (one Job per rollout, :mod:`openforge_orchestrator.backends.kubernetes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from openforge_orchestrator.domain.tasks import Task
from openforge_orchestrator.domain.verifier import Reward

#: Folder of the harness's HOME inside every sandbox.
SANDBOX_HOME = "/root"
#: Folder for files the orchestrator writes for the harness (configs), read-only to it.
SANDBOX_RUN = "/run/openforge"
#: Where the harness may keep its own logs/trajectory (kept as an artifact).
AGENT_LOGS = "/logs/agent"
#: Where the verifier writes reward.txt / reward.json (Harbor's path).
VERIFIER_LOGS = "/logs/verifier"
#: Where the task's tests are visible to the verifier (Harbor's path).
TESTS_DIR = "/tests"
#: Where an oracle run sees the task's solution (Harbor's path).
SOLUTION_DIR = "/solution"


class SandboxStartError(Exception):
    """The sandbox could not be created or the harness could not be started (infrastructure)."""


@dataclass(frozen=True)
class HarnessLaunch:
    """How to start a harness inside a sandbox (built by a harness adapter).

    Attributes:
        name: Harness name.
        argv: Command line; ``argv[0]`` is found on ``path_dirs`` then the sandbox's PATH.
        env: Environment (besides PATH and HOME, which the backend sets).
        files: Files to write before start: absolute path in the sandbox (under
            :data:`SANDBOX_HOME` or :data:`SANDBOX_RUN`) → content.
        install_dirs: Host folders with the harness install, visible read-only at the same path
            (local backend).
        path_dirs: Folders put first on PATH.
        image: Container image carrying the harness (Kubernetes backend).
        version: Installed version, for the run manifest.
        min_memory_mb: The harness's own footprint, MiB: its sandbox gets at least this much
            memory whatever the task asks (0: the task's limit alone).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    install_dirs: tuple[str, ...] = ()
    path_dirs: tuple[str, ...] = ()
    image: str = ""
    version: str = ""
    min_memory_mb: int = 0


@dataclass(frozen=True)
class ExecutionPlan:
    """One rollout's sandbox work.

    Attributes:
        rollout_id: The rollout (names the sandbox).
        task: The task.
        launch: The harness to run; None runs the task's oracle ``solution/solve.sh`` instead.
        agent_timeout_s: Time limit of the harness, seconds.
        verifier_timeout_s: Time limit of the verifier, seconds.
        with_proxy: Whether the proxy is reachable from the sandbox.
        run_verifier: Whether to run ``tests/test.sh`` after the harness.
        on_harness_exit: Awaited once the harness ended (before the verifier), e.g. to close
            the proxy session so its call count is final.
        api_key: The rollout's proxy key (also inside ``launch``): a backend that stores the
            launch outside its own process keeps every value holding it as a secret.
    """

    rollout_id: str
    task: Task
    launch: HarnessLaunch | None
    agent_timeout_s: float
    verifier_timeout_s: float
    with_proxy: bool = True
    run_verifier: bool = True
    on_harness_exit: Callable[[], Awaitable[None]] | None = None
    api_key: str = ""

    def memory_mb(self, default_mb: int) -> int:
        """The sandbox's memory limit, MiB: the task's (``default_mb`` when it names none),
        raised to the harness's :attr:`HarnessLaunch.min_memory_mb`."""
        task_mb = self.task.resources.memory_mb or default_mb
        return max(task_mb, self.launch.min_memory_mb if self.launch is not None else 0)


@dataclass(frozen=True)
class ExecutionResult:
    """What happened in the sandbox.

    Attributes:
        exit_code: The harness's exit status; None when it was killed (timeout).
        timed_out: The harness reached its time limit and was killed.
        start_latency_s: From the call to the harness process running, seconds.
        harness_s: Harness wall time, seconds.
        stdout_tail: End of the harness's stdout.
        stderr_tail: End of the harness's stderr.
        reward: The verifier's reward; None when it wrote none (see ``verifier_error``).
        verifier_output: End of the verifier's stdout and stderr.
        verifier_error: Why there is no reward (verifier timeout, no reward file...).
        blocked_destinations: Network destinations other than the proxy the harness tried,
            e.g. ``"tcp 203.0.113.7:443"`` or ``"udp 192.0.2.53:53 (dns example.com)"``.
        proxy_connections: Connections the harness opened to the proxy.
        artifacts: Where the harness output and logs were kept (empty when not kept).
        cpu_s: CPU time the harness's sandbox used, seconds; None where not accounted.
        peak_memory_bytes: The sandbox's highest memory use, bytes; None where not accounted.
    """

    exit_code: int | None
    timed_out: bool
    start_latency_s: float
    harness_s: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    reward: Reward | None = None
    verifier_output: str = ""
    verifier_error: str = ""
    blocked_destinations: tuple[str, ...] = ()
    proxy_connections: int = 0
    artifacts: str = ""
    cpu_s: float | None = None
    peak_memory_bytes: int | None = None


class SandboxBackend(Protocol):
    """Runs rollouts in sandboxes."""

    #: The proxy's base URL as a harness inside the sandbox reaches it (no trailing slash).
    proxy_base_url: str

    async def start(self) -> None:
        """Prepares the backend before the first rollout; removes what a crashed predecessor left.

        Raises:
            SandboxStartError: The backend's own folders cannot be used safely.
        """
        ...

    def sandbox_image(self, task: Task) -> str:
        """The image ``task``'s sandboxes run (for the run manifest); where they run none, a
        description of the sandbox (its program and version); "" when neither is known."""
        ...

    async def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        """Runs the harness (or the oracle), then the verifier; removes the sandbox.

        Raises:
            SandboxStartError: The sandbox could not be created or started.
            asyncio.CancelledError: Cancelled; the sandbox was stopped and removed.
        """
        ...

    async def close(self) -> None:
        """Releases clients and stops anything still running (its clean-up done)."""
        ...
