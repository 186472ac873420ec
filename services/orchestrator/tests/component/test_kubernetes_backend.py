"""The kubernetes backend against a fake Kubernetes API server (kmock), through the official client.

There is no API server on these machines. ``FakeApiServer`` is kmock's in-memory Kubernetes
emulator (a real HTTP server speaking the Kubernetes REST and watch protocol) plus what a real
API server adds on create (``uid``, ``creationTimestamp``). The Job controller and the kubelet are
faked by :class:`FakeJobController`: once the backend resumes the Job, it creates the Job's pod
with the container statuses a kubelet would report (the verifier's termination message) and
then sets the Job's ``Complete`` or ``Failed`` condition, which the backend sees on its watch.

Every object the backend creates is validated strictly (unknown fields are errors) against the
Kubernetes version ``tests/deploy`` pins (``tools.deploy.k8s_check.KUBERNETES_VERSION``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import kmock
import kubernetes_validate.utils as kv  # type: ignore[import-untyped]
import pytest
from kubernetes import client as k8s_client

from openforge_orchestrator.app import backend_from_settings, launches_from_settings
from openforge_orchestrator.backends.kubernetes import (
    HARNESS_CONTAINER,
    ROLLOUT_ID_ANNOTATION,
    ROLLOUT_LABEL,
    VERIFIER_CONTAINER,
    KubernetesBackend,
    PodReport,
    job_name,
)
from openforge_orchestrator.backends.local import LocalBackend
from openforge_orchestrator.domain.execution import ExecutionSettings, OpenedSession, RolloutExecutor
from openforge_orchestrator.domain.rollouts import Rollout, RolloutRegistry, RolloutStatus, TaskRef
from openforge_orchestrator.domain.sandbox import ExecutionPlan, HarnessLaunch, SandboxStartError
from openforge_orchestrator.domain.tasks import Task, TaskCatalog
from openforge_orchestrator.harnesses import LaunchContext, adapter
from openforge_orchestrator.settings import (
    KubernetesSandboxSettings,
    LocalSandboxSettings,
    OrchestratorSettings,
    SandboxSettings,
)

ROOT = Path(__file__).resolve().parents[4]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tools.deploy.k8s_check import KUBERNETES_VERSION  # noqa: E402

CATALOG = TaskCatalog(ROOT / "examples" / "tasks")
NS = "openforge-rollouts"
KEY = "ofk-test-rollout-key-0123456789"
#: The proxy Service's address as the fake cluster DNS below answers it.
PROXY_IP = "10.96.0.42"


async def _fake_cluster_dns(host: str) -> str:
    """A fake of the cluster DNS the orchestrator's pod asks: only the proxy's Service resolves."""
    if host != "proxy.openforge.svc.cluster.local":
        raise OSError(f"NXDOMAIN {host}")
    return PROXY_IP


JOBS = "/apis/batch/v1/namespaces/openforge-rollouts/jobs"


class FakeApiServer(kmock.KubernetesEmulator):
    """A fake Kubernetes API server: kmock's emulator, plus a uid and creation time on create."""

    async def _handle(self, request: kmock.Request) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
        return await super()._handle(request)


def _now(offset_s: float = 0.0) -> str:
    t = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(harness: str, verifier: int, reward_txt: str | None) -> str:
    lines = [f"harness {harness}", f"verifier {verifier}"]
    if reward_txt is not None:
        lines.append(f"reward.txt {base64.b64encode(reward_txt.encode()).decode()}")
    return "\n".join(lines) + "\n"


