"""Readers of the files under deploy/ for the deployment tests: compose, Kubernetes, Dockerfiles, nginx."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_BASE = DEPLOY / "k8s" / "base"
SCHEMAS = DEPLOY / "schemas"


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return loaded


def compose_services(prefix: str) -> dict[str, dict[str, Any]]:
    """The compose services whose names start with ``prefix`` (``gateway-``, ``worker-``)."""
    return {name: spec for name, spec in compose()["services"].items() if name.startswith(prefix)}


def k8s_manifests() -> dict[str, dict[str, Any]]:
    """Every resource of the kustomize base, by file name (one resource per file)."""
    manifests = {}
    for path in sorted(K8S_BASE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            manifests[path.name] = yaml.safe_load(path.read_text())
    return manifests


def k8s_resource(kind: str, name: str) -> dict[str, Any]:
    found = [m for m in k8s_manifests().values() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def k8s_container_env(workload: dict[str, Any]) -> dict[str, str]:
    """The environment a workload's single container gets: its ConfigMaps' data, then its own ``env``."""
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:  # a Secret's keys are the operator's, not in the repository
            env |= k8s_resource("ConfigMap", source["configMapRef"]["name"])["data"]
    for entry in container.get("env", []):
        # Values from the downward API are only known in the cluster; any name stands in.
        env[entry["name"]] = str(entry.get("value", "pod-name"))
    return env


def dockerfile_final_stage(name: str) -> str:
    """The last stage of ``deploy/<name>``, continuation lines joined."""
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    return text.split("\nFROM ")[-1]


def dockerfile_env(name: str) -> dict[str, str]:
    """What the final stage's ENV instructions set (``ENV A=1 B=2`` form)."""
    env: dict[str, str] = {}
    for line in dockerfile_final_stage(name).splitlines():
        if line.startswith("ENV "):
            env |= dict(re.findall(r"(\w+)=(\S+)", line))
    return env


def nginx_directives(text: str, name: str) -> list[str]:
    """The arguments of every ``name ...;`` directive in an nginx config, comments ignored."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return [match.strip() for match in re.findall(rf"(?m)^\s*{name}\s+([^;{{}}\n]*);", code)]
