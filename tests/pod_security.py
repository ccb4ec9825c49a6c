"""The Kubernetes Pod Security Standards' "restricted" level, applied offline to a pod spec.

Written from the standard's table (kubernetes.io/docs/concepts/security/pod-security-standards/,
"Baseline" then "Restricted"), rule by rule, as the PodSecurity admission controller
applies it to a namespace labelled ``pod-security.kubernetes.io/enforce=restricted``.
``restricted_violations`` returns one line per broken rule; none means the pod is admitted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Spec = dict[str, Any]

SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUME_SOURCES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral"}
RESTRICTED_VOLUME_SOURCES |= {"persistentVolumeClaim", "projected", "secret"}
CONFINED_SECCOMP = {"RuntimeDefault", "Localhost"}


def _containers(pod: Spec) -> Iterator[Spec]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(kind, [])


def _contexts(pod: Spec) -> Iterator[tuple[str, Spec]]:
    """The pod's security context, then every container's, each with a name for messages."""
    yield "pod", pod.get("securityContext", {})
    for container in _containers(pod):
        yield f"container {container['name']}", container.get("securityContext", {})


def _host_access(pod: Spec) -> list[str]:
    problems = [f"{field} is true" for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    problems += [
        f"container {c['name']} has hostPort {p['hostPort']}"
        for c in _containers(pod)
        for p in c.get("ports", [])
        if p.get("hostPort", 0)
    ]
    for where, context in _contexts(pod):
        if context.get("windowsOptions", {}).get("hostProcess"):
            problems.append(f"{where}: windowsOptions.hostProcess is true")
    return problems


def _privileges(pod: Spec) -> list[str]:
    problems = []
    for container in _containers(pod):
        context, name = container.get("securityContext", {}), container["name"]
        if context.get("privileged"):
            problems.append(f"container {name} is privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"container {name}: allowPrivilegeEscalation is not false")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"container {name}: procMount is {context['procMount']}")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"container {name}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"container {name}: adds capabilities {capabilities['add']}")
    return problems


def _confinement(pod: Spec) -> list[str]:
    """AppArmor, SELinux and sysctls: only the runtime's defaults or the safe set."""
    problems = []
    for where, context in _contexts(pod):
        if context.get("appArmorProfile", {}).get("type", "RuntimeDefault") not in CONFINED_SECCOMP:
            problems.append(f"{where}: AppArmor profile {context['appArmorProfile']['type']}")
        selinux = context.get("seLinuxOptions", {})
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            problems.append(f"{where}: seLinuxOptions {selinux}")
    for sysctl in pod.get("securityContext", {}).get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"pod: unsafe sysctl {sysctl['name']}")
    return problems


def _volumes(pod: Spec) -> list[str]:
    problems = []
    for volume in pod.get("volumes", []):
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            problems.append(f"volume {volume['name']} is of type {sorted(sources)}")
    return problems


def _pod_or_every_container(
    pod: Spec, rule: str, is_met: Callable[[Spec], bool], breaks: Callable[[Spec], bool]
) -> list[str]:
    """A rule met at pod level (no container overriding it) or by every container itself."""
    pod_context = pod.get("securityContext", {})
    containers = list(_containers(pod))
    overridden = [c["name"] for c in containers if breaks(c.get("securityContext", {}))]
    if overridden:
        return [f"containers {overridden}: {rule} is broken"]
    if is_met(pod_context) or all(is_met(c.get("securityContext", {})) for c in containers):
        return []
    return [f"{rule} is set neither for the pod nor for every container"]


def _identity_and_seccomp(pod: Spec) -> list[str]:
    problems = _pod_or_every_container(
        pod, "runAsNonRoot", lambda c: c.get("runAsNonRoot") is True, lambda c: c.get("runAsNonRoot") is False
    )
    problems += [
        f"{where}: runAsUser is 0" for where, context in _contexts(pod) if context.get("runAsUser") == 0
    ]
    problems += _pod_or_every_container(
        pod,
        "seccompProfile RuntimeDefault or Localhost",
        lambda c: c.get("seccompProfile", {}).get("type") in CONFINED_SECCOMP,
        lambda c: c.get("seccompProfile", {}).get("type") == "Unconfined",
    )
    return problems


def restricted_violations(pod: Spec) -> list[str]:
    """Every rule of the "restricted" level (the baseline's included) that ``pod`` breaks."""
    rules = (_host_access, _privileges, _confinement, _volumes, _identity_and_seccomp)
    return [problem for rule in rules for problem in rule(pod)]
