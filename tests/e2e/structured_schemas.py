"""JSON schemas for the structured-output tests and bench: varied shapes, every one bounded.

Bounded (strings with maxLength, arrays with maxItems, numbers with bounds) so that any
output the grammar allows ends within a test's max_tokens: a small model left a free
string can fill it forever.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def _text(longest: int = 16) -> Schema:
    return {"type": "string", "maxLength": longest}


def _object(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def _hand_written() -> list[Schema]:
    return [
        _object({"name": _text(), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
        _object(
            {
                "city": _text(),
                "country": _text(),
                "population": {"type": "integer", "minimum": 0, "maximum": 10**8},
            }
        ),
        _object({"answer": {"type": "boolean"}}),
        _object({"color": {"enum": ["red", "green", "blue"]}}),
        _object({"score": {"type": "number", "minimum": 0, "maximum": 1}}),
        _object({"tags": {"type": "array", "items": _text(10), "minItems": 1, "maxItems": 3}}),
        _object(
            {
                "point": _object(
                    {
                        "x": {"type": "integer", "minimum": -100, "maximum": 100},
                        "y": {"type": "integer", "minimum": -100, "maximum": 100},
                    }
                )
            }
        ),
        _object({"title": _text(), "subtitle": _text()}, required=["title"]),
        _object({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
        _object({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, _text(8)]}}),
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": 99},
            "minItems": 2,
            "maxItems": 4,
        },
        _object(
            {
                "user": _object(
                    {
                        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                        "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "maxItems": 3},
                    }
                )
            }
        ),
        _object({"status": {"const": "ok"}, "count": {"type": "integer", "minimum": 0, "maximum": 50}}),
        _object(
            {
                "items": {
                    "type": "array",
                    "items": _object(
                        {
                            "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{3}$"},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        }
                    ),
                    "minItems": 1,
                    "maxItems": 2,
                }
            }
        ),
        _object(
            {"temperature": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"enum": ["C", "F"]}}
        ),
        _object({"ok": {"type": "boolean"}, "reason": _text(20)}, required=["ok"]),
        _object({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}),
        _object(
            {
                "matrix": {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                        "minItems": 2,
                        "maxItems": 2,
                    },
                    "minItems": 2,
                    "maxItems": 2,
                }
            }
        ),
        _object(
            {
                "shape": {
                    "anyOf": [
                        _object(
                            {
                                "kind": {"const": "circle"},
                                "r": {"type": "integer", "minimum": 1, "maximum": 10},
                            }
                        ),
                        _object(
                            {
                                "kind": {"const": "square"},
                                "side": {"type": "integer", "minimum": 1, "maximum": 10},
                            }
                        ),
                    ]
                }
            }
        ),
        _object(
            {
                "first": _text(12),
                "last": _text(12),
                "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
            }
        ),
        _object({"priority": {"type": "integer", "enum": [1, 2, 3]}}),
        _object({"flags": _object({"a": {"type": "boolean"}, "b": {"type": "boolean"}}, required=[])}),
        _object({"nullable": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": 5}]}}),
        _object(
            {
                "words": {
                    "type": "array",
                    "items": {"enum": ["alpha", "beta", "gamma"]},
                    "minItems": 3,
                    "maxItems": 3,
                }
            }
        ),
        _object(
            {
                "meta": _object(
                    {
                        "version": {"type": "string", "pattern": "^[0-9]\\.[0-9]$"},
                        "stable": {"type": "boolean"},
                    }
                )
            }
        ),
    ]


def _generated() -> list[Schema]:
    """Variations on a few shapes: different enums, bounds, counts and nesting depths."""
    schemas: list[Schema] = []
    for low, high in [(0, 10), (10, 99), (-5, 5), (100, 999), (1, 3)]:
        schemas.append(
            _object({"n": {"type": "integer", "minimum": low, "maximum": high}, "label": _text(8)})
        )
    for options in [
        ["yes", "no"],
        ["cat", "dog", "bird"],
        ["north", "south", "east", "west"],
        ["a", "b"],
        ["low", "mid", "high"],
    ]:
        schemas.append(
            _object(
                {"choice": {"enum": options}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}
            )
        )
    for count in range(1, 6):
        schemas.append(
            _object(
                {
                    "list": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": 0, "maximum": 9},
                        "minItems": count,
                        "maxItems": count,
                    }
                }
            )
        )
    for depth in range(1, 6):
        inner: Schema = _object({"leaf": {"type": "boolean"}})
        for level in range(depth):
            inner = _object({f"level{level}": inner})
        schemas.append(inner)
    for longest in [4, 8, 12, 16, 24]:
        schemas.append(
            _object(
                {"text": {"type": "string", "minLength": 1, "maxLength": longest}, "optional": _text(4)},
                required=["text"],
            )
        )
    return schemas


SCHEMAS: list[Schema] = _hand_written() + _generated()
