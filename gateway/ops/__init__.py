"""Owns the operational surface: health, readiness, version and Prometheus metrics."""
