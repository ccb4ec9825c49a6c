"""Owns structured outputs' shared half: constraints and tool choices as grammars, and their checks."""
