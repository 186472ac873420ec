"""Orchestrator settings (``OPENFORGE_`` environment variables)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from openforge_core.harness_catalog import HARNESSES
from openforge_core.settings import ServiceSettings, SettingsSection


class TaskSettings(SettingsSection):
    """Where tasks come from (``OPENFORGE_TASKS__*``).

    Attributes:
        root: Folder whose sub-folders are task sets (``<root>/<task_set>/<task_id>/task.toml``,
            Harbor's task-folder format). A ``TaskRef.task_set`` names one of them.
    """

    root: str = "examples/tasks"


class SchedulerSettings(SettingsSection):
    """How many rollouts run at once and how often infrastructure failures are retried.

    Attributes:
        max_concurrent: Rollouts running at once over all tasks.
        max_per_task: Rollouts of one task running at once.
        max_infra_attempts: Attempts of one rollout when the sandbox fails to start or the
            harness dies before its first model call (a policy's failure is never retried).
        policy_wait_s: Longest wait for the served policy version to reach a rollout's
            ``min_policy_version`` before it fails, seconds.
        session_grace_s: Seconds the proxy key outlives the task timeout (verifier, cleanup).
        retry_backoff_s: Wait before an infrastructure retry's second attempt, seconds, doubled
            before each later one, with jitter (a uniform draw in [delay / 2, delay]); 0 retries
            at once.
        retry_backoff_max_s: Longest wait between two attempts, seconds.
        drain_s: On SIGTERM, how long running rollouts get to finish (verifier, events) before
            they are cancelled, seconds; rollouts still waiting for a slot or for their policy
            version are cancelled at once, and no new attempt starts (an infrastructure failure
            is not retried). Keep it below the process's stop grace (``openforge down``, the pod's
            ``terminationGracePeriodSeconds``) minus ``grpc.graceful_shutdown_s``.
    """

    max_concurrent: int = Field(default=32, ge=1)
    max_per_task: int = Field(default=16, ge=1)
    max_infra_attempts: int = Field(default=3, ge=1)
    policy_wait_s: float = Field(default=600.0, gt=0)
    session_grace_s: float = Field(default=120.0, ge=0)
    retry_backoff_s: float = Field(default=2.0, ge=0)
    retry_backoff_max_s: float = Field(default=30.0, ge=0)
    drain_s: float = Field(default=30.0, ge=0)


class LocalSandboxSettings(SettingsSection):
    """The ``local`` (bubblewrap) backend (``OPENFORGE_SANDBOX__LOCAL__*``).

    Attributes:
        bwrap: The ``bwrap`` executable (Debian package ``bubblewrap``).
        root: Folder holding one sub-folder per live sandbox (removed after each rollout).
        cache: Folder holding each task's prepared workspace (its Dockerfile's COPY/RUN done once).
        monitor_network: Record every connection attempt to an address other than the proxy
            (needs a user namespace with ``CAP_NET_ADMIN``/``CAP_NET_RAW`` inside it).
        memory_mb: Memory limit when the task sets none, MiB.
        cpus: CPU limit when the task sets none.
        pids: Most processes and threads in one sandbox.
        nofile: Most open files per process.
        artifacts: Folder receiving each rollout's harness output, agent logs and verifier
            logs (``<artifacts>/<rollout_id>/``) before its sandbox is removed; empty = keep none.
        build_timeout_s: Time limit of a task's ``RUN`` steps when its workspace is prepared.
        extra_ro_binds: Host paths made visible read-only at the same path (toolchains).
    """

    bwrap: str = "bwrap"
    root: str = ".openforge/sandboxes"
    cache: str = ".openforge/task-cache"
    monitor_network: bool = True
    memory_mb: int = Field(default=2048, gt=0)
    cpus: float = Field(default=1.0, gt=0)
    pids: int = Field(default=1024, gt=0)
    nofile: int = Field(default=4096, gt=0)
    artifacts: str = ".openforge/rollouts"
    build_timeout_s: float = Field(default=600.0, gt=0)
    extra_ro_binds: tuple[str, ...] = ()


#: Harness images per harness name, as ``deploy/harness/<name>/Dockerfile`` builds them.
DEFAULT_HARNESS_IMAGES: dict[str, str] = {name: h.image for name, h in HARNESSES.items()}


class KubernetesSandboxSettings(SettingsSection):
    """The ``kubernetes`` backend: one Job per rollout (``OPENFORGE_SANDBOX__KUBERNETES__*``).

    Attributes:
        namespace: Namespace of the rollout Jobs (``deploy/k8s/base/rollouts``).
        in_cluster: Use the pod's service account (running in the cluster); otherwise a kubeconfig.
        kubeconfig: Kubeconfig file when not in the cluster; empty = ``$KUBECONFIG`` or
            ``~/.kube/config``.
        context: Kubeconfig context; empty = the current one.
        proxy_url: The proxy's harness-facing HTTP base URL as a rollout pod reaches it (no ``/v1``);
            the orchestrator resolves its host when it creates a Job and writes it into the
            pod's ``/etc/hosts``: a rollout pod resolves no other name.
        proxy_namespace: Namespace of the proxy's pods (the NetworkPolicy's only egress target).
        proxy_pod_labels: Labels of the proxy's pods.
        harness_images: Harness name → image (``deploy/harness/*``); its install is copied from
            ``harness_root`` into the task container.
        harness_root: Folder of the harness install in every harness image.
        task_image: Image of a task that names no ``docker_image``: a template with ``{task_set}``
            and ``{task_id}`` (lower-cased), the image built from the task's ``environment/``.
        image_pull_policy: ``IfNotPresent``, ``Always`` or ``Never``.
        service_account: Service account of rollout pods (no API token is mounted).
        run_as_user: UID (and GID) every rollout container runs as.
        memory_mb: Memory limit when the task sets none, MiB.
        cpus: CPU limit when the task sets none.
        start_grace_s: Seconds a Job may take beyond the harness and verifier limits (scheduling,
            image pulls) before Kubernetes stops it (``activeDeadlineSeconds``).
        ttl_after_finished_s: Seconds a finished Job is kept if the orchestrator could not delete it.
        watch_timeout_s: Length of one watch request before it is renewed, seconds.
        log_tail_lines: Lines of the harness and verifier logs kept on the result.
        api_threads: Threads (and pooled connections) for API calls; each running rollout holds
            one while it watches its Job, so keep it above ``scheduler.max_concurrent``.
    """

    namespace: str = "openforge-rollouts"
    in_cluster: bool = False
    kubeconfig: str = ""
    context: str = ""
    proxy_url: str = "http://proxy.openforge.svc.cluster.local:8080"
    proxy_namespace: str = "openforge"
    proxy_pod_labels: dict[str, str] = Field(default_factory=lambda: {"app.kubernetes.io/name": "proxy"})
    harness_images: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_HARNESS_IMAGES))
    harness_root: str = "/usr/local/harness"
    task_image: str = "openforge/task-{task_set}-{task_id}:latest"
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    service_account: str = "rollout"
    run_as_user: int = Field(default=10001, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    cpus: float = Field(default=1.0, gt=0)
    start_grace_s: int = Field(default=300, ge=0)
    ttl_after_finished_s: int = Field(default=600, ge=0)
    watch_timeout_s: int = Field(default=60, gt=0)
    log_tail_lines: int = Field(default=200, gt=0)
    api_threads: int = Field(default=128, ge=2)


class SandboxSettings(SettingsSection):
    """Which sandbox backend runs rollouts (``OPENFORGE_SANDBOX__*``).

    Attributes:
        backend: ``local`` (bubblewrap on this machine) or ``kubernetes`` (one Job per rollout).
        local: The local backend.
        kubernetes: The Kubernetes backend.
    """

    backend: Literal["local", "kubernetes"] = "local"
    local: LocalSandboxSettings = LocalSandboxSettings()
    kubernetes: KubernetesSandboxSettings = KubernetesSandboxSettings()


class HarnessSettings(SettingsSection):
    """Where harnesses are installed and how the proxy is reached (``OPENFORGE_HARNESS__*``).

    Attributes:
        install_dir: Folder ``openforge harness install`` filled (``<dir>/<name>/manifest.json``).
        proxy_http: ``host:port`` of the proxy's harness-facing HTTP server as this process
            reaches it (the local backend bridges each sandbox to it).
        command: Default argv template of the ``command`` harness (placeholders in
            :mod:`openforge_orchestrator.harnesses.command`).
        config_files: Harness name → a settings file layered over the harness's own defaults
            (mini-swe-agent: ``-c mini.yaml -c FILE``, the file's text written into each
            sandbox, e.g. a shorter system prompt; browser: a JSON object with ``api``, one of
            chat, messages, responses, and ``max_steps``). Other harnesses are refused at start.
    """

    install_dir: str = ".openforge/harnesses"
    proxy_http: str = "127.0.0.1:8080"
    command: tuple[str, ...] = ()
    config_files: dict[str, str] = Field(default_factory=dict)


class OrchestratorSettings(ServiceSettings):
    """Settings of the orchestrator.

    Attributes:
        tasks: Where tasks come from.
        scheduler: Concurrency and retries.
        sandbox: The sandbox backend.
        harness: Harness installs and the proxy's address.
    """

    service_name: ClassVar[str] = "orchestrator"

    tasks: TaskSettings = TaskSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    sandbox: SandboxSettings = SandboxSettings()
    harness: HarnessSettings = HarnessSettings()
