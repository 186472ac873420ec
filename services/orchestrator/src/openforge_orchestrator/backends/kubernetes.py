"""The ``kubernetes`` sandbox backend: one Job per rollout, through the official ``kubernetes`` client.

Objects (namespace ``settings.namespace``, ``deploy/k8s/base/rollouts``), all named
``rollout-<id>-<attempt>`` (:func:`job_name`) and labelled ``openforge.dev/rollout=<that name>``:

* a **Job** (``batch/v1``), created suspended, ``backoffLimit: 0`` (retries are the
  orchestrator's, of infrastructure failures only), ``activeDeadlineSeconds`` = harness limit +
  verifier limit + ``start_grace_s``, ``ttlSecondsAfterFinished`` as a safety net;
* a **Secret** holding the rollout's proxy key (the harness gets it as ``env`` through
  ``secretKeyRef``; every launch variable whose value contains the key is kept there), the
  harness's start script (its command line holds the instruction) and config files, and the
  task's ``tests/`` (and ``solution/`` for an oracle run);
* a **NetworkPolicy** selecting only that pod: no ingress, egress only to the proxy's pods on
  the proxy URL's port. No DNS either: the orchestrator resolves the proxy URL's host when it
  creates the Job and the pod gets that address in ``/etc/hosts`` (``hostAliases``), with
  ``dnsPolicy: None`` and a loopback nameserver no one listens on, so every other name fails to
  resolve at once and no query (a channel out of the sandbox) leaves the pod.

The Secret and the NetworkPolicy are owned by the Job (``ownerReferences``), so deleting the Job
(``propagationPolicy=Background``) removes them with its pod. The Job is resumed only once both
exist, so no pod runs before its egress rule.

The pod (all containers as ``run_as_user``, no privilege escalation, every capability dropped,
``RuntimeDefault`` seccomp, a read-only root filesystem, no service account token, no service
links; what a container may write is its ``emptyDir`` mounts, ``/tmp`` and ``/var/tmp`` among
them, and the verifier gets a fresh ``HOME`` of its own), in order:

1. init ``workspace`` (task image): copies the image's working folder (the task's Dockerfile
   ``WORKDIR``) into an ``emptyDir`` that the harness and the verifier then share at that path;
2. init ``harness-install`` (harness image, ``deploy/harness/<name>``): copies the harness install
   (``harness_root``, plus ``/usr/local/bin/node`` where the image has one) into an ``emptyDir``;
3. init ``harness`` (task image, so the agent's commands run in the task's environment): the
   install read-only at ``harness_root``, runs the start script: write the config files, run the
   harness under ``timeout`` with the task's limit, record ``<exit status> <start> <end>``
   (seconds since the epoch) in a status folder and always exit 0, so that the verifier runs
   after a failure or a timeout too;
4. ``verifier`` (task image): ``tests/`` read-only at ``/tests`` (never visible to the harness),
   runs ``bash /tests/test.sh`` under its own limit (its output is the container's log) and writes
   the result as its **termination message** (``/dev/termination-log``, at most 4096 bytes),
   one ``<key> <value>`` line each: ``harness <status line>``, ``verifier <exit status>``,
   ``reward.txt <base64>`` and ``reward.json <base64>`` (the first 1 KiB / 2 KiB of the files).

The orchestrator watches the Job (``kubernetes.watch``) until its ``Complete`` or ``Failed``
condition, reads the pod's termination message (reward parsed as Harbor does,
:mod:`openforge_orchestrator.domain.verifier`) and the tails of the ``harness`` and ``verifier``
logs, then deletes the Job. A ``Failed`` Job (deadline exceeded, an image that cannot be pulled, a
container killed) is an infrastructure failure (:class:`SandboxStartError`), retried by the
executor; so is a pod that can never start (an invalid image name, a missing Secret key), seen
between watch periods, or whose images are still not pulled after ``start_grace_s``. Cancelling
:meth:`KubernetesBackend.execute` deletes the Job.

Differences from the local backend: changes outside the working folder do not reach the
verifier (only the working folder is shared); other destinations are refused by the
NetworkPolicy but not recorded (``blocked_destinations`` stays empty; a harness that made no
call through the proxy is still flagged); the proxy session is closed after the whole pod ended
(the verifier container has no key).

Images: a task's image is its ``docker_image`` or the one built from its ``environment/``
(``docker build -t openforge/task-<set>-<id>:latest <task>/environment``, the default
``task_image`` name), pushed where the nodes pull from. It needs ``/bin/sh``, ``bash`` and GNU
coreutils (``timeout``, ``date``, ``base64``, ``cp``), as Debian and Ubuntu based images have; the
Node.js harnesses need its glibc and libstdc++, and mini-swe-agent's virtual environment needs
``/usr/local/bin/python3.11`` (a ``python:3.11`` based task image).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import ipaddress
import re
import secrets
import shlex
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import structlog
import urllib3
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes import watch as _watch
from kubernetes.client import exceptions as _exceptions

from openforge_orchestrator.domain.sandbox import (
    AGENT_LOGS,
    SANDBOX_HOME,
    SANDBOX_RUN,
    SOLUTION_DIR,
    TESTS_DIR,
    VERIFIER_LOGS,
    ExecutionPlan,
    ExecutionResult,
    HarnessLaunch,
    SandboxStartError,
)
from openforge_orchestrator.domain.tasks import InvalidTask, Task
from openforge_orchestrator.domain.verifier import REWARD_JSON, REWARD_TXT, Reward, RewardError, parse_reward, tail
from openforge_orchestrator.settings import KubernetesSandboxSettings

log = structlog.get_logger(__name__)

# The client's generated models are typed, its config loaders and watch are not: the backend
# sends and reads plain dicts and attribute trees, so it handles the client as untyped.
k8s: Any = _client
k8s_config: Any = _config
k8s_watch: Any = _watch
ApiException = _exceptions.ApiException

#: Label on every object of one rollout (value: the Job's name); the NetworkPolicy selects it.
ROLLOUT_LABEL = "openforge.dev/rollout"
#: Annotation holding the full rollout id.
ROLLOUT_ID_ANNOTATION = "openforge.dev/rollout-id"
COMMON_LABELS = {"app.kubernetes.io/name": "rollout", "app.kubernetes.io/component": "rollouts"}
HARNESS_CONTAINER = "harness"
VERIFIER_CONTAINER = "verifier"
#: Where the launch Secret (start script, config files) is mounted in the harness container.
LAUNCH_DIR = "/var/run/openforge/launch"
#: Where the harness's status line is written (harness) and read (verifier).
STATUS_DIR = "/var/run/openforge/status"
STATUS_FILE = f"{STATUS_DIR}/harness"
INSTALL_MOUNT = "/mnt/harness"
WORKSPACE_MOUNT = "/mnt/workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Seconds between SIGTERM and SIGKILL when a time limit is reached.
KILL_AFTER_S = 5
#: Kubernetes refuses Secrets over 1 MiB; this leaves room for the encoding and metadata.
MAX_SECRET_BYTES = 700 * 1024
#: Waiting reasons of a container that will never start without a change (fail the attempt now).
NEVER_STARTS = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
#: Waiting reasons of an image not pulled yet (fail once ``start_grace_s`` has passed).
PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff"})
_TIMEOUT_CODES = (124, 137)
#: The pod's only nameserver: its own loopback, where nothing listens (``dnsPolicy: None``).
NO_NAMESERVER = "127.0.0.1"
_B64 = "base64 | tr -d '\\n'"
_NAME_CHARS = re.compile(r"[^a-z0-9-]+")

LOG_CREATED = "k8s.job_created"
LOG_FINISHED = "k8s.job_finished"
LOG_DELETED = "k8s.job_deleted"
LOG_CLEANUP_FAILED = "k8s.cleanup_failed"


def job_name(rollout_id: str, attempt: str = "") -> str:
    """``rollout-<readable part>-<10 hex digits of sha256(rollout_id)>[-<attempt>]``: a DNS label.

    Args:
        rollout_id: The rollout.
        attempt: Up to 8 characters ``[a-z0-9]`` telling this attempt's objects from those of an
            earlier attempt of the same rollout that may still be being deleted.
    """
    readable = _NAME_CHARS.sub("-", rollout_id.lower()).strip("-")[:34].strip("-")
    digest = hashlib.sha256(rollout_id.encode()).hexdigest()[:10]
    name = f"rollout-{readable}-{digest}" if readable else f"rollout-{digest}"
    return f"{name}-{attempt[:8]}" if attempt else name


def task_image(settings: KubernetesSandboxSettings, task: Task) -> str:
    """The task's image: its ``docker_image`` when it names one, else ``settings.task_image`` filled in."""
    if task.docker_image:
        return task.docker_image
    return settings.task_image.format(task_set=task.task_set.lower(), task_id=task.task_id.lower())