class FakeJobController:
    """Fakes the Job controller and kubelet: pod with statuses, then the Job's final condition.

    Args:
        server: The fake API server.
        outcome: ``"Complete"``, ``"Failed"`` or ``""`` (the Job never finishes).
        message: The verifier's termination message (None: the verifier never ran).
        waiting: A waiting reason of the harness container (e.g. ``ImagePullBackOff``).
        skip: Names of Jobs another controller handled (an earlier attempt's).
    """

    def __init__(
        self, server: Any, outcome: str, message: str | None, waiting: str = "", skip: frozenset[str] = frozenset()
    ) -> None:
        self.server = server
        self.outcome = outcome
        self.message = message
        self.waiting = waiting
        self.skip = skip
        self.resumed = asyncio.Event()
        self.job: dict[str, Any] = {}

    async def run(self) -> None:
        async with aiohttp.ClientSession(base_url=str(self.server.url)) as http:
            job = self.job = await self._wait_resumed(http)
            self.resumed.set()
            name = job["metadata"]["name"]
            pod = self._pod(job)
            async with http.post(f"/api/v1/namespaces/{NS}/pods", json=pod) as resp:
                assert resp.status < 300, await resp.text()
            await asyncio.sleep(0.3)  # the backend watches meanwhile: nothing final yet
            if not self.outcome:
                return
            reason = {"Complete": "Completed", "Failed": "DeadlineExceeded"}[self.outcome]
            status = {
                "conditions": [
                    {
                        "type": self.outcome,
                        "status": "True",
                        "reason": reason,
                        "message": "Job was active longer than specified deadline" if self.outcome == "Failed" else "",
                        "lastTransitionTime": _now(),
                    }
                ],
                "startTime": _now(-12),
            }
            async with http.patch(f"{JOBS}/{name}", json={"status": status}) as resp:
                assert resp.status < 300, await resp.text()

    async def _wait_resumed(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        for _ in range(500):
            async with http.get(JOBS) as resp:
                if resp.status == 200:
                    for job in (await resp.json())["items"]:
                        if job["spec"].get("suspend") is False and job["metadata"]["name"] not in self.skip:
                            return dict(job)
            await asyncio.sleep(0.02)
        raise AssertionError("the backend never resumed its Job")

    def _pod(self, job: dict[str, Any]) -> dict[str, Any]:
        name = job["metadata"]["name"]
        spec = job["spec"]["template"]["spec"]
        started = _now(-12)

        def status(container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
            return {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": state,
            }

        done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": _now()}}
        init_statuses = []
        for c in spec["initContainers"]:
            if self.waiting and c["name"] == HARNESS_CONTAINER:
                init_statuses.append(status(c, {"waiting": {"reason": self.waiting, "message": "pull failed"}}))
            else:
                init_statuses.append(status(c, done))
        containers = []
        if self.message is not None:
            verifier = {**done["terminated"], "message": self.message}
            containers = [status(spec["containers"][0], {"terminated": verifier})]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-x7k2p",
                "namespace": NS,
                "labels": {**job["spec"]["template"]["metadata"]["labels"], "batch.kubernetes.io/job-name": name},
            },
            "spec": spec,
            "status": {
                "phase": "Succeeded" if self.message is not None else "Pending",
                "initContainerStatuses": init_statuses,
                "containerStatuses": containers,
            },
        }


@pytest.fixture
async def server() -> AsyncIterator[Any]:
    async with FakeApiServer() as handler, kmock.Server(handler):
        handler.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True)
        handler.resources["batch/v1/jobs"] = kmock.ResourceInfo(kind="Job", namespaced=True)
        yield handler


@pytest.fixture
async def backend(server: Any) -> AsyncIterator[KubernetesBackend]:
    api = k8s_client.ApiClient(k8s_client.Configuration(host=str(server.url).rstrip("/")))
    b = KubernetesBackend(KubernetesSandboxSettings(watch_timeout_s=2), api_client=api, resolve=_fake_cluster_dns)
    yield b
    await b.close()


def _task(task_id: str = "celsius-convert") -> Task:
    return CATALOG.get("test", task_id)


def _launch(harness: str, task: Task, backend: KubernetesBackend, key: str = KEY) -> HarnessLaunch:
    ctx = LaunchContext(
        instruction=task.instruction,
        base_url=backend.proxy_base_url,
        api_key=key,
        model="policy",
        workdir=task.environment.workdir,
        timeout_s=120,
        command=("sh", "-c", "curl -s {openai_base_url}/models -H 'Authorization: Bearer {api_key}'"),
    )
    return adapter(harness).launch(ctx, None)


def _plan(task: Task, launch: HarnessLaunch | None, on_exit: Any = None, timeout_s: float = 120) -> ExecutionPlan:
    return ExecutionPlan(
        rollout_id=f"ro-{uuid.uuid4().hex[:16]}",
        task=task,
        launch=launch,
        agent_timeout_s=timeout_s,
        verifier_timeout_s=60,
        on_harness_exit=on_exit,
        api_key=KEY,
    )


def _validate(obj: dict[str, Any]) -> None:
    kv.validate(obj, KUBERNETES_VERSION, strict=True)


RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def _assert_hardened(
    job: dict[str, Any], secret: dict[str, Any], policy: dict[str, Any], backend: KubernetesBackend
) -> None:
    """The rollout pod's hardening, on the objects the backend renders (issue 26, item 4), for
    every container, init containers included.

    ``job`` was rendered for a proxy at :data:`PROXY_IP`.
    """
    s = backend.settings
    name = job["metadata"]["name"]
    template = job["spec"]["template"]
    pod = template["spec"]
    containers = [*pod["initContainers"], *pod["containers"]]
    assert [c["name"] for c in containers][-2:] == [HARNESS_CONTAINER, VERIFIER_CONTAINER]
    assert containers[0]["name"] == "workspace"

    # No API credential: no token mounted (the service account has no permission either),
    # no pull secret, no service links, nothing of the node's namespaces.
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == s.service_account
    assert pod["enableServiceLinks"] is False
    for absent in ("imagePullSecrets", "hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"):
        assert absent not in pod, absent

    # Non-root with the runtime's default seccomp profile: the pod, then each container.
    pod_security = pod["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == pod_security["runAsGroup"] == s.run_as_user > 0
    assert pod_security["seccompProfile"] == RUNTIME_DEFAULT
    assert 0 not in pod_security.get("supplementalGroups", [])
    # Guaranteed QoS: every container has CPU and memory requests equal to its limits.
    limits = {"cpu", "memory"}
    for c in containers:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, c["name"]
        assert sc.get("runAsUser", s.run_as_user) != 0 and sc.get("runAsGroup", s.run_as_user) != 0, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc.get("privileged", False) is False, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]  # and none added
        assert sc.get("seccompProfile", pod_security["seccompProfile"]) == RUNTIME_DEFAULT, c["name"]
        assert sc.get("procMount", "Default") == "Default", c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        requests, limited = c["resources"].get("requests", {}), c["resources"].get("limits", {})
        assert limits <= set(requests) and limits <= set(limited) and requests == limited, c["name"]

    # Volumes: emptyDirs, and the rollout's own Secret; nothing of the node (hostPath), no
    # projected service account token, no other Secret or ConfigMap. What a container may write
    # is an emptyDir; a Secret is mounted read-only.
    volumes = {v["name"]: v for v in pod["volumes"]}
    for volume in volumes.values():
        (kind,) = set(volume) - {"name"}
        assert kind in ("emptyDir", "secret"), volume
        if kind == "secret":
            assert volume["secret"]["secretName"] == name, volume
    for c in containers:
        for mount in c["volumeMounts"]:
            if "secret" in volumes[mount["name"]]:
                assert mount.get("readOnly") is True, (c["name"], mount)
            if not mount.get("readOnly"):
                assert "emptyDir" in volumes[mount["name"]], (c["name"], mount)
    # With the root read-only, the harness and the verifier each write their own /tmp and
    # /var/tmp (no shared scratch between them), and the verifier has a fresh HOME.
    scratch: dict[str, set[str]] = {}
    for c in containers[-2:]:
        writable = {m["mountPath"]: m["name"] for m in c["volumeMounts"] if not m.get("readOnly")}
        assert {"/tmp", "/var/tmp"} <= set(writable), c["name"]
        scratch[c["name"]] = {writable["/tmp"], writable["/var/tmp"]}
    assert not scratch[HARNESS_CONTAINER] & scratch[VERIFIER_CONTAINER]
    verifier = containers[-1]
    home = next(e["value"] for e in verifier["env"] if e["name"] == "HOME")
    home_mount = next(m for m in verifier["volumeMounts"] if m["mountPath"] == home)
    assert home_mount["name"] in scratch[VERIFIER_CONTAINER] and not home_mount.get("readOnly")

    # The per-rollout key is the only credential in the pod, and only the harness sees it: as
    # an environment variable from the rollout's Secret, and in the launch files (start script,
    # config files) of a volume no other container mounts. No plain value holds it.
    data = {k: base64.b64decode(v).decode(errors="replace") for k, v in secret["data"].items()}
    holding_key = {k for k, v in data.items() if KEY in v}
    launch_keys = {item["key"] for item in volumes["launch"]["secret"]["items"]}
    for c in containers:
        assert "envFrom" not in c, c["name"]
        assert KEY not in json.dumps(c), c["name"]
        refs = [e["valueFrom"] for e in c.get("env", []) if "valueFrom" in e]
        if c["name"] != HARNESS_CONTAINER:
            assert refs == [], c["name"]
            assert not {m["name"] for m in c["volumeMounts"]} & {"launch", "solution"}, c["name"]
        for ref in refs:
            assert set(ref) == {"secretKeyRef"} and ref["secretKeyRef"]["name"] == name, ref
            assert ref["secretKeyRef"]["key"] in holding_key, ref  # a key-holding variable only
    env_keys = {k for k in data if k.startswith("env.")}
    assert env_keys <= holding_key, "the Secret carries no other variable"
    assert holding_key <= env_keys | launch_keys, "tests/ and solution/ never hold the key"

    # No DNS: the proxy's name is in /etc/hosts, the only nameserver is the pod's own loopback
    # (nothing listens there), no search domain; a query could carry data out of the sandbox.
    proxy_host = urlsplit(backend.proxy_base_url).hostname
    assert pod["dnsPolicy"] == "None" and pod["dnsConfig"] == {"nameservers": ["127.0.0.1"]}
    assert pod["hostAliases"] == [{"ip": PROXY_IP, "hostnames": [proxy_host]}]

    # Egress only to the proxy's pods on the proxy's port (no DNS); no ingress. Every rule names
    # its peers (namespace and pod labels, no address block) and its ports: an empty `to` or
    # `ports` would mean everywhere or every port.
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {ROLLOUT_LABEL: name}}
    assert template["metadata"]["labels"][ROLLOUT_LABEL] == name  # the policy selects this pod
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"] and spec["ingress"] == []
    proxy_port = urlsplit(backend.proxy_base_url).port
    assert spec["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": s.proxy_namespace}},
                    "podSelector": {"matchLabels": dict(s.proxy_pod_labels)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": proxy_port}],
        },
    ]
    for rule in spec["egress"]:
        for peer in rule["to"]:
            assert all(selector["matchLabels"] for selector in peer.values()), peer


