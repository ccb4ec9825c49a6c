"""Owns ``python -m bench.peers``: hands over to ``bench.peers.runner.main``."""

from __future__ import annotations

from bench.peers.runner import main

if __name__ == "__main__":
    main()
