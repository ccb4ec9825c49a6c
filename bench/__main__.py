"""Owns ``python -m bench``: hands over to ``bench.cli.main``."""

from __future__ import annotations

from bench.cli import main

if __name__ == "__main__":
    main()
