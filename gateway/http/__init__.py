"""Owns the HTTP shell every route shares: the app, middleware, errors, dependencies and SSE framing."""
