"""Owns the model: where it comes from, loading its weights, converting the bundled one, CPU kernels."""
