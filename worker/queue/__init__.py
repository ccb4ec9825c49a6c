"""Owns the worker's side of the queue: consuming jobs, job handlers, presence, reaping and backoff."""
