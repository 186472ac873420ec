"""What the manifests promise, checked on the built overlays.

Hardening, native gRPC probes on the standard health service, services wired by their settings
variables, RBAC confined to the rollout namespace, rollout pods isolated to the proxy, and GPU
scheduling only where the gpu component is used.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from openforge_core.settings import ServiceSettings

K8sObject = dict[str, Any]

SERVICES = ("proxy", "orchestrator", "trajectory-store", "inference", "trainer")
NAMESPACE = "openforge"
ROLLOUTS = "openforge-rollouts"
GRPC_PORT = 50051

#: The Python package of each service; its ``settings`` module holds its settings class.
PACKAGES = {
    "proxy": "openforge_proxy",
    "orchestrator": "openforge_orchestrator",
    "trajectory-store": "openforge_trajectory_store",
    "inference": "openforge_inference",
    "trainer": "openforge_trainer",
}
#: Variables the manifests set for a setting that the service does not read yet (the agreed
#: contract; a top-level OPENFORGE_* name the settings do not know is ignored, not refused).
PENDING = {"proxy": {"OPENFORGE_HTTP__PORT"}}
#: Other variables the pods set: the downward API and the database credentials the DSN uses.
OTHER_ENV = {"POD_NAME", "POD_NAMESPACE", "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def find(objects: list[K8sObject], kind: str, name: str, namespace: str | None = NAMESPACE) -> K8sObject:
    for obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return obj
    raise AssertionError(f"no {kind} {namespace}/{name}")


def workloads(objects: list[K8sObject]) -> Iterator[K8sObject]:
    yield from (o for o in objects if o["kind"] in ("Deployment", "StatefulSet"))


def pod(obj: K8sObject) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def config_of(objects: list[K8sObject], service: str) -> dict[str, str]:
    """The service's environment: its ConfigMap plus the literal env values of its container."""
    container = pod(find(objects, "Deployment", service))["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        cm = find(objects, "ConfigMap", source["configMapRef"]["name"])
        env.update(cm["data"])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", "<from>")
    return env


@pytest.fixture(params=["overlays/dev", "overlays/gpu", "hardened"])
def objects(request: pytest.FixtureRequest, built: dict[str, list[K8sObject]]) -> list[K8sObject]:
    if request.param == "hardened":
        result: list[K8sObject] = request.getfixturevalue("hardened")
        return result
    return built[request.param]


# --- hardening ------------------------------------------------------------------------------


def test_every_pod_is_hardened(objects: list[K8sObject]) -> None:
    for obj in workloads(objects):
        name = obj["metadata"]["name"]
        spec = pod(obj)
        assert spec["enableServiceLinks"] is False, name
        assert spec["automountServiceAccountToken"] is (name == "orchestrator"), name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["serviceAccountName"] == name, name
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert "privileged" not in sc or sc["privileged"] is False, name
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), name
            image = container["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image


def test_the_hardened_composition_has_read_only_root_filesystems(hardened: list[K8sObject]) -> None:
    for obj in workloads(hardened):
        spec = pod(obj)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, obj["metadata"]["name"]


def test_only_the_live_updated_services_get_a_writable_root_in_dev(built: dict[str, list[K8sObject]]) -> None:
    for obj in workloads(built["overlays/dev"]):
        writable = not pod(obj)["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
        assert writable is (obj["metadata"]["name"] in SERVICES), obj["metadata"]["name"]


def test_the_services_namespace_enforces_the_restricted_pod_security_standard(
    objects: list[K8sObject],
) -> None:
    labels = find(objects, "Namespace", NAMESPACE, None)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    find(objects, "Namespace", ROLLOUTS, None)
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        assert namespace in (None, NAMESPACE, ROLLOUTS), obj["metadata"]


# --- the five services ------------------------------------------------------------------------


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_its_deployment_service_account_and_config(objects: list[K8sObject], service: str) -> None:
    deployment = find(objects, "Deployment", service)
    find(objects, "ServiceAccount", service)
    container = pod(deployment)["containers"][0]
    assert container["name"] == service
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == GRPC_PORT
    svc = find(objects, "Service", service)
    assert svc["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert svc_ports["grpc"]["port"] == GRPC_PORT
    assert svc_ports["grpc"]["targetPort"] == "grpc"
    if service == "proxy":
        assert ports["http"] == 8080
        assert svc_ports["http"]["targetPort"] == "http"
    assert "command" not in container and "args" not in container, "the image's exec-form entrypoint runs"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_is_probed_with_native_grpc_health_checks(objects: list[K8sObject], service: str) -> None:
    container = pod(find(objects, "Deployment", service))["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # No "service" field: the overall status of the standard grpc.health.v1 service.
        assert container[probe]["grpc"] == {"port": GRPC_PORT}, probe
    assert container["livenessProbe"]["failureThreshold"] > container["readinessProbe"]["failureThreshold"]


def settings_class(service: str) -> type[ServiceSettings]:
    module = importlib.import_module(f"{PACKAGES[service]}.settings")
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, ServiceSettings) and value.__module__ == module.__name__
    ]
    assert len(found) == 1, f"{module.__name__}: one ServiceSettings subclass expected"
    return found[0]


def reads(settings: BaseModel, key: str) -> bool:
    """Whether ``OPENFORGE_A__B`` names a field ``a.b`` of ``settings``."""
    node: object = settings
    for part in key.removeprefix("OPENFORGE_").lower().split("__"):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            return False
        node = getattr(node, part)
    return True


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_accepts_its_configuration(
    objects: list[K8sObject], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's own settings class loads the pod's environment, and reads every variable."""
    env = config_of(objects, service)
    for key in env:
        assert key.startswith(("OPENFORGE_", "OTEL_")) or key in OTHER_ENV, key
    for key in list(os.environ):
        if key.startswith("OPENFORGE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = settings_class(service)()  # refuses an unknown nested key or a bad value
    assert settings.grpc.host == "0.0.0.0"
    assert settings.grpc.port == GRPC_PORT
    assert settings.log.format == "json"
    ignored = {k for k in env if k.startswith("OPENFORGE_") and not reads(settings, k)}
    assert ignored <= PENDING.get(service, set()), f"{service} ignores {ignored}"
    assert env["OTEL_SERVICE_NAME"] == service


@pytest.mark.parametrize("service", SERVICES)
def test_each_address_a_service_is_given_reaches_a_service_port(objects: list[K8sObject], service: str) -> None:
    env = config_of(objects, service)
    nats = env["OPENFORGE_NATS__URL"]
    assert nats.startswith("nats://")
    host, port = nats.removeprefix("nats://").split(":")
    assert int(port) in {p["port"] for p in find(objects, "Service", host)["spec"]["ports"]}
    for key, value in env.items():
        if not key.startswith("OPENFORGE_SERVICES__"):
            continue
        host, port = value.split(":")
        assert host == key.removeprefix("OPENFORGE_SERVICES__").lower().replace("_", "-"), key
        grpc = {p["name"]: p["port"] for p in find(objects, "Service", host)["spec"]["ports"]}["grpc"]
        assert int(port) == grpc, key


def test_each_service_gets_the_addresses_it_calls(objects: list[K8sObject]) -> None:
    def services(name: str) -> set[str]:
        return {k for k in config_of(objects, name) if k.startswith("OPENFORGE_SERVICES__")}

    assert services("proxy") == {"OPENFORGE_SERVICES__INFERENCE"}
    assert services("orchestrator") >= {"OPENFORGE_SERVICES__PROXY", "OPENFORGE_SERVICES__TRAJECTORY_STORE"}
    assert services("trainer") >= {
        "OPENFORGE_SERVICES__ORCHESTRATOR",
        "OPENFORGE_SERVICES__TRAJECTORY_STORE",
        "OPENFORGE_SERVICES__INFERENCE",
    }
    assert config_of(objects, "proxy")["OPENFORGE_HTTP__PORT"] == "8080"


def test_the_store_uses_postgresql_with_the_generated_credentials(objects: list[K8sObject]) -> None:
    container = pod(find(objects, "Deployment", "trajectory-store"))["containers"][0]
    env = {v["name"]: v for v in container["env"]}
    assert env["OPENFORGE_STORE__DSN"]["value"].startswith("postgresql://")
    assert "@postgres:5432/" in env["OPENFORGE_STORE__DSN"]["value"]
    secret_name = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    secret = find(objects, "Secret", secret_name)
    postgres = pod(find(objects, "StatefulSet", "postgres"))["containers"][0]
    assert postgres["envFrom"] == [{"secretRef": {"name": secret_name}}]
    assert set(secret["data"]) == {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def test_inference_reads_the_model_from_a_mounted_volume(objects: list[K8sObject]) -> None:
    spec = pod(find(objects, "Deployment", "inference"))
    env = config_of(objects, "inference")
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    model_root = "/" + env["OPENFORGE_MODEL_PATH"].strip("/").split("/")[0]
    assert mounts[model_root]["readOnly"] is True
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    }
    find(objects, "PersistentVolumeClaim", claims[mounts[model_root]["name"]])
    assert env["OPENFORGE_ENGINE"] in ("vllm", "transformers")


# --- NATS and PostgreSQL --------------------------------------------------------------------


def test_nats_runs_jetstream_on_a_volume(objects: list[K8sObject]) -> None:
    nats = find(objects, "StatefulSet", "nats")
    assert [t["metadata"]["name"] for t in nats["spec"]["volumeClaimTemplates"]] == ["data"]
    container = pod(nats)["containers"][0]
    data_mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["data"]
    config_name = next(v["configMap"]["name"] for v in pod(nats)["volumes"] if "configMap" in v)
    conf = find(objects, "ConfigMap", config_name)["data"]["nats.conf"]
    assert "jetstream" in conf
    assert f"store_dir: {data_mount}/" in conf
    assert container["args"] == ["--config", "/etc/nats/nats.conf"]
    assert nats["spec"]["serviceName"] == "nats-headless"
    find(objects, "Service", "nats-headless")


def test_postgres_keeps_its_data_on_a_volume(objects: list[K8sObject]) -> None:
    postgres = find(objects, "StatefulSet", "postgres")
    assert [t["metadata"]["name"] for t in postgres["spec"]["volumeClaimTemplates"]] == ["data"]
    container = pod(postgres)["containers"][0]
    data_mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["data"]
    pgdata = {e["name"]: e["value"] for e in container["env"]}["PGDATA"]
    assert pgdata.startswith(data_mount + "/")


# --- RBAC and network isolation ---------------------------------------------------------------


def test_the_orchestrator_may_only_manage_rollout_jobs_secrets_and_policies(objects: list[K8sObject]) -> None:
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = [o for o in objects if o["kind"] == "Role"]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert [r["metadata"]["namespace"] for r in roles] == [ROLLOUTS]
    assert [b["metadata"]["namespace"] for b in bindings] == [ROLLOUTS]
    assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": "orchestrator", "namespace": NAMESPACE}]
    assert bindings[0]["roleRef"]["name"] == roles[0]["metadata"]["name"]
    creatable: set[tuple[str, str]] = set()
    for rule in roles[0]["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        if "create" in rule["verbs"]:
            creatable.update((group, res) for group in rule["apiGroups"] for res in rule["resources"])
    assert creatable == {("batch", "jobs"), ("", "secrets"), ("networking.k8s.io", "networkpolicies")}


def test_rollout_pods_get_no_api_token(objects: list[K8sObject]) -> None:
    sa = find(objects, "ServiceAccount", "rollout", ROLLOUTS)
    assert sa["automountServiceAccountToken"] is False


def policies(objects: list[K8sObject], namespace: str) -> list[K8sObject]:
    return [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == namespace]


def test_rollout_pods_may_reach_the_proxy_and_nothing_else(objects: list[K8sObject]) -> None:
    rollout_policies = policies(objects, ROLLOUTS)
    deny = [p for p in rollout_policies if p["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}]
    assert deny, "no default-deny policy in the rollout namespace"
    for policy in rollout_policies:
        spec = policy["spec"]
        assert "ingress" not in spec, "rollout pods accept no traffic"
        for rule in spec.get("egress", []):
            assert rule.get("to") and rule.get("ports"), "every egress rule names its peers and ports"
            for peer in rule["to"]:
                assert "ipBlock" not in peer
                ns = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                pods = peer["podSelector"]["matchLabels"]
                # the proxy only: not even the cluster DNS (a query could carry data out)
                assert (ns, pods) == (NAMESPACE, {"app.kubernetes.io/name": "proxy"})
                assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    # The proxy's pods carry the label the policy selects, on the HTTP port the harnesses use.
    proxy = find(objects, "Deployment", "proxy")
    assert proxy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "proxy"


def test_only_the_proxy_http_port_is_open_to_rollouts(objects: list[K8sObject]) -> None:
    service_policies = policies(objects, NAMESPACE)
    assert any(p["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]} for p in service_policies)
    from_other_namespaces = [
        (peer["namespaceSelector"]["matchLabels"], p["spec"]["podSelector"], rule.get("ports"))
        for p in service_policies
        for rule in p["spec"].get("ingress", [])
        for peer in rule["from"]
        if "namespaceSelector" in peer
    ]
    assert sorted(from_other_namespaces, key=str) == sorted(
        [
            (
                {"kubernetes.io/metadata.name": ROLLOUTS},
                {"matchLabels": {"app.kubernetes.io/name": "proxy"}},
                [{"protocol": "TCP", "port": 8080}],
            ),
            # Prometheus, from a namespace labelled for it, on the metrics port only.
            (
                {"openforge.dev/scrape-metrics": "true"},
                {"matchLabels": {"openforge.dev/tier": "service"}},
                [{"protocol": "TCP", "port": 9464}],
            ),
        ],
        key=str,
    )


def test_every_service_is_scraped_on_its_metrics_port(objects: list[K8sObject]) -> None:
    for d in (find(objects, "Deployment", name) for name in SERVICES):
        name = d["metadata"]["name"]
        template = d["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        port = int(annotations["prometheus.io/port"])
        (container,) = template["spec"]["containers"]
        assert {"name": "metrics", "containerPort": port} in container["ports"], name
        assert template["metadata"]["labels"]["openforge.dev/tier"] == "service", name
        config = find(objects, "ConfigMap", container["envFrom"][0]["configMapRef"]["name"])
        assert config["data"]["OPENFORGE_METRICS__PORT"] == str(port), name
        assert config["data"]["OPENFORGE_METRICS__HOST"] == "0.0.0.0", name


# --- GPU and telemetry --------------------------------------------------------------------------


def gpu_limit(obj: K8sObject) -> Any:
    return pod(obj)["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")


def test_the_gpu_overlay_puts_inference_and_trainer_on_gpu_nodes(built: dict[str, list[K8sObject]]) -> None:
    objects = built["overlays/gpu"]
    for name in ("inference", "trainer"):
        deployment = find(objects, "Deployment", name)
        spec = pod(deployment)
        assert gpu_limit(deployment) == 1
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["containers"][0]["image"].startswith(f"openforge/{name}-gpu:")
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        shm = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}["/dev/shm"]
        assert {v["name"]: v for v in spec["volumes"]}[shm]["emptyDir"]["medium"] == "Memory"
    assert config_of(objects, "inference")["OPENFORGE_ENGINE"] == "vllm"
    for name in ("proxy", "orchestrator", "trajectory-store"):
        assert gpu_limit(find(objects, "Deployment", name)) is None


def test_the_dev_overlay_asks_for_no_gpu(built: dict[str, list[K8sObject]]) -> None:
    objects = built["overlays/dev"]
    assert all(gpu_limit(o) is None and "nodeSelector" not in pod(o) for o in workloads(objects))
    assert config_of(objects, "inference")["OPENFORGE_ENGINE"] == "transformers"


def test_telemetry_goes_to_the_collector_where_it_is_deployed(built: dict[str, list[K8sObject]]) -> None:
    collector = find(built["overlays/dev"], "Service", "otel-collector")
    otlp = {p["name"]: p["port"] for p in collector["spec"]["ports"]}["otlp-grpc"]
    for service in SERVICES:
        env = config_of(built["overlays/dev"], service)
        assert env["OTEL_SDK_DISABLED"] == "false"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{otlp}"
        assert config_of(built["base"], service)["OTEL_SDK_DISABLED"] == "true"


def test_the_trainer_writes_checkpoints_where_inference_can_read_them(objects: list[K8sObject]) -> None:
    def claim_mount(service: str, path: str) -> tuple[str, bool]:
        spec = pod(find(objects, "Deployment", service))
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == path)
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        return volume["persistentVolumeClaim"]["claimName"], bool(mount.get("readOnly", False))

    checkpoint_dir = config_of(objects, "trainer")["OPENFORGE_CHECKPOINT_DIR"]
    claim, read_only = claim_mount("trainer", checkpoint_dir)
    assert not read_only
    assert claim_mount("inference", checkpoint_dir) == (claim, True)
