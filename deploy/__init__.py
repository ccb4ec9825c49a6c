"""Deployment files (Dockerfiles, compose, Kubernetes) and ``deploy.cluster``: that topology as processes.

Not part of the installed package: run from the repository root (``make cluster``).
"""
