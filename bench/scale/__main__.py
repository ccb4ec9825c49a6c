"""Lets ``python -m bench.scale`` run the scale benchmark."""

from bench.scale.cli import main

main()
