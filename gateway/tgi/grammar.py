"""Owns TGI's ``grammar`` parameter as a structured-output constraint (``shared/protocol.py``).

TGI's router (``GrammarType`` in ``router/src/lib.rs``) takes ``{"type": "json",
"value": <JSON schema>}`` (``json_object`` is an alias of ``json``; TGI also
parses a schema sent as JSON text), ``{"type": "regex", "value": <pattern>}`` and
``{"type": "json_schema", "value": {"name": ..., "schema": <JSON schema>}}``.
Each becomes the same constraint an OpenAI request would (``JsonConstraint``,
``RegexConstraint``), named ``grammar`` in errors, and is compiled here
(``grammars.check``) so one that cannot be enforced is TGI's 422 before anything is queued.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.tgi.schema import Grammar
from shared.errors import InvalidRequest
from shared.protocol import Constraint, JsonConstraint, RegexConstraint
from shared.structured import grammars

PARAM = "grammar"


def grammar_constraint(grammar: Grammar | None) -> Constraint | None:
    """The constraint ``grammar`` asks for (None: free text); ``InvalidRequest`` if it cannot be enforced."""
    if grammar is None:
        return None
    constraint: Constraint
    if grammar.type == "regex":
        if not isinstance(grammar.value, str):
            raise InvalidRequest("grammar: a regex grammar's value must be a string.", param=PARAM)
        constraint = RegexConstraint(pattern=grammar.value, param=PARAM)
    else:
        constraint = JsonConstraint(json_schema=_schema(grammar), param=PARAM)
    grammars.check(constraint)
    return constraint


def _schema(grammar: Grammar) -> dict[str, Any]:
    value = grammar.value
    if grammar.type == "json_schema":
        value = value.get("schema") if isinstance(value, dict) else None
        if value is None:
            raise InvalidRequest("grammar: a json_schema grammar's value needs a 'schema'.", param=PARAM)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as error:
            raise InvalidRequest(
                f"grammar: the JSON schema is not valid JSON: {error}", param=PARAM
            ) from error
    if not isinstance(value, dict):
        raise InvalidRequest("grammar: a json grammar's value must be a JSON schema object.", param=PARAM)
    return value
