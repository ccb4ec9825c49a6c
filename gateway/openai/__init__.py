"""Owns OpenAI's chat, completions and models routes: their schema, translation to jobs and rendering."""