def _created(server: Any) -> list[dict[str, Any]]:
    """The bodies of every create the backend sent."""
    return [dict(r.data) for r in server[kmock.action.CREATE] if r.headers.get("User-Agent", "").startswith("Open")]


def _requests(server: Any) -> list[Any]:
    return [r for r in server if r.headers.get("User-Agent", "").startswith("Open")]


async def _run(backend: KubernetesBackend, server: Any, controller: FakeJobController, plan: ExecutionPlan) -> Any:
    fake = asyncio.create_task(controller.run())
    try:
        return await asyncio.wait_for(backend.execute(plan), 30)
    finally:
        await fake


async def test_a_rollout_runs_as_a_job_and_its_reward_is_read_from_the_pod(
    backend: KubernetesBackend, server: Any
) -> None:
    task = _task()
    exits: list[str] = []

    async def on_exit() -> None:
        exits.append("closed")

    plan = _plan(task, _launch("codex", task, backend), on_exit)
    server["get", re.compile(rf"/api/v1/namespaces/{NS}/pods/{job_name(plan.rollout_id)}-[a-f0-9]+-x7k2p/log")] << (
        lambda r: "verifier says ok\n" if r.params.get("container") == VERIFIER_CONTAINER else "codex output\n"
    )
    controller = FakeJobController(server, "Complete", _message("0 1000.0 1012.5", 0, "1\n"))

    result = await _run(backend, server, controller, plan)

    assert result.reward is not None and result.reward.value == 1.0
    assert result.exit_code == 0 and not result.timed_out
    assert result.harness_s == pytest.approx(12.5)
    assert result.stdout_tail == "codex output\n"
    assert result.verifier_output == "verifier says ok\n"
    assert exits == ["closed"]

    created = _created(server)
    name = created[0]["metadata"]["name"]
    assert re.fullmatch(rf"{job_name(plan.rollout_id)}-[a-f0-9]{{6}}", name) and len(name) <= 63
    kinds = [o["kind"] for o in created]
    assert kinds[:3] == ["Job", "Secret", "NetworkPolicy"]
    job, secret, policy = created[:3]
    for obj in created[:3]:
        _validate(obj)
        assert obj["metadata"]["name"] == name and obj["metadata"]["namespace"] == NS
    # Created suspended; resumed only after its Secret and NetworkPolicy exist.
    assert job["spec"]["suspend"] is True
    methods = [(r.method, r.action) for r in _requests(server) if r.action != kmock.action.WATCH]
    patch_at = methods.index((kmock.method.PATCH, kmock.action.UPDATE))
    assert patch_at > 2
    # Owned by the Job, so deleting the Job removes them.
    uid = server.objects["batch/v1/jobs", NS, name].last.raw["metadata"]["uid"]
    for obj in (secret, policy):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": True}
    # The key is only in the Secret: the harness gets it through secretKeyRef.
    spec = job["spec"]
    assert KEY not in str(job) and KEY not in str(policy)
    assert KEY in base64.b64decode(secret["data"]["env.OPENFORGE_API_KEY"]).decode()
    harness = next(c for c in spec["template"]["spec"]["initContainers"] if c["name"] == HARNESS_CONTAINER)
    key_env = next(e for e in harness["env"] if e["name"] == "OPENFORGE_API_KEY")
    assert key_env["valueFrom"]["secretKeyRef"] == {"name": name, "key": "env.OPENFORGE_API_KEY"}
    launch_volume = next(v for v in spec["template"]["spec"]["volumes"] if v["name"] == "launch")
    assert launch_volume["secret"]["defaultMode"] == 0o440  # no other user reads the key's files
    pod_security = spec["template"]["spec"]["securityContext"]
    assert pod_security["fsGroup"] == pod_security["runAsUser"]  # ... and the harness still can
    run_sh = base64.b64decode(secret["data"]["run.sh"]).decode()
    assert "timeout -k 5 120 codex exec --skip-git-repo-check" in run_sh
    # Limits from task.toml, deadline, TTL, images.
    assert harness["resources"]["limits"] == {"cpu": "1000m", "memory": "1024Mi", "ephemeral-storage": "1024Mi"}
    assert spec["activeDeadlineSeconds"] == 120 + 60 + 10 + 300
    assert spec["ttlSecondsAfterFinished"] == 600 and spec["backoffLimit"] == 0
    images = {c["name"]: c["image"] for c in spec["template"]["spec"]["initContainers"]}
    assert images["harness-install"] == "openforge/harness-codex:0.171.0"
    assert images[HARNESS_CONTAINER] == backend.sandbox_image(task) == "openforge/task-test-celsius-convert:latest"
    assert spec["template"]["spec"]["automountServiceAccountToken"] is False
    # Egress only to the proxy's pods on its port; its name resolved by the orchestrator.
    (rule,) = policy["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert rule["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "proxy"}}
    assert policy["spec"]["podSelector"] == {"matchLabels": {ROLLOUT_LABEL: name}}
    # Hardened, as sent to the API server.
    _assert_hardened(job, secret, policy, backend)
    # Cleaned up: the Job deleted in the background (owner references take the rest).
    deletes = [r for r in _requests(server) if r.action == kmock.action.DELETE]
    assert [(r.name, r.params.get("propagationPolicy")) for r in deletes] == [(name, "Background")]
    assert server.objects["batch/v1/jobs", NS, name].deleted


