"""The Kubernetes base, validated offline: built-in kinds by kubernetes-validate, KEDA's by its CRD schema.

kustomize is not installed here, so the raw files are checked, plus what kustomize
would need (the kustomization names every file) and what ties the resources
together (selectors, probe ports, the queue KEDA watches, grace periods).
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared import keys
from shared.settings import GatewaySettings, WorkerSettings
from tests.deployment import K8S_BASE, SCHEMAS, k8s_container_env, k8s_manifests, k8s_resource

# The oldest Kubernetes release still maintained when this was written, and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.32.0", kubernetes_validate.utils.latest_version()]
CRD_KINDS = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}


def _builtin_manifests() -> list[str]:
    return [name for name, doc in k8s_manifests().items() if doc["kind"] not in CRD_KINDS]


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = _pod_spec(workload)["containers"]
    return dict(container)


def test_kustomization_lists_every_manifest_once() -> None:
    kustomization = yaml.safe_load((K8S_BASE / "kustomization.yaml").read_text())
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    assert set(resources) == set(k8s_manifests())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", _builtin_manifests())
def test_manifest_is_valid_kubernetes(manifest: str, version: str) -> None:
    # strict: unknown fields are errors, as with `kubectl apply --validate=strict`.
    kubernetes_validate.validate(k8s_manifests()[manifest], version, strict=True)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema with unknown fields refused, as the API server's strict field validation does."""
    schema = copy.deepcopy(schema)
    pending = [schema]
    while pending:
        node = pending.pop()
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        pending += list(node.get("properties", {}).values())
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                pending.append(node[key])
    return schema


@pytest.mark.parametrize(("kind", "name"), [("ScaledObject", "worker"), ("TriggerAuthentication", "redis")])
def test_keda_resources_match_kedas_crds(kind: str, name: str) -> None:
    crd = yaml.safe_load((SCHEMAS / CRD_KINDS[kind]).read_text())
    resource = k8s_resource(kind, name)
    served = {f"{crd['spec']['group']}/{v['name']}": v for v in crd["spec"]["versions"] if v["served"]}
    assert resource["apiVersion"] in served
    schema = _strict(served[resource["apiVersion"]]["schema"]["openAPIV3Schema"])
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(resource)
    ]
    assert errors == []


def test_workers_scale_on_their_own_models_interactive_queue() -> None:
    scaled = k8s_resource("ScaledObject", "worker")
    worker = k8s_resource("Deployment", "worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # zero workers would make the model vanish
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    env = k8s_container_env(worker)
    settings = WorkerSettings(
        model=env["TOKENFERRY_MODEL"], served_model_name=env.get("TOKENFERRY_SERVED_MODEL_NAME")
    )
    assert trigger["metadata"]["listName"] == keys.queue(settings.model_name, keys.Lane.INTERACTIVE)
    # KEDA's operator lives in another namespace: the address names this one's Redis Service.
    namespace = yaml.safe_load((K8S_BASE / "kustomization.yaml").read_text())["namespace"]
    redis_port = k8s_resource("Service", "redis")["spec"]["ports"][0]["port"]
    assert trigger["metadata"]["address"] == f"redis.{namespace}.svc.cluster.local:{redis_port}"
    # The URL carries Redis' password (test_deploy_k8s_security.py checks where it comes from).
    url = urlsplit(env["TOKENFERRY_REDIS_URL"])
    assert (url.hostname, url.port) == ("redis", redis_port)


def test_gateway_routes_on_ready_and_restarts_on_health() -> None:
    container = _container(k8s_resource("Deployment", "gateway"))
    port_names = {port["name"] for port in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in port_names
    (http,) = container["ports"]
    assert k8s_container_env(k8s_resource("Deployment", "gateway"))["TOKENFERRY_PORT"] == str(
        http["containerPort"]
    )


def test_gateway_scales_on_cpu_from_two_replicas() -> None:
    hpa = k8s_resource("HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gateway"}
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_worker_requests_a_gpu_and_exposes_metrics() -> None:
    container = _container(k8s_resource("Deployment", "worker"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = k8s_container_env(k8s_resource("Deployment", "worker"))
    assert {port["containerPort"] for port in container["ports"]} == {int(env["TOKENFERRY_METRICS_PORT"])}
    assert env["TOKENFERRY_METRICS_HOST"] == "0.0.0.0"


def test_redis_keeps_an_append_only_file_on_a_persistent_volume() -> None:
    redis = k8s_resource("StatefulSet", "redis")
    container = _container(redis)
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    mounted = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    claims = {claim["metadata"]["name"] for claim in redis["spec"]["volumeClaimTemplates"]}
    assert mounted[data_dir] in claims
    assert redis["spec"]["serviceName"] == "redis"


def _prestop_seconds(container: dict[str, Any]) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def _drain_grace(settings: type[GatewaySettings] | type[WorkerSettings], env: dict[str, str]) -> float:
    default = settings.model_fields["drain_grace_s"].default
    return float(env.get("TOKENFERRY_DRAIN_GRACE_S", default))


@pytest.mark.parametrize(("name", "settings"), [("gateway", GatewaySettings), ("worker", WorkerSettings)])
def test_sigkill_comes_only_after_the_drain(
    name: str, settings: type[GatewaySettings] | type[WorkerSettings]
) -> None:
    workload = k8s_resource("Deployment", name)
    container = _container(workload)
    drain = _drain_grace(settings, k8s_container_env(workload))
    margin = 10  # hand-over, deregistration, process exit
    grace = _pod_spec(workload)["terminationGracePeriodSeconds"]
    assert grace >= _prestop_seconds(container) + drain + margin


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_disruption_budget_and_service_select_the_deployments_pods(name: str) -> None:
    labels = k8s_resource("Deployment", name)["spec"]["template"]["metadata"]["labels"]
    selector = k8s_resource("PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert k8s_resource("Deployment", name)["spec"]["selector"]["matchLabels"].items() <= labels.items()
    if name == "gateway":
        assert k8s_resource("Service", name)["spec"]["selector"].items() <= labels.items()