def _quantity_cpu(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret_key(prefix: str, index: int) -> str:
    return f"{prefix}-{index}"


def _scratch_mounts(volume: str) -> list[dict[str, Any]]:
    """``/tmp`` and ``/var/tmp`` of one container, as sub-folders of its scratch ``emptyDir``
    (the root filesystem is read-only)."""
    return [
        {"name": volume, "mountPath": "/tmp", "subPath": "tmp"},
        {"name": volume, "mountPath": "/var/tmp", "subPath": "var-tmp"},
    ]


def harness_script(plan: ExecutionPlan, launch: HarnessLaunch | None, file_keys: Mapping[str, str]) -> str:
    """The harness container's start script (kept in the Secret: its command line holds the instruction).

    Args:
        plan: The rollout's plan (working folder, time limit).
        launch: The harness launch; None runs the task's oracle ``/solution/solve.sh``.
        file_keys: Path of each config file in the container → its key in the Secret.
    """
    lines = ["set -u"]
    for path, key in file_keys.items():
        parent = str(PurePosixPath(path).parent)
        lines.append(f"mkdir -p {shlex.quote(parent)} && cp {shlex.quote(f'{LAUNCH_DIR}/{key}')} {shlex.quote(path)}")
    argv = launch.argv if launch is not None else ("bash", f"{SOLUTION_DIR}/solve.sh")
    limit = max(1, int(plan.agent_timeout_s))
    command = " ".join(shlex.quote(a) for a in argv)
    lines += [
        f'cd {shlex.quote(plan.task.environment.workdir)} || {{ echo "126 0 0" > {STATUS_FILE}; exit 0; }}',
        "start=$(date +%s.%N)",
        f"timeout -k {KILL_AFTER_S} {limit} {command} < /dev/null",
        "code=$?",
        "end=$(date +%s.%N)",
        f'printf "%s %s %s\\n" "$code" "$start" "$end" > {STATUS_FILE}',
        "exit 0",
        "",
    ]
    return "\n".join(lines)


def verifier_script(verifier_timeout_s: float) -> str:
    """The verifier container's script: run ``/tests/test.sh``, write the termination message."""
    limit = max(1, int(verifier_timeout_s))
    return "\n".join(
        [
            "set -u",
            f"mkdir -p {VERIFIER_LOGS}",
            f"timeout -k {KILL_AFTER_S} {limit} bash {TESTS_DIR}/test.sh < /dev/null 2>&1",
            "vexit=$?",
            "{",
            f'  printf "harness %s\\n" "$(cat {STATUS_FILE} 2>/dev/null)"',
            '  printf "verifier %s\\n" "$vexit"',
            f"  if [ -f {VERIFIER_LOGS}/{REWARD_TXT} ]; then",
            f'    printf "{REWARD_TXT} %s\\n" "$(head -c 1024 {VERIFIER_LOGS}/{REWARD_TXT} | {_B64})"',
            "  fi",
            f"  if [ -f {VERIFIER_LOGS}/{REWARD_JSON} ]; then",
            f'    printf "{REWARD_JSON} %s\\n" "$(head -c 2048 {VERIFIER_LOGS}/{REWARD_JSON} | {_B64})"',
            "  fi",
            "} > /dev/termination-log",
            "exit 0",
            "",
        ]
    )


class PodReport:
    """The verifier container's termination message, parsed.

    Attributes:
        harness_exit: The harness's exit status (None when it recorded none).
        harness_start: When the harness started, seconds since the epoch (0 when unknown).
        harness_end: When it ended, seconds since the epoch (0 when unknown).
        verifier_exit: The verifier's exit status (None when unknown).
        files: Reward file name → its content.
    """

    def __init__(self, message: str) -> None:
        self.harness_exit: int | None = None
        self.harness_start = 0.0
        self.harness_end = 0.0
        self.verifier_exit: int | None = None
        self.files: dict[str, bytes] = {}
        for line in message.splitlines():
            key, _, value = line.partition(" ")
            value = value.strip()
            if key == "harness":
                parts = value.split()
                with contextlib.suppress(ValueError, IndexError):
                    self.harness_exit = int(parts[0])
                    self.harness_start, self.harness_end = float(parts[1]), float(parts[2])
            elif key == "verifier":
                with contextlib.suppress(ValueError):
                    self.verifier_exit = int(value)
            elif key in (REWARD_TXT, REWARD_JSON):
                with contextlib.suppress(ValueError):
                    self.files[key] = base64.b64decode(value, validate=True)

    def reward(self) -> Reward:
        """The reward, read as Harbor does.

        Raises:
            RewardError: No reward file, or one without a usable number.
        """
        with tempfile.TemporaryDirectory() as folder:
            for name, content in self.files.items():
                (Path(folder) / name).write_bytes(content)
            return parse_reward(Path(folder))


class KubernetesBackend:
    """Runs each rollout as a Kubernetes Job (see the module docstring).

    Args:
        settings: The backend's settings.
        api_client: A ``kubernetes.client.ApiClient`` to use; None builds one from the settings
            (in-cluster service account or kubeconfig).
        resolve: Resolves the proxy URL's host name to the address a pod reaches it at; None
            uses the orchestrator's own resolver (``getaddrinfo``; the cluster DNS in a pod).

    Raises:
        ValueError: ``proxy_url`` is not an http(s) URL, or no cluster configuration was found.
    """

    def __init__(
        self,
        settings: KubernetesSandboxSettings,
        api_client: Any = None,
        resolve: Callable[[str], Awaitable[str]] | None = None,
    ) -> None:
        self.settings = settings
        self.proxy_base_url = settings.proxy_url.rstrip("/")
        split = urlsplit(self.proxy_base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"proxy_url must be an http(s) URL, got {settings.proxy_url!r}")
        self._proxy_host = split.hostname
        self._proxy_port = split.port or (443 if split.scheme == "https" else 80)
        self._resolve = resolve or _resolve
        if api_client is None:
            configuration = k8s.Configuration()
            try:
                if settings.in_cluster:
                    k8s_config.load_incluster_config(client_configuration=configuration)
                else:
                    k8s_config.load_kube_config(
                        config_file=settings.kubeconfig or None,
                        context=settings.context or None,
                        client_configuration=configuration,
                    )
            except k8s_config.ConfigException as exc:
                where = (
                    "the pod's service account (in_cluster=true): is the orchestrator running in a pod?"
                    if settings.in_cluster
                    else "a kubeconfig: set OPENFORGE_SANDBOX__KUBERNETES__KUBECONFIG, or "
                    "OPENFORGE_SANDBOX__KUBERNETES__IN_CLUSTER=true inside the cluster"
                )
                raise ValueError(f"kubernetes sandbox backend: no cluster configuration from {where} ({exc})") from exc
            configuration.connection_pool_maxsize = settings.api_threads
            api_client = k8s.ApiClient(configuration)
        self._api = api_client
        self._batch: Any = k8s.BatchV1Api(api_client)
        self._core: Any = k8s.CoreV1Api(api_client)
        self._net: Any = k8s.NetworkingV1Api(api_client)
        self._watches: dict[str, Any] = {}
        self._lock = threading.Lock()
        # The client blocks; every rollout holds a thread while it watches its Job, so the
        # backend has its own pool instead of the event loop's small default one.
        self._pool = ThreadPoolExecutor(max_workers=settings.api_threads, thread_name_prefix="k8s-api")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the backend's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # --- manifests ---------------------------------------------------------------------------

    def _resources(self, plan: ExecutionPlan) -> dict[str, dict[str, str]]:
        task = plan.task
        cpus = task.resources.cpus or self.settings.cpus
        memory = plan.memory_mb(self.settings.memory_mb)
        limits = {"cpu": _quantity_cpu(cpus), "memory": f"{memory}Mi"}
        if task.resources.storage_mb:
            limits["ephemeral-storage"] = f"{task.resources.storage_mb}Mi"
        return {"requests": dict(limits), "limits": limits}

    @staticmethod
    def _container_security() -> dict[str, Any]:
        return {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }

    def secret_data(self, plan: ExecutionPlan) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
        """The Secret's ``data`` (base64) and how the pod uses it.

        Returns:
            ``(data, env_keys, launch_keys, task_keys)``: the data; launch variable → Secret key for
            variables holding the key; keys mounted into the harness container; keys mounted into
            the verifier (``tests``) or the harness (``solution``, oracle runs).

        Raises:
            InvalidTask: The task's ``tests/`` (or ``solution/``) do not fit in a Secret, or a
                harness file lies outside the sandbox's home and run folders.
        """
        data: dict[str, str] = {}
        env_keys: dict[str, str] = {}
        launch = plan.launch
        file_keys: dict[str, str] = {}
        if launch is not None:
            for name, value in sorted(launch.env.items()):
                if plan.api_key and plan.api_key in value:
                    key = f"env.{name}"  # variable names are valid Secret keys
                    data[key] = _b64(value.encode())
                    env_keys[name] = key
            for i, (path, text) in enumerate(sorted(launch.files.items())):
                p = PurePosixPath(path)
                if not any(PurePosixPath(prefix) in p.parents for prefix in (SANDBOX_HOME, SANDBOX_RUN)):
                    raise InvalidTask(f"harness file {path} is outside {SANDBOX_HOME} and {SANDBOX_RUN}")
                key = _secret_key("file", i)
                data[key] = _b64(text.encode())
                file_keys[path] = key
        data["run.sh"] = _b64(harness_script(plan, launch, file_keys).encode())
        launch_keys = sorted(data)
        task_keys: list[str] = []
        folders = [("tests", plan.task.tests_dir)]
        if launch is None and plan.task.solution_script is not None:
            folders.append(("solution", plan.task.solution_script.parent))
        size = 0
        for prefix, folder in folders:
            for i, f in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
                content = f.read_bytes()
                size += len(content)
                if size > MAX_SECRET_BYTES:
                    raise InvalidTask(f"{prefix}/ is over {MAX_SECRET_BYTES} bytes: it cannot travel in a Secret")
                key = _secret_key(prefix, i)
                data[key] = _b64(content)
                task_keys.append(key)
        return data, env_keys, launch_keys, task_keys

    def manifests(
        self, plan: ExecutionPlan, attempt: str = "", *, proxy_ip: str
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The Job (suspended, no owner), the Secret and the NetworkPolicy (owners set on creation),
        all named :func:`job_name` ``(plan.rollout_id, attempt)``; ``proxy_ip`` is the proxy URL
        host's address (:meth:`proxy_address`), the only name the pod can resolve.

        Raises:
            InvalidTask: See :meth:`secret_data`; or the harness has no image in the settings.
        """
        s = self.settings
        task = plan.task
        name = job_name(plan.rollout_id, attempt)
        labels = {**COMMON_LABELS, ROLLOUT_LABEL: name}
        meta: dict[str, Any] = {
            "name": name,
            "namespace": s.namespace,
            "labels": labels,
            "annotations": {ROLLOUT_ID_ANNOTATION: plan.rollout_id, "openforge.dev/task": task.key},
        }
        data, env_keys, launch_keys, task_keys = self.secret_data(plan)
        image = task_image(s, task)
        launch = plan.launch
        workdir = task.environment.workdir
        resources = self._resources(plan)
        security = self._container_security()
        tests_items = [
            {"key": k, "path": str(f.relative_to(task.tests_dir))}
            for k, f in zip(
                [k for k in task_keys if k.startswith("tests-")],
                sorted(p for p in task.tests_dir.rglob("*") if p.is_file()),
                strict=True,
            )
        ]
        launch_items = [{"key": k, "path": k} for k in launch_keys if not k.startswith("env.")]
        volumes: list[dict[str, Any]] = [
            {"name": "workspace", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
            {"name": "run", "emptyDir": {}},
            {"name": "status", "emptyDir": {}},
            {"name": "agent-logs", "emptyDir": {}},
            {"name": "verifier-logs", "emptyDir": {}},
            # the root filesystem is read-only: each container's /tmp, /var/tmp (and the
            # verifier's HOME) are sub-folders of its own scratch volume
            {"name": "harness-scratch", "emptyDir": {}},
            {"name": "verifier-scratch", "emptyDir": {}},
            # the start script and config files may hold the key: the pod's user and group (fsGroup) only
            {"name": "launch", "secret": {"secretName": name, "items": launch_items, "defaultMode": 0o440}},
            {"name": "tests", "secret": {"secretName": name, "items": tests_items, "defaultMode": 0o444}},
        ]
        if task.resources.storage_mb:
            for vol in volumes:
                if vol["name"] in ("workspace", "harness-scratch", "verifier-scratch"):
                    vol["emptyDir"] = {"sizeLimit": f"{task.resources.storage_mb}Mi"}
        harness_mounts: list[dict[str, Any]] = [
            {"name": "workspace", "mountPath": workdir},
            {"name": "home", "mountPath": SANDBOX_HOME},
            {"name": "run", "mountPath": SANDBOX_RUN},
            {"name": "status", "mountPath": STATUS_DIR},
            {"name": "agent-logs", "mountPath": AGENT_LOGS},
            {"name": "launch", "mountPath": LAUNCH_DIR, "readOnly": True},
            *_scratch_mounts("harness-scratch"),
        ]
        init: list[dict[str, Any]] = [
            {
                "name": "workspace",
                "image": image,
                "imagePullPolicy": s.image_pull_policy,
                "command": ["/bin/sh", "-c", 'if [ -d "$0" ]; then cp -a "$0"/. ' + WORKSPACE_MOUNT + "/; fi", workdir],
                "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE_MOUNT}],
                "resources": resources,
                "securityContext": security,
            }
        ]
        path = DEFAULT_PATH
        env: list[dict[str, Any]] = [{"name": "HOME", "value": SANDBOX_HOME}]
        if launch is not None:
            harness_image = launch.image or s.harness_images.get(launch.name, "")
            if launch.name != "command":
                if not harness_image:
                    raise InvalidTask(f"no image for harness {launch.name!r}: set sandbox.kubernetes.harness_images")
                volumes.append({"name": "harness", "emptyDir": {}})
                root = s.harness_root
                copy = (
                    f"cp -a {shlex.quote(root)}/. {INSTALL_MOUNT}/ && mkdir -p {INSTALL_MOUNT}/bin && "
                    f"if [ -x /usr/local/bin/node ]; then cp /usr/local/bin/node {INSTALL_MOUNT}/bin/node; fi"
                )
                init.append(
                    {
                        "name": "harness-install",
                        "image": harness_image,
                        "imagePullPolicy": s.image_pull_policy,
                        "command": ["/bin/sh", "-c", copy],
                        "volumeMounts": [{"name": "harness", "mountPath": INSTALL_MOUNT}],
                        "resources": resources,
                        "securityContext": security,
                    }
                )
                harness_mounts.append({"name": "harness", "mountPath": root, "readOnly": True})
                path = ":".join([f"{root}/bin", f"{root}/node_modules/.bin", f"{root}/venv/bin", path])
            path = ":".join([*launch.path_dirs, path])
            for var, value in sorted(launch.env.items()):
                if var in env_keys:
                    env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": name, "key": env_keys[var]}}})
                else:
                    env.append({"name": var, "value": value})
        else:
            oracle_items = [
                {"key": k, "path": str(f.relative_to(task.path / "solution"))}
                for k, f in zip(
                    [k for k in task_keys if k.startswith("solution-")],
                    sorted(p for p in (task.path / "solution").rglob("*") if p.is_file()),
                    strict=True,
                )
            ]
            volumes.append({"name": "solution", "secret": {"secretName": name, "items": oracle_items}})
            harness_mounts.append({"name": "solution", "mountPath": SOLUTION_DIR, "readOnly": True})
        env.insert(0, {"name": "PATH", "value": path})
        init.append(
            {
                "name": HARNESS_CONTAINER,
                "image": image,
                "imagePullPolicy": s.image_pull_policy,
                "command": ["/bin/sh", f"{LAUNCH_DIR}/run.sh"],
                "workingDir": workdir,
                "env": env,
                "volumeMounts": harness_mounts,
                "resources": resources,
                "securityContext": security,
            }
        )
        verifier = {
            "name": VERIFIER_CONTAINER,
            "image": image,
            "imagePullPolicy": s.image_pull_policy,
            "command": ["/bin/sh", "-c", verifier_script(plan.verifier_timeout_s)],
            "workingDir": workdir,
            "env": [{"name": "PATH", "value": DEFAULT_PATH}, {"name": "HOME", "value": SANDBOX_HOME}]
            + [{"name": k, "value": v} for k, v in sorted(task.verifier_env.items())],
            "volumeMounts": [
                {"name": "workspace", "mountPath": workdir},
                {"name": "tests", "mountPath": TESTS_DIR, "readOnly": True},
                {"name": "verifier-logs", "mountPath": VERIFIER_LOGS},
                {"name": "agent-logs", "mountPath": AGENT_LOGS, "readOnly": True},
                {"name": "status", "mountPath": STATUS_DIR, "readOnly": True},
                *_scratch_mounts("verifier-scratch"),
                {"name": "verifier-scratch", "mountPath": SANDBOX_HOME, "subPath": "home"},
            ],
            "resources": resources,
            "securityContext": security,
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        }
        deadline = int(plan.agent_timeout_s) + int(plan.verifier_timeout_s) + 2 * KILL_AFTER_S + s.start_grace_s
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "suspend": True,
                "backoffLimit": 0,
                "activeDeadlineSeconds": max(1, deadline),
                "ttlSecondsAfterFinished": s.ttl_after_finished_s,
                "template": {
                    "metadata": {"labels": labels, "annotations": dict(meta["annotations"])},
                    "spec": {
                        "restartPolicy": "Never",
                        "serviceAccountName": s.service_account,
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": s.run_as_user,
                            "runAsGroup": s.run_as_user,
                            "fsGroup": s.run_as_user,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "dnsPolicy": "None",
                        "dnsConfig": {"nameservers": [NO_NAMESERVER]},
                        **self._host_aliases(proxy_ip),
                        "initContainers": init,
                        "containers": [verifier],
                        "volumes": volumes,
                    },
                },
            },
        }
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {**meta, "labels": dict(labels)},
            "type": "Opaque",
            "data": data,
        }
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {**meta, "labels": dict(labels)},
            "spec": {
                "podSelector": {"matchLabels": {ROLLOUT_LABEL: name}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [
                    {
                        "to": [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": s.proxy_namespace}
                                },
                                "podSelector": {"matchLabels": dict(s.proxy_pod_labels)},
                            }
                        ],
                        "ports": [{"protocol": "TCP", "port": self._proxy_port}],
                    },
                ],
            },
        }
        return job, secret, policy

    def _host_aliases(self, proxy_ip: str) -> dict[str, Any]:
        """The pod's ``/etc/hosts`` entry for the proxy URL's host (none for an address)."""
        if _is_address(self._proxy_host):
            return {}
        return {"hostAliases": [{"ip": proxy_ip, "hostnames": [self._proxy_host]}]}

    async def proxy_address(self) -> str:
        """The address of the proxy URL's host, resolved now (a Service's ClusterIP can change).

        Raises:
            SandboxStartError: The host does not resolve (an infrastructure failure: retried).
        """
        if _is_address(self._proxy_host):
            return self._proxy_host
        try:
            return await self._resolve(self._proxy_host)
        except OSError as exc:
            raise SandboxStartError(f"the proxy's host {self._proxy_host!r} does not resolve: {exc}") from exc

    # --- lifecycle ---------------------------------------------------------------------------

    def sandbox_image(self, task: Task) -> str:
        """The task's image (:func:`task_image`): its workspace, harness and verifier run in it."""
        return task_image(self.settings, task)

    async def execute(self, plan: ExecutionPlan) -> ExecutionResult:
        """Creates the rollout's Job, Secret and NetworkPolicy, watches the Job to its end, reads
        the result from the pod, deletes the Job.

        Raises:
            SandboxStartError: The proxy's host does not resolve, an object could not be
                created, or the Job failed (deadline exceeded, image pull, a killed container)
                or ended without a result.
            InvalidTask: See :meth:`manifests`.
            asyncio.CancelledError: Cancelled; the Job was deleted.
        """
        t0 = time.time()
        job, secret, policy = self.manifests(plan, secrets.token_hex(3), proxy_ip=await self.proxy_address())
        name = job["metadata"]["name"]
        created = False
        try:
            try:
                made = await self._call(self._batch.create_namespaced_job, self.settings.namespace, job)
                created = True
                owner = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": made.metadata.uid,
                    "controller": True,
                }
                if not owner["uid"]:
                    raise SandboxStartError(f"the API server returned Job {name} without a uid")
                secret["metadata"]["ownerReferences"] = [owner]
                policy["metadata"]["ownerReferences"] = [owner]
                await self._call(self._core.create_namespaced_secret, self.settings.namespace, secret)
                await self._call(self._net.create_namespaced_network_policy, self.settings.namespace, policy)
                await self._call(
                    self._batch.patch_namespaced_job, name, self.settings.namespace, {"spec": {"suspend": False}}
                )
            except ApiException as exc:
                raise SandboxStartError(f"could not create the rollout's objects: {exc.status} {exc.reason}") from exc
            log.info(LOG_CREATED, rollout_id=plan.rollout_id, job=name)
            finished = await self._wait(name, plan)
            log.info(LOG_FINISHED, rollout_id=plan.rollout_id, job=name, outcome=_outcome(finished))
            pod = await self._pod(name)
            if plan.on_harness_exit is not None:
                await plan.on_harness_exit()
            return await self._result(name, plan, finished, pod, t0)
        finally:
            self._stop_watch(name)
            if created:
                await asyncio.shield(self._delete(name, plan.rollout_id))

    async def _wait(self, name: str, plan: ExecutionPlan) -> Any:
        """The Job once finished; between watch periods, fails fast on a pod that cannot start.

        Raises:
            SandboxStartError: No end within the Job's deadline (plus a minute), a container that
                can never start (:data:`NEVER_STARTS`), or images still not pulled after
                ``start_grace_s``.
        """
        limit = plan.agent_timeout_s + plan.verifier_timeout_s + 2 * KILL_AFTER_S + self.settings.start_grace_s + 60
        started = time.monotonic()
        deadline = started + limit
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxStartError(f"Job {name} did not finish within {limit:.0f}s")
            job = await self._call(self._watch_once, name, min(remaining, self.settings.watch_timeout_s))
            if job is not None:
                return job
            pulling = time.monotonic() - started > self.settings.start_grace_s
            for container, reason, message in _waiting(await self._pod(name)):
                if reason in NEVER_STARTS or (pulling and reason in PULL_FAILURES):
                    raise SandboxStartError(f"Job {name}: {container} cannot start: {reason}: {message}")

    def _watch_once(self, name: str, timeout_s: float) -> Any:
        """Watches the Job for up to ``timeout_s``; returns it once finished, else None.

        Raises:
            SandboxStartError: The Job was deleted by someone else.
        """
        w = k8s_watch.Watch()
        with self._lock:
            self._watches[name] = w
        try:
            for event in w.stream(
                self._batch.list_namespaced_job,
                self.settings.namespace,
                field_selector=f"metadata.name={name}",
                timeout_seconds=max(1, int(timeout_s)),
                _request_timeout=timeout_s + 10,
            ):
                obj = event["object"]
                if getattr(getattr(obj, "metadata", None), "name", None) != name:
                    continue
                if event["type"] == "DELETED":
                    raise SandboxStartError(f"Job {name} was deleted before it finished")
                if _outcome(obj):
                    return obj
        except ApiException as exc:
            if exc.status == 410:  # the watch's resource version expired: watch again
                return None
            raise SandboxStartError(f"watching Job {name}: {exc.status} {exc.reason}") from exc
        except (OSError, urllib3.exceptions.HTTPError):  # the read timed out or the stream broke: watch again
            return None
        finally:
            w.stop()
            with self._lock:
                if self._watches.get(name) is w:
                    del self._watches[name]
        return None

    def _stop_watch(self, name: str) -> None:
        with self._lock:
            w = self._watches.get(name)
        if w is not None:
            w.stop()

    async def _pod(self, name: str) -> Any:
        try:
            pods = await self._call(
                self._core.list_namespaced_pod, self.settings.namespace, label_selector=f"{ROLLOUT_LABEL}={name}"
            )
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("k8s.pod_unreadable", job=name, error=str(exc))
            return None
        mine = [p for p in pods.items if (p.metadata.labels or {}).get(ROLLOUT_LABEL) == name]
        return mine[-1] if mine else None

    async def _log(self, pod: Any, container: str) -> str:
        if pod is None:
            return ""
        try:
            text = await self._call(
                self._core.read_namespaced_pod_log,
                pod.metadata.name,
                self.settings.namespace,
                container=container,
                tail_lines=self.settings.log_tail_lines,
            )
        except (ApiException, OSError, urllib3.exceptions.HTTPError):
            return ""
        return str(text or "")

    async def _result(self, name: str, plan: ExecutionPlan, job: Any, pod: Any, t0: float) -> ExecutionResult:
        message = _terminated(pod, VERIFIER_CONTAINER, init=False)
        if _outcome(job) == "Failed" or message is None:
            raise SandboxStartError(f"Job {name} failed: {_failure(job, pod)}")
        report = PodReport(message)
        harness_s = max(0.0, report.harness_end - report.harness_start)
        timed_out = report.harness_exit in _TIMEOUT_CODES and harness_s >= plan.agent_timeout_s - 1
        reward: Reward | None = None
        verifier_error = ""
        if report.verifier_exit in _TIMEOUT_CODES:
            verifier_error = f"verifier timed out after {plan.verifier_timeout_s:g}s"
        else:
            try:
                reward = report.reward()
            except RewardError as exc:
                verifier_error = str(exc)
        created = _timestamp(getattr(job.metadata, "creation_timestamp", None))
        started = _started(pod, HARNESS_CONTAINER)
        start_latency = (started - created) if created and started else (report.harness_start or t0) - t0
        return ExecutionResult(
            exit_code=None if timed_out else report.harness_exit,
            timed_out=timed_out,
            start_latency_s=max(0.0, start_latency),
            harness_s=harness_s,
            stdout_tail=tail(await self._log(pod, HARNESS_CONTAINER)),
            reward=reward,
            verifier_output=tail(await self._log(pod, VERIFIER_CONTAINER)),
            verifier_error=verifier_error,
        )

    async def _delete(self, name: str, rollout_id: str) -> None:
        try:
            await self._call(
                self._batch.delete_namespaced_job, name, self.settings.namespace, propagation_policy="Background"
            )
            log.info(LOG_DELETED, rollout_id=rollout_id, job=name)
        except ApiException as exc:
            if exc.status != 404:
                log.warning(LOG_CLEANUP_FAILED, rollout_id=rollout_id, job=name, status=exc.status)
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning(LOG_CLEANUP_FAILED, rollout_id=rollout_id, job=name, error=str(exc))

    async def start(self) -> None:
        """Nothing to prepare: a Job of a crashed orchestrator ends at its deadline, and its
        Secret and NetworkPolicy go with it (owner references, ``ttlSecondsAfterFinished``)."""

    async def close(self) -> None:
        """Stops every watch and closes the API client."""
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            w.stop()
        await self._call(self._api.close)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _resolve(host: str) -> str:
    """The first address ``getaddrinfo`` gives for ``host`` (TCP).

    Raises:
        OSError: It does not resolve.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"no address for {host}")
    return str(infos[0][4][0])


def _outcome(job: Any) -> str:
    """``"Complete"`` or ``"Failed"`` once the Job has that condition set to ``"True"``, else ``""``."""
    for cond in getattr(getattr(job, "status", None), "conditions", None) or []:
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return str(cond.type)
    return ""


def _statuses(pod: Any, init: bool) -> list[Any]:
    status = getattr(pod, "status", None)
    found = getattr(status, "init_container_statuses" if init else "container_statuses", None)
    return list(found or [])


def _terminated(pod: Any, container: str, init: bool) -> str | None:
    for st in _statuses(pod, init):
        if st.name == container and st.state is not None and st.state.terminated is not None:
            return str(st.state.terminated.message or "")
    return None


def _started(pod: Any, container: str) -> float:
    for st in _statuses(pod, init=True):
        if st.name == container and st.state is not None:
            for state in (st.state.terminated, st.state.running):
                if state is not None and state.started_at is not None:
                    return _timestamp(state.started_at)
    return 0.0


def _waiting(pod: Any) -> list[tuple[str, str, str]]:
    """``(container, reason, message)`` of every container of ``pod`` that is waiting with a reason."""
    found: list[tuple[str, str, str]] = []
    for init in (True, False):
        for st in _statuses(pod, init):
            waiting = st.state.waiting if st.state is not None else None
            if waiting is not None and waiting.reason:
                found.append((str(st.name), str(waiting.reason), str(waiting.message or "")))
    return found


def _timestamp(value: object) -> float:
    return value.timestamp() if isinstance(value, datetime) else 0.0


def _failure(job: Any, pod: Any) -> str:
    reasons: list[str] = []
    for cond in getattr(getattr(job, "status", None), "conditions", None) or []:
        if cond.type == "Failed" and cond.status == "True":
            reasons.append(f"{cond.reason or 'Failed'}: {cond.message or ''}".strip(": "))
    for init in (True, False):
        for st in _statuses(pod, init):
            state = st.state
            if state is None:
                continue
            if state.waiting is not None and state.waiting.reason:
                reasons.append(f"{st.name} {state.waiting.reason}: {state.waiting.message or ''}".strip(": "))
            elif state.terminated is not None and state.terminated.exit_code:
                reasons.append(f"{st.name} exited {state.terminated.exit_code} ({state.terminated.reason or ''})")
    if pod is None:
        reasons.append("no pod was created")
    elif not reasons:
        reasons.append("the verifier left no result")
    return "; ".join(reasons)
