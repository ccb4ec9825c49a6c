"""Owns nothing but the package: tokenferry's benchmark suite, run as ``python -m bench`` or ``make bench``.

Modules, one owner each: ``options`` (flags), ``prompts`` (the workload),
``stats`` (percentiles), ``servers`` (Redis, worker and gateway processes),
``load`` (the streaming HTTP client), ``references`` (in-process transformers
baselines), ``report`` (JSON lines, table, ratios) and ``cli`` (the run order).
"""
