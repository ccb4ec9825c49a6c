"""Lets ``python -m cli`` run the ``tokenferry`` command (used by ``serve`` for its children)."""

from cli import main

main()