async def test_a_harness_timeout_keeps_the_verifier_reward(backend: KubernetesBackend, server: Any) -> None:
    task = _task()
    plan = _plan(task, _launch("mini-swe-agent", task, backend), timeout_s=30)
    controller = FakeJobController(server, "Complete", _message("124 1000.0 1030.2", 0, "0\n"))

    result = await _run(backend, server, controller, plan)

    assert result.timed_out and result.exit_code is None
    assert result.reward is not None and result.reward.value == 0.0
    for obj in _created(server):
        _validate(obj)


async def test_a_verifier_without_a_reward_is_reported(backend: KubernetesBackend, server: Any) -> None:
    task = _task()
    plan = _plan(task, _launch("claude-code", task, backend))
    controller = FakeJobController(server, "Complete", _message("3 1000.0 1001.0", 1, None))

    result = await _run(backend, server, controller, plan)

    assert result.reward is None and result.exit_code == 3
    assert "neither reward.txt nor reward.json" in result.verifier_error


async def test_a_failed_job_is_an_infrastructure_failure_and_is_deleted(
    backend: KubernetesBackend, server: Any
) -> None:
    task = _task()
    plan = _plan(task, _launch("openclaw", task, backend))
    controller = FakeJobController(server, "Failed", None, waiting="ImagePullBackOff")

    with pytest.raises(SandboxStartError, match=r"DeadlineExceeded.*harness ImagePullBackOff"):
        await _run(backend, server, controller, plan)

    name = _created(server)[0]["metadata"]["name"]
    assert server.objects["batch/v1/jobs", NS, name].deleted
    for obj in _created(server):
        _validate(obj)


async def test_a_pod_that_can_never_start_fails_fast_and_is_deleted(backend: KubernetesBackend, server: Any) -> None:
    task = _task()
    plan = _plan(task, _launch("codex", task, backend))
    controller = FakeJobController(server, "", None, waiting="InvalidImageName")
    t0 = asyncio.get_running_loop().time()

    with pytest.raises(SandboxStartError, match="harness cannot start: InvalidImageName"):
        await _run(backend, server, controller, plan)

    assert asyncio.get_running_loop().time() - t0 < 15  # one watch period, not the Job's deadline
    assert server.objects["batch/v1/jobs", NS, _created(server)[0]["metadata"]["name"]].deleted


