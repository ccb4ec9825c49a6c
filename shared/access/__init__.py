"""Owns access records in Redis: API keys, resource ownership and rate-limit token buckets."""
