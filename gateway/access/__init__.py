"""Owns who may call and how much: API keys, rate limits, quota charges, resource ownership."""
