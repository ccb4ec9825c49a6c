"""Owns the async side of the engine: feeding it jobs, stepping it and publishing what it yields."""
