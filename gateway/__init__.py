"""tokenferry gateway: the stateless OpenAI-compatible HTTP front; no torch, no model."""
