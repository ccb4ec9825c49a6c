"""tokenferry: what the gateway and the worker both import (protocol, keys, settings)."""

__version__ = "0.1.0"
