"""Owns background work any gateway may drive: the runner, its leases and the stores it serves."""
