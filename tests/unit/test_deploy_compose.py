"""docker-compose.yml, checked offline (no Docker engine here): the compose-spec schema, then the topology.

The schema is vendored in deploy/schemas/ (see its README for the source). The
compose nginx config is also checked by the real nginx binary ``make setup``
unpacks, with the service names pointed at loopback.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy.cluster.nginx import find_nginx
from shared.settings import GatewaySettings, WorkerSettings
from tests.deployment import DEPLOY, SCHEMAS, compose, compose_services, nginx_directives

NGINX_CONF = DEPLOY / "nginx" / "nginx.conf"
PROXY_CONF = DEPLOY / "nginx" / "proxy_sse.conf"


def _seconds(duration: str) -> float:
    """A compose duration such as ``45s`` or ``1m30s``."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts is not None and duration, duration
    return sum(int(value) * units[unit] for value, unit in zip(parts.groups(), "hms", strict=True) if value)


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's volumes as target -> source."""
    return {target: source for source, target, *_ in (v.split(":") for v in service.get("volumes", []))}


def test_compose_file_matches_the_compose_spec_schema() -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(error.absolute_path)}: {error.message}" for error in validator.iter_errors(compose())]
    assert errors == []


def test_redis_keeps_an_append_only_file_on_a_named_volume() -> None:
    redis = compose()["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    data_dir = command[command.index("--dir") + 1]
    assert _mounts(redis)[data_dir] in compose()["volumes"]
    assert "redis-cli" in redis["healthcheck"]["test"]


def test_two_gateways_behind_nginx_proxy_sse_unbuffered() -> None:
    gateways = compose_services("gateway-")
    assert len(gateways) == 2
    for spec in gateways.values():
        assert spec["build"]["dockerfile"] == "deploy/Dockerfile.gateway"
    upstreams = nginx_directives(NGINX_CONF.read_text(), "server")
    ports = {spec["environment"]["TOKENFERRY_PORT"] for spec in gateways.values()}
    expected = {f"{name}:{port}" for name in gateways for port in ports}
    assert {entry.split()[0] for entry in upstreams} == expected
    proxy = PROXY_CONF.read_text()
    assert nginx_directives(proxy, "proxy_buffering") == ["off"]
    assert nginx_directives(proxy, "proxy_http_version") == ["1.1"]
    # A stream may legitimately run as long as the gateway's request deadline.
    read_timeout = float(nginx_directives(proxy, "proxy_read_timeout")[0].rstrip("s"))
    assert read_timeout >= GatewaySettings.model_fields["request_timeout_s"].default
    nginx = compose()["services"]["nginx"]
    include = nginx_directives(NGINX_CONF.read_text(), "include")
    assert _mounts(nginx)[include[0]].removesuffix(":ro") == "./nginx/proxy_sse.conf"
    assert set(nginx["depends_on"]) == set(gateways)


def test_two_gpu_workers_share_the_model_cache_volume() -> None:
    workers = compose_services("worker-")
    assert len(workers) == 2
    for spec in workers.values():
        assert spec["build"]["dockerfile"] == "deploy/Dockerfile.worker"
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert _mounts(spec)["/home/tokenferry/.cache"] == "model-cache"


@pytest.mark.parametrize(("prefix", "settings"), [("gateway-", GatewaySettings), ("worker-", WorkerSettings)])
def test_stop_grace_periods_outlast_the_drain(
    prefix: str, settings: type[GatewaySettings] | type[WorkerSettings]
) -> None:
    drain = settings.model_fields["drain_grace_s"].default
    for name, spec in compose_services(prefix).items():
        drain = float(spec["environment"].get("TOKENFERRY_DRAIN_GRACE_S", drain))
        # Docker's SIGKILL must not cut a drain short: hand-over and exit need a margin.
        assert _seconds(spec["stop_grace_period"]) >= drain + 10, name


def test_prometheus_scrapes_ports_the_services_serve_metrics_on() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    services = compose()["services"]
    prometheus = services["prometheus"]
    assert _mounts(prometheus)["/etc/prometheus/prometheus.yml"].removesuffix(":ro") == (
        "./prometheus/prometheus.yml"
    )
    scraped = set()
    for job in config["scrape_configs"]:
        for target in (t for group in job["static_configs"] for t in group["targets"]):
            host, port = target.split(":")
            environment = services[host]["environment"]
            served_on = environment.get("TOKENFERRY_METRICS_PORT", environment.get("TOKENFERRY_PORT"))
            assert port == str(served_on), target
            scraped.add(host)
    assert scraped == set(compose_services("gateway-")) | set(compose_services("worker-"))


def test_compose_nginx_config_is_accepted_by_nginx(tmp_path: Path) -> None:
    """``nginx -t`` on the compose config, with service names and container paths pointed here."""
    text = NGINX_CONF.read_text()
    text = re.sub(r"gateway-\d+:8000", "127.0.0.1:8000", text)
    text = text.replace("/etc/nginx/tokenferry/proxy_sse.conf", str(PROXY_CONF))
    text = text.replace("pid /tmp/nginx.pid;", f"pid {tmp_path}/nginx.pid;")
    temp_paths = "".join(
        f"\n    {kind}_temp_path {tmp_path}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = text.replace("http {", "http {" + temp_paths, 1)
    config = tmp_path / "nginx.conf"
    config.write_text(text)
    result = subprocess.run(
        [str(find_nginx()), "-t", "-p", str(tmp_path), "-c", str(config), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("service", ["gateway-1", "worker-1"])
def test_tokenferry_services_build_from_the_repository_root(service: str) -> None:
    build = compose()["services"][service]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve().is_file()


def _interpolated(value: str) -> set[str]:
    """The variables a compose string takes from the environment or deploy/.env."""
    return set(re.findall(r"\$\{(\w+)(?::?[-?][^}]*)?\}", value))


def test_redis_requires_a_password_and_every_client_sends_it() -> None:
    services = compose()["services"]
    command = services["redis"]["command"]
    (password,) = _interpolated(command[command.index("--requirepass") + 1])
    # The health check's redis-cli authenticates with the same password.
    assert _interpolated(services["redis"]["environment"]["REDISCLI_AUTH"]) == {password}
    for name in [*compose_services("gateway-"), *compose_services("worker-")]:
        url = services[name]["environment"]["TOKENFERRY_REDIS_URL"]
        secret, host = url.removeprefix("redis://:").split("@", 1)
        assert _interpolated(secret) == {password}, name
        assert host.startswith("redis:6379/"), name
    # Required, with a message naming where to set it: no silent empty password.
    assert re.search(rf"\$\{{{password}:\?[^}}]*deploy/\.env", command[command.index("--requirepass") + 1])
    assert re.findall(rf"^{password}=", (DEPLOY / ".env.example").read_text(), re.M) == [f"{password}="]


def test_workers_are_healthy_once_ready_on_their_http_port() -> None:
    for name, spec in compose_services("worker-").items():
        check = " ".join(spec["healthcheck"]["test"])
        port = spec["environment"]["TOKENFERRY_METRICS_PORT"]
        assert f"http://127.0.0.1:{port}/ready" in check, name
        # The start period covers a model download; a success ends it at once.
        assert _seconds(spec["healthcheck"]["start_period"]) >= 30 * 60, name
