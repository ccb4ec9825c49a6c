"""Owns one request inside the worker: preparation, chat input, parameters, stopping, output, parsing."""
