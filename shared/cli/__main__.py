"""Lets ``python -m shared.cli`` run the ``tokenferry`` command (used by ``serve`` for its children)."""

from shared.cli import main

main()
