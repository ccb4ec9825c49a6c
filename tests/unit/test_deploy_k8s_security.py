"""The Kubernetes base as a platform team reviews it, offline: probes, Pod Security, Redis auth, policies."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.deployment import k8s_container_env, k8s_manifests, k8s_resource
from tests.pod_security import restricted_violations
from worker.probes import Probes

REDIS_SECRET = {"name": "tokenferry-redis", "key": "password"}


def _workloads() -> dict[str, dict[str, Any]]:
    """Every resource with a pod template, by file name."""
    return {name: doc for name, doc in k8s_manifests().items() if "template" in doc.get("spec", {})}


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _secret_env(container: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The container's variables taken from a Secret key, as name -> {name, key}."""
    return {
        entry["name"]: entry["valueFrom"]["secretKeyRef"]
        for entry in container.get("env", [])
        if "secretKeyRef" in entry.get("valueFrom", {})
    }


@pytest.mark.parametrize("manifest", sorted(_workloads()))
def test_every_pod_template_meets_the_restricted_pod_security_level(manifest: str) -> None:
    assert restricted_violations(_workloads()[manifest]["spec"]["template"]["spec"]) == []


def _answers_itself(path: str) -> bool:
    """Whether the worker's HTTP port answers ``path`` as a probe, not with the metrics exposition."""
    statuses: list[str] = []

    def exposition(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return [b"metrics"]

    body = b"".join(Probes("w").route(exposition)({"PATH_INFO": path}, lambda s, h: statuses.append(s)))
    return body != b"metrics"


def test_worker_is_started_ready_and_alive_by_its_own_probes() -> None:
    worker = k8s_resource("Deployment", "worker")
    container = _container(worker)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    paths = {
        probe: container[probe]["httpGet"]["path"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert paths == {"startupProbe": "/health", "readinessProbe": "/ready", "livenessProbe": "/health"}
    assert all(_answers_itself(path) for path in paths.values())
    for probe in paths:
        assert ports[container[probe]["httpGet"]["port"]] == int(
            k8s_container_env(worker)["TOKENFERRY_METRICS_PORT"]
        )
    startup = container["startupProbe"]
    # A multi-GB hub download and conversion on a cold node: half an hour before the kubelet gives up.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    # A new worker must be ready before an old one goes, so the model is never left without one.
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_redis_requires_the_password_from_the_secret() -> None:
    container = _container(k8s_resource("StatefulSet", "redis"))
    args = container["args"]
    password = re.fullmatch(r"\$\((\w+)\)", args[args.index("--requirepass") + 1])
    assert password is not None
    secrets = _secret_env(container)
    assert secrets[password.group(1)] == REDIS_SECRET
    # Its own readiness probe authenticates: redis-cli reads REDISCLI_AUTH.
    assert container["readinessProbe"]["exec"]["command"][0] == "redis-cli"
    assert secrets["REDISCLI_AUTH"] == REDIS_SECRET


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_gateways_and_workers_connect_with_the_password_from_the_same_secret(name: str) -> None:
    env = _container(k8s_resource("Deployment", name))["env"]
    names = [entry["name"] for entry in env]
    url = next(entry["value"] for entry in env if entry["name"] == "TOKENFERRY_REDIS_URL")
    variable = re.fullmatch(r"\$\((\w+)\)", unquote(urlsplit(url).password or ""))
    assert variable is not None, url
    # $(VAR) expands only variables defined before it in the list.
    assert names.index(variable.group(1)) < names.index("TOKENFERRY_REDIS_URL")
    assert _secret_env({"env": env})[variable.group(1)] == REDIS_SECRET
    assert "TOKENFERRY_REDIS_URL" not in k8s_resource("ConfigMap", "tokenferry-config")["data"]


def test_keda_reads_the_queue_with_the_password_from_the_same_secret() -> None:
    (trigger,) = k8s_resource("ScaledObject", "worker")["spec"]["triggers"]
    auth = k8s_resource("TriggerAuthentication", trigger["authenticationRef"]["name"])
    (target,) = auth["spec"]["secretTargetRef"]
    assert target == {"parameter": "password", **REDIS_SECRET}


def _policies_for(workload: dict[str, Any]) -> list[dict[str, Any]]:
    labels = _pod_labels(workload).items()
    policies = [m for m in k8s_manifests().values() if m["kind"] == "NetworkPolicy"]
    return [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels]


def test_only_gateways_workers_and_keda_reach_redis_and_only_on_its_port() -> None:
    redis = k8s_resource("StatefulSet", "redis")
    (policy,) = _policies_for(redis)
    assert "Ingress" in policy["spec"]["policyTypes"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": _container(redis)["ports"][0]["containerPort"]}]
    clients = {name: _pod_labels(k8s_resource("Deployment", name)) for name in ("gateway", "worker")}
    admitted = set()
    for peer in rule["from"]:  # a rule without `from` would admit every pod: KeyError
        assert "ipBlock" not in peer
        if "namespaceSelector" in peer:  # KEDA's operator, and only it, from its own namespace
            assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "keda"}
            assert peer["podSelector"]["matchLabels"] == {"app": "keda-operator"}
            continue
        selected = [
            n for n, labels in clients.items() if peer["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(selected) == 1, peer  # each peer names gateways or workers, never something broader
        admitted.update(selected)
    assert admitted == {"gateway", "worker"}


@pytest.mark.parametrize("name", ["gateway", "worker"])
def test_gateways_and_workers_accept_connections_on_their_http_port_only(name: str) -> None:
    workload = k8s_resource("Deployment", name)
    (policy,) = _policies_for(workload)
    assert "Ingress" in policy["spec"]["policyTypes"]
    ports = [port for rule in policy["spec"]["ingress"] for port in rule["ports"]]
    assert ports == [{"protocol": "TCP", "port": _container(workload)["ports"][0]["containerPort"]}]


def _compliant_pod() -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(k8s_resource("Deployment", "gateway")["spec"]["template"]["spec"])
    return spec


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change at a dotted path of a pod spec; ``c.`` stands for its container's spec."""

    def apply(pod: dict[str, Any]) -> None:
        node: Any = pod
        *parents, leaf = path.replace("c.", "containers.0.", 1).split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[leaf] = value

    return apply


@pytest.mark.parametrize(
    "change",
    [
        _set("hostNetwork", True),
        _set("securityContext.runAsNonRoot", False),
        _set("securityContext.seccompProfile", {"type": "Unconfined"}),
        _set("c.securityContext.allowPrivilegeEscalation", True),
        _set("c.securityContext.capabilities", {"drop": ["NET_RAW"]}),
        _set("c.securityContext.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        _set("c.securityContext.privileged", True),
        _set("c.securityContext.runAsUser", 0),
        _set("volumes", [{"name": "host", "hostPath": {"path": "/"}}]),
        _set("c.ports", [{"containerPort": 8000, "hostPort": 8000}]),
    ],
    ids=[
        "hostNetwork",
        "root",
        "unconfined",
        "escalation",
        "caps-kept",
        "caps-added",
        "privileged",
        "uid0",
        "hostPath",
        "hostPort",
    ],
)
def test_the_restricted_check_refuses_what_the_standard_forbids(
    change: Callable[[dict[str, Any]], None],
) -> None:
    pod = _compliant_pod()
    assert restricted_violations(pod) == []
    change(pod)
    assert restricted_violations(pod) != []
