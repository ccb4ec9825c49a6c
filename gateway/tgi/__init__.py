"""Owns HuggingFace TGI's native routes: their schema, translation, SSE and errors."""
