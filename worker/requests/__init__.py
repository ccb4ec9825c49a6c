"""Owns one request inside the worker: prompt preparation, parameters, stopping, output and choices."""