async def test_cancelling_a_rollout_deletes_its_job(backend: KubernetesBackend, server: Any) -> None:
    task = _task()
    plan = _plan(task, _launch("codex", task, backend))
    controller = FakeJobController(server, "", _message("0 1 2", 0, "1"))
    fake = asyncio.create_task(controller.run())
    running = asyncio.create_task(backend.execute(plan))
    await asyncio.wait_for(controller.resumed.wait(), 10)
    await asyncio.sleep(0.5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await fake

    name = _created(server)[0]["metadata"]["name"]
    deletes = [r for r in _requests(server) if r.action == kmock.action.DELETE]
    assert [(r.name, r.params.get("propagationPolicy")) for r in deletes] == [(name, "Background")]
    assert server.objects["batch/v1/jobs", NS, name].deleted


async def test_an_api_server_that_refuses_a_create_is_a_start_error(backend: KubernetesBackend, server: Any) -> None:
    server[f"post /api/v1/namespaces/{NS}/secrets"] << 403 << {"kind": "Status", "code": 403, "reason": "Forbidden"}
    task = _task()
    plan = _plan(task, _launch("codex", task, backend))

    with pytest.raises(SandboxStartError, match="403"):
        await asyncio.wait_for(backend.execute(plan), 30)

    assert server.objects["batch/v1/jobs", NS, _created(server)[0]["metadata"]["name"]].deleted


async def test_a_proxy_host_that_does_not_resolve_is_a_start_error_before_any_object(server: Any) -> None:
    api = k8s_client.ApiClient(k8s_client.Configuration(host=str(server.url).rstrip("/")))
    settings = KubernetesSandboxSettings(proxy_url="http://proxy.elsewhere.svc.cluster.local:8080")
    backend = KubernetesBackend(settings, api_client=api, resolve=_fake_cluster_dns)
    task = _task()
    try:
        with pytest.raises(SandboxStartError, match=r"proxy\.elsewhere\.svc\.cluster\.local.* does not resolve"):
            await asyncio.wait_for(backend.execute(_plan(task, _launch("codex", task, backend))), 30)
    finally:
        await backend.close()
    assert _created(server) == []


async def test_a_proxy_url_with_an_address_needs_no_host_entry() -> None:
    settings = KubernetesSandboxSettings(proxy_url="http://10.0.0.7:8080")
    backend = KubernetesBackend(
        settings, api_client=k8s_client.ApiClient(k8s_client.Configuration(host="http://unused"))
    )
    address = await backend.proxy_address()  # never resolved: an address already
    task = _task()
    job, _, policy = backend.manifests(_plan(task, _launch("codex", task, backend)), proxy_ip=address)
    pod = job["spec"]["template"]["spec"]
    assert address == "10.0.0.7" and "hostAliases" not in pod and pod["dnsPolicy"] == "None"
    assert [rule["ports"] for rule in policy["spec"]["egress"]] == [[{"protocol": "TCP", "port": 8080}]]


class _Sessions:
    """A fake of the proxy's sessions: one key per attempt, as the proxy's CreateSession gives."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []

    async def open(self, rollout: Rollout, attempt: int, ttl_s: float) -> OpenedSession:
        self.opened.append((rollout.rollout_id, attempt))
        return OpenedSession(f"ofk-{rollout.rollout_id}-attempt-{attempt}", None)

    async def close(self, rollout_id: str) -> int:
        return 2  # model calls the attempt's session admitted (none: a bypass)


class _Events:
    async def submitted(self, request_id: str, rollouts: list[Rollout]) -> None:
        pass

    async def started(self, rollout: Rollout) -> None:
        pass

    async def finished(self, rollout: Rollout) -> None:
        pass


async def test_a_job_that_failed_is_retried_as_a_new_attempt_with_its_own_job_and_session(
    backend: KubernetesBackend, server: Any
) -> None:
    """Issue 26 item 5 on this backend: the retry of a Job that failed mid-run is another Job,
    under another proxy session (attempt 2, its own key in its own Secret); the rollout ends with
    ``attempts == 2``, the number the store assembles by (only the last attempt's calls, whose
    records carry ``rollout_attempt``; the store's assembly tests check that rule)."""
    registry = RolloutRegistry(_Events())
    sessions = _Sessions()
    executor = RolloutExecutor(
        registry,
        CATALOG,
        backend,
        sessions,
        lambda rollout, task, base_url, key, timeout_s: _launch("codex", task, backend, key),
        settings=ExecutionSettings(max_infra_attempts=2, retry_backoff_s=0.01),
    )
    (rollout,) = await registry.submit(
        request_id="q",
        run_id="run",
        tasks=[TaskRef(task_id="celsius-convert", task_set="test")],
        group_size=1,
        harness="codex",
        model_name="policy",
        min_policy_version=0,
        timeout_s=0,
    )
    first = FakeJobController(server, "Failed", None)
    running = asyncio.create_task(executor.run(rollout.rollout_id))
    await asyncio.wait_for(first.run(), 30)
    second = FakeJobController(
        server, "Complete", _message("0 5 9", 0, "1"), skip=frozenset({first.job["metadata"]["name"]})
    )
    await asyncio.wait_for(second.run(), 30)
    ended = await asyncio.wait_for(running, 30)

    assert ended.status is RolloutStatus.SUCCEEDED and ended.reward == 1.0 and ended.attempts == 2
    assert sessions.opened == [(rollout.rollout_id, 1), (rollout.rollout_id, 2)]
    jobs = [o for o in _created(server) if o["kind"] == "Job"]
    secrets = [o for o in _created(server) if o["kind"] == "Secret"]
    assert [j["metadata"]["name"] for j in jobs] == [first.job["metadata"]["name"], second.job["metadata"]["name"]]
    assert len({j["metadata"]["name"] for j in jobs}) == 2
    assert all(j["metadata"]["annotations"][ROLLOUT_ID_ANNOTATION] == rollout.rollout_id for j in jobs)
    keys = [
        {base64.b64decode(v).decode() for k, v in secret["data"].items() if k.startswith("env.")} for secret in secrets
    ]
    assert keys == [
        {f"ofk-{rollout.rollout_id}-attempt-1"},
        {f"ofk-{rollout.rollout_id}-attempt-2"},
    ]  # each attempt's pod holds only its own session's key
    for job in jobs:
        assert server.objects["batch/v1/jobs", NS, job["metadata"]["name"]].deleted


@pytest.mark.parametrize("harness", ["codex", "claude-code", "openclaw", "mini-swe-agent", "command", "oracle"])
def test_every_object_validates_strictly_and_the_pod_is_hardened_for_every_harness_and_task(harness: str) -> None:
    backend = KubernetesBackend(
        KubernetesSandboxSettings(), api_client=k8s_client.ApiClient(k8s_client.Configuration(host="http://unused"))
    )
    for task_set in CATALOG.sets():
        for task_id in CATALOG.ids(task_set):
            task = CATALOG.get(task_set, task_id)
            launch = None if harness == "oracle" else _launch(harness, task, backend)
            job, secret, policy = backend.manifests(_plan(task, launch), proxy_ip=PROXY_IP)
            for obj in (job, secret, policy):
                _validate(obj)
            _assert_hardened(job, secret, policy, backend)
            init = [c["name"] for c in job["spec"]["template"]["spec"]["initContainers"]]
            copies_an_install = harness not in ("command", "oracle")
            assert init == ["workspace", *(["harness-install"] if copies_an_install else []), HARNESS_CONTAINER]


def test_the_termination_message_is_parsed_as_harbor_reads_rewards() -> None:
    reward_json = base64.b64encode(b'{"reward": 0.75, "tests": 3}').decode()
    report = PodReport(f"harness 0 10.5 20.0\nverifier 0\nreward.json {reward_json}\n")
    assert (report.harness_exit, report.harness_end - report.harness_start) == (0, 9.5)
    assert report.reward().value == 0.75 and report.reward().values == {"reward": 0.75, "tests": 3.0}
    empty = PodReport("harness \nverifier 137\n")
    assert empty.harness_exit is None and empty.verifier_exit == 137


# --- the pod's scripts, run for real ------------------------------------------------------------
#
# The harness and verifier containers of the Job are run in bubblewrap as a kubelet would run
# them: every volume mount, environment variable and command taken from the manifests, Secret
# volumes written from the Secret's items, emptyDirs as fresh folders. The host's /usr stands in
# for the task image (the example tasks need only bash, coreutils and python3); the two init
# containers that copy out of images are replaced by copying the prepared workspace.


def _run_container(container: dict[str, Any], volumes: dict[str, Path], secret: dict[str, bytes], tmp: Path) -> None:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if Path(f"/{link}").is_symlink():
            args += ["--symlink", f"usr/{link}", f"/{link}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--clearenv"]
    for m in container["volumeMounts"]:
        source = volumes[m["name"]] / m.get("subPath", "")
        source.mkdir(parents=True, exist_ok=True)  # as the kubelet creates a subPath
        args += ["--ro-bind" if m.get("readOnly") else "--bind", str(source), m["mountPath"]]
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        args += ["--setenv", e["name"], secret[ref["key"]].decode() if ref else e["value"]]
    if container.get("terminationMessagePath"):
        args += ["--bind", str(tmp / "termination-log"), container["terminationMessagePath"]]
    if container["securityContext"].get("readOnlyRootFilesystem"):
        args += ["--remount-ro", "/"]  # only the mounts above stay writable
    args += ["--chdir", container.get("workingDir", "/"), *container["command"]]
    done = subprocess.run(args, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, (container["name"], done.stderr.decode()[-2000:])


async def _run_pod(tmp: Path, plan: ExecutionPlan, backend: KubernetesBackend) -> PodReport:
    job, secret_obj, _ = backend.manifests(plan, proxy_ip=PROXY_IP)
    secret = {k: base64.b64decode(v) for k, v in secret_obj["data"].items()}
    spec = job["spec"]["template"]["spec"]
    volumes: dict[str, Path] = {}
    for vol in spec["volumes"]:
        folder = tmp / "volumes" / vol["name"]
        folder.mkdir(parents=True)
        for item in vol.get("secret", {}).get("items", []):
            (folder / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (folder / item["path"]).write_bytes(secret[item["key"]])
        volumes[vol["name"]] = folder
    local = LocalBackend(LocalSandboxSettings(root=str(tmp / "sb"), cache=str(tmp / "cache"), artifacts=""), "x:9")
    template = await local.prepare_workspace(plan.task)
    shutil.copytree(template, volumes["workspace"], dirs_exist_ok=True, symlinks=True)
    (tmp / "termination-log").write_text("")
    harness = next(c for c in spec["initContainers"] if c["name"] == HARNESS_CONTAINER)
    await asyncio.to_thread(_run_container, harness, volumes, secret, tmp)
    await asyncio.to_thread(_run_container, spec["containers"][0], volumes, secret, tmp)
    return PodReport((tmp / "termination-log").read_text())


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@needs_bwrap
async def test_the_pods_scripts_run_the_oracle_and_the_verifier_reports_1(tmp_path: Path) -> None:
    backend = KubernetesBackend(
        KubernetesSandboxSettings(), api_client=k8s_client.ApiClient(k8s_client.Configuration(host="http://unused"))
    )
    task = CATALOG.get("train", "count-lines")
    report = await _run_pod(tmp_path, _plan(task, None), backend)

    assert report.harness_exit == 0 and report.verifier_exit == 0
    assert 0 <= report.harness_end - report.harness_start < 60
    assert report.reward().value == 1.0


@needs_bwrap
async def test_the_pods_scripts_kill_a_hanging_harness_and_still_verify(tmp_path: Path) -> None:
    backend = KubernetesBackend(
        KubernetesSandboxSettings(), api_client=k8s_client.ApiClient(k8s_client.Configuration(host="http://unused"))
    )
    task = CATALOG.get("train", "count-lines")
    ctx = LaunchContext(
        instruction=task.instruction,
        base_url=backend.proxy_base_url,
        api_key=KEY,
        model="policy",
        workdir=task.environment.workdir,
        timeout_s=2,
        command=("sh", "-c", 'test "$OPENAI_API_KEY" = "{api_key}" && sleep 60'),
    )
    plan = _plan(task, adapter("command").launch(ctx, None), timeout_s=2)
    report = await _run_pod(tmp_path, plan, backend)

    assert report.harness_exit == 124  # timeout's status: the key arrived, then the sleep was killed
    assert 2 <= report.harness_end - report.harness_start < 10
    assert report.verifier_exit == 0 and report.reward().value == 0.0


async def test_the_service_builds_the_backend_from_its_settings_and_a_kubeconfig(server: Any, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": str(server.url).rstrip("/")}}],
                "users": [{"name": "orchestrator", "user": {"token": "fake-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "orchestrator"}}],
                "current-context": "fake",
            }
        )
    )
    settings = OrchestratorSettings(
        sandbox=SandboxSettings(
            backend="kubernetes",
            # an address: the orchestrator's own resolver would not know the cluster's names here
            kubernetes=KubernetesSandboxSettings(
                kubeconfig=str(kubeconfig), watch_timeout_s=2, proxy_url=f"http://{PROXY_IP}:8080"
            ),
        )
    )
    backend = backend_from_settings(settings)
    assert isinstance(backend, KubernetesBackend)
    task = _task()
    rollout = Rollout(
        rollout_id="ro-settings",
        run_id="run",
        task_id=task.task_id,
        task_set=task.task_set,
        group_id="grp",
        group_index=0,
        harness="mini-swe-agent",
        model_name="policy",
        status=RolloutStatus.PENDING,
        min_policy_version=0,
        timeout_s=0,
        create_time=0,
    )
    launch = launches_from_settings(settings)(rollout, task, backend.proxy_base_url, KEY, 120)
    assert launch.image == "openforge/harness-mini-swe-agent:2.4.6" and launch.argv[0] == "mini"
    # for the run manifest: the harness image's tag is the installed version, the task's image
    # the sandbox's (the one its Job runs, checked below)
    assert launch.version == "2.4.6"
    assert backend.sandbox_image(task) == "openforge/task-test-celsius-convert:latest"
    try:
        result = await _run(
            backend, server, FakeJobController(server, "Complete", _message("0 5 9", 0, "1")), _plan(task, launch)
        )
    finally:
        await backend.close()
    assert result.reward is not None and result.reward.value == 1.0
    assert {r.headers.get("Authorization") for r in _requests(server)} == {"Bearer fake-token"}

    missing = KubernetesSandboxSettings(kubeconfig=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="OPENFORGE_SANDBOX__KUBERNETES__KUBECONFIG"):
        KubernetesBackend(missing)


@pytest.mark.parametrize("rollout_id", ["ro-0123456789abcdef", "Run/ÄÖ/" + "x" * 200, "---", ""])
def test_job_names_are_dns_labels_unique_per_rollout_and_attempt(rollout_id: str) -> None:
    name = job_name(rollout_id, "a1b2c3")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    assert name != job_name(rollout_id + "x", "a1b2c3") and name != job_name(rollout_id, "d4e5f6")
