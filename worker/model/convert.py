"""Owns ``python -m worker.model.convert``: converts the bundled model once so the first serve starts fast.

Run by ``make setup``; idempotent (a converted copy in the cache is reused).
"""

from __future__ import annotations

import logging

from shared.settings import WorkerSettings
from worker.model.loading import converted_gguf_dir
from worker.model.sources import resolve_source


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = WorkerSettings()
    source = resolve_source(settings.model)
    if source.gguf_file:
        print(f"bundled model ready at {converted_gguf_dir(source, settings.cache_dir)}")


if __name__ == "__main__":
    main()
