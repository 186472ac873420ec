"""The orchestrator's composition root."""

from __future__ import annotations

from pathlib import Path

import grpc

from openforge.orchestrator.v1 import orchestrator_pb2, orchestrator_pb2_grpc
from openforge_core.events import EventBus
from openforge_orchestrator.adapters.events import NatsRolloutEvents
from openforge_orchestrator.adapters.inference import InferencePolicy
from openforge_orchestrator.adapters.metrics import MeteredRolloutEvents, default_rollout_metrics
from openforge_orchestrator.adapters.proxy import ProxySessions
from openforge_orchestrator.backends import build_backend
from openforge_orchestrator.domain.execution import ExecutionSettings, RolloutExecutor
from openforge_orchestrator.domain.rollouts import RolloutRegistry, TaskRef
from openforge_orchestrator.domain.sandbox import SandboxBackend
from openforge_orchestrator.domain.scheduler import Scheduler
from openforge_orchestrator.domain.tasks import TaskCatalog
from openforge_orchestrator.harnesses.launches import LaunchFactory
from openforge_orchestrator.servicer import OrchestratorServicer
from openforge_orchestrator.settings import OrchestratorSettings


def backend_from_settings(settings: OrchestratorSettings) -> SandboxBackend:
    """The sandbox backend ``settings.sandbox.backend`` names, configured."""
    if settings.sandbox.backend == "kubernetes":
        return build_backend("kubernetes", settings.sandbox.kubernetes)
    return build_backend(settings.sandbox.backend, settings.sandbox.local, settings.harness.proxy_http)


def launches_from_settings(settings: OrchestratorSettings) -> LaunchFactory:
    """Harness launches: from local installs, or (Kubernetes) from the harness images."""
    if settings.sandbox.backend == "kubernetes":
        return LaunchFactory(None, settings.harness.command, dict(settings.sandbox.kubernetes.harness_images))
    return LaunchFactory(
        Path(settings.harness.install_dir), settings.harness.command, config_files=settings.harness.config_files
    )


class OrchestratorApp:
    """Builds the registry, scheduler, sandbox backend and clients; ready once NATS is connected."""

    def __init__(self, settings: OrchestratorSettings) -> None:
        self.service_names = [orchestrator_pb2.DESCRIPTOR.services_by_name["OrchestratorService"].full_name]
        self.settings = settings
        self.events = EventBus(settings.nats)
        metrics = default_rollout_metrics()
        facts = NatsRolloutEvents(self.events)
        self.rollouts = RolloutRegistry(MeteredRolloutEvents(facts, metrics))
        self.tasks = TaskCatalog(Path(settings.tasks.root))
        self.backend = backend_from_settings(settings)
        self.sessions = ProxySessions(settings.services.proxy)
        self.policy = InferencePolicy(settings.services.inference)
        launches = launches_from_settings(settings)
        s = settings.scheduler
        self.executor = RolloutExecutor(
            self.rollouts,
            self.tasks,
            self.backend,
            self.sessions,
            launches,
            self.policy,
            ExecutionSettings(
                max_infra_attempts=s.max_infra_attempts,
                policy_wait_s=s.policy_wait_s,
                session_grace_s=s.session_grace_s,
                retry_backoff_s=s.retry_backoff_s,
                retry_backoff_max_s=s.retry_backoff_max_s,
            ),
            manifests=facts,
        )
        self.scheduler = Scheduler(
            self.rollouts,
            self.executor,
            max_concurrent=s.max_concurrent,
            max_per_task=s.max_per_task,
            validate_task=self._validate_task,
            validate_harness=launches.check_installed,
        )
        metrics.watch_queue(lambda: self.scheduler.running, lambda: self.scheduler.waiting)

    def _validate_task(self, ref: TaskRef) -> None:
        self.tasks.get(ref.task_set, ref.task_id)

    def register(self, server: grpc.aio.Server) -> None:
        orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server(
            OrchestratorServicer(self.rollouts, self.scheduler), server
        )

    async def start(self) -> None:
        await self.backend.start()
        await self.events.connect()
        await self.events.ensure_stream("orchestrator")

    async def drain(self) -> None:
        """Lets running rollouts finish (``scheduler.drain_s``) before the server stops."""
        await self.scheduler.drain(self.settings.scheduler.drain_s)

    async def close(self) -> None:
        await self.scheduler.close()
        await self.backend.close()
        await self.sessions.aclose()
        await self.policy.aclose()
        await self.events.close()
