"""Owns nginx for the local cluster: find the binary, write its config, build its command line.

nginx runs unprivileged in the foreground (``daemon off``) with every path it
writes (pid, temp bodies, logs) inside the cluster's run directory. The proxy
lines themselves are ``deploy/nginx/proxy_sse.conf``, included verbatim, so the
loopback cluster tests the same SSE settings as the compose nginx.

The binary: ``--nginx PATH``, else the one ``make setup`` unpacked into the venv
(``deploy/install-nginx.sh``: Debian's package, no root needed), else ``nginx`` on PATH.
"""

from __future__ import annotations

import getpass
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

PROXY_SSE_CONF = Path(__file__).resolve().parent.parent / "nginx" / "proxy_sse.conf"
VENV_NGINX = Path(sys.prefix) / "opt" / "nginx" / "usr" / "sbin" / "nginx"
# Where nginx spools request bodies over its 16 KiB buffer (responses too, were buffering on).
_TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


class NginxNotFound(RuntimeError):
    """No nginx binary anywhere we look."""


def find_nginx(explicit: Path | None = None) -> Path:
    if explicit is not None:
        if not explicit.is_file():
            raise NginxNotFound(f"--nginx {explicit}: no such file")
        return explicit
    if VENV_NGINX.is_file():
        return VENV_NGINX
    for candidate in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise NginxNotFound("no nginx binary: run `make setup` (it unpacks Debian's nginx into .venv/opt/nginx)")


def write_config(listen: str, upstreams: Sequence[str], run_dir: Path) -> Path:
    """Write nginx.conf into ``run_dir`` and create the temp directories it names."""
    for kind in _TEMP_KINDS:
        (run_dir / "temp" / kind).mkdir(parents=True, exist_ok=True)
    config = run_dir / "nginx.conf"
    config.write_text(render_config(listen, upstreams, run_dir))
    return config


def render_config(listen: str, upstreams: Sequence[str], run_dir: Path) -> str:
    """An nginx.conf proxying ``listen`` to the gateways at ``upstreams`` (host:port each)."""
    servers = "\n".join(f"        server {address} max_fails=3 fail_timeout=5s;" for address in upstreams)
    temp = "\n".join(f"    {kind}_temp_path {run_dir / 'temp' / kind};" for kind in _TEMP_KINDS)
    # As root, nginx would switch its workers to "nobody", who cannot write the run directory.
    user = f"user {getpass.getuser()};\n" if os.geteuid() == 0 else ""
    return f"""# Written by deploy/cluster for one run; see deploy/nginx/nginx.conf for the compose twin.
{user}daemon off;
worker_processes 1;
pid {run_dir / "nginx.pid"};
error_log stderr warn;

events {{
    worker_connections 1024;
}}

http {{
    access_log {run_dir / "nginx-access.log"};
{temp}
    client_max_body_size 8m;

    upstream tokenferry_gateways {{
{servers}
        keepalive 32;
    }}

    server {{
        listen {listen};

        location / {{
            include {PROXY_SSE_CONF};
        }}
    }}
}}
"""


def command(binary: Path, run_dir: Path, config: Path) -> list[str]:
    """nginx's argv; ``-e stderr`` catches errors from before the config is read."""
    return [str(binary), "-p", str(run_dir), "-c", str(config), "-e", "stderr"]
