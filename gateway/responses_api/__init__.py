"""Owns OpenAI's Responses API: its schema, translation, stored background responses and routes."""
