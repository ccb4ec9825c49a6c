"""Owns ``make cluster``: the production topology as local processes on loopback.

Redis (append-only file on), nginx in front of N gateways (SSE proxying with the
exact proxy lines of the compose nginx, ``deploy/nginx/proxy_sse.conf``) and M
workers, each the same ``tokenferry`` process production runs. ``python -m
deploy.cluster --help`` lists the knobs; ``--engine fake`` runs workers without a
model (tests, load tests of everything around the model).
"""
