"""A config field's declaration in one place: what it is for and its bounds, in the dataclass
field's metadata. The config checks itself by it (``check``: the same ``SpecError`` naming the
field) and the platform shows it (``json_schema``: the OpenAPI schema of a job's spec, the submit
form's fields, the CLI's spec files), so a bound written once holds on every surface.

    steps: int = declared(150, doc="RL steps of the run.", minimum=1)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from engine.errors import SpecError

_BOUNDS = ("minimum", "exclusive_minimum", "maximum", "exclusive_maximum")


def declared(default: Any = dataclasses.MISSING, *, doc: str, label: str | None = None,
             default_factory: Any = dataclasses.MISSING, choices: tuple[str, ...] | None = None,
             why: str | None = None, **bounds: float) -> Any:
    """A dataclass field with its documentation (``doc``; ``label``: its name on a form, else made
    from its own), its bounds (``minimum``, ``exclusive_minimum``, ``maximum``,
    ``exclusive_maximum``) or ``choices``, and ``why``: the message of a value out of bounds, when
    the bounds alone would not say it well."""
    unknown = sorted(set(bounds) - set(_BOUNDS))
    if unknown:
        raise TypeError(f"unknown bound {unknown[0]}")
    metadata = {"doc": doc, "label": label, "choices": choices, "why": why, **bounds}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _range_text(meta: dict[str, Any]) -> str:
    lo = ("(", meta["exclusive_minimum"]) if "exclusive_minimum" in meta else ("[", meta.get("minimum"))
    hi = (")", meta["exclusive_maximum"]) if "exclusive_maximum" in meta else ("]", meta.get("maximum"))
    if lo[1] is not None and hi[1] is not None:
        return f"must be in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo[1] is not None:
        return f"must be {'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    return f"must be {'<' if hi[0] == ')' else '<='} {hi[1]:g}"


def check(config: Any) -> None:
    """``config``'s declared fields within their bounds and choices; ``SpecError`` naming the first
    that is not (its ``why``, else the bounds). Types are the config's own check."""
    for f in dataclasses.fields(config):
        meta, value = f.metadata, getattr(config, f.name)
        if "choices" in meta and value not in meta["choices"]:
            raise SpecError(f.name, meta.get("why") or f"must be one of {', '.join(meta['choices'])}")
        if not any(b in meta for b in _BOUNDS) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        inside = (value >= meta.get("minimum", value) and value > meta.get("exclusive_minimum", value - 1)
                  and value <= meta.get("maximum", value) and value < meta.get("exclusive_maximum", value + 1))
        if not inside:
            raise SpecError(f.name, meta.get("why") or _range_text(meta))


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _type_schema(kind: Any) -> dict[str, Any]:
    args = typing.get_args(kind)
    if isinstance(kind, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return {**_type_schema(inner), "nullable": True}
    if dataclasses.is_dataclass(kind):
        return json_schema(kind)
    return {"type": _JSON_TYPES[kind]}


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.0's dialect) of config class ``cls``: each field typed, with its
    default, description, bounds or choices; nested configs inline; no other field allowed."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        prop = _type_schema(hints[f.name])
        if "doc" in meta:
            prop["description"] = meta["doc"]
        if f.default is not dataclasses.MISSING:
            prop["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING and not dataclasses.is_dataclass(hints[f.name]):
            prop["default"] = f.default_factory()
        if "choices" in meta:
            prop["enum"] = list(meta["choices"])
        for bound in _BOUNDS:
            if bound in meta:
                prop[{"exclusive_minimum": "minimum", "exclusive_maximum": "maximum"}.get(bound, bound)] = meta[bound]
                if bound.startswith("exclusive"):
                    prop[f"exclusive{bound.split('_')[1].capitalize()}"] = True
        prop["x-label"] = meta.get("label") or f.name.replace("_", " ").capitalize()
        properties[f.name] = prop
    return {"type": "object", "properties": properties, "additionalProperties": False}


def leaves(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every field of ``schema`` that holds a value, by its dotted path (``grpo.lr``)."""
    out: dict[str, dict[str, Any]] = {}
    for name, prop in schema["properties"].items():
        if prop.get("type") == "object":
            out |= leaves(prop, f"{prefix}{name}.")
        else:
            out[f"{prefix}{name}"] = prop
    return out
