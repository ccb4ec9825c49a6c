"""Owns a request's jobs from the gateway's side: submit, relay events, abort, fan out, resume."""
