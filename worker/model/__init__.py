"""Owns the model: its sources, loading its weights, converting the bundled one, CPU kernels, the backend."""
