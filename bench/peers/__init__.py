"""Owns ``make bench-peers``: tokenferry against vLLM's CPU server, one at a time, same model and prompts."""
