"""deploy/prometheus: the scrape interval keeps the queue-depth lease held by one gateway at a time."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.ops.queue_depth import QUEUE_DEPTH_LEASE_S

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "prometheus.yml"
UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def _seconds(duration: str) -> float:
    """A Prometheus duration such as ``15s`` or ``1m30s``."""
    parts = re.findall(r"(\d+)(ms|s|m|h)", duration)
    assert parts and "".join(number + unit for number, unit in parts) == duration, duration
    return sum(int(number) * UNITS_S[unit] for number, unit in parts)


def test_every_gateway_scrape_comes_well_within_the_queue_depth_lease() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    default = config["global"].get("scrape_interval", "1m")  # Prometheus' own default
    (gateway,) = [job for job in config["scrape_configs"] if job["job_name"] == "tokenferry-gateway"]
    # The holder renews at each scrape: a lease shorter than the interval would let a
    # second gateway export beside it, and sums across gateways would count twice.
    assert _seconds(gateway.get("scrape_interval", default)) * 2 <= QUEUE_DEPTH_LEASE_S
