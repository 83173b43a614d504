"""What hermes.yaml's schema (schema.py) is shown as: a JSON Schema for editors, and the Markdown reference page."""

from __future__ import annotations

import json
from typing import Any

from .schema import TOP, Field

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = "hermes.schema.json"
# The first line of hermes.yaml that points YAML-aware editors (yaml-language-server) at the schema beside it.
MODELINE = f"# yaml-language-server: $schema=./{SCHEMA_FILE}"
REQUIRED = {"hermes.yaml": ["agents"], "agent": ["name"], "schedule": ["name", "cron", "task"],
            "alert": ["webhook_env", "secret_env", "on"], "folder": ["path"]}
# Keys of which an entry holds exactly one.
ONE_OF = {"MCP server": ["command", "url"]}


def json_schema() -> dict[str, Any]:
    """hermes.yaml's JSON Schema (draft 2020-12), made from the schema."""
    return {"$schema": DIALECT, "title": "hermes.yaml", **_node(TOP), "type": "object"}


def json_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


def _node(field: Field) -> dict[str, Any]:
    node: dict[str, Any] = {"description": field.doc}
    node.update(_shape(field))
    if field.default is not None:
        node["default"] = field.default
    if field.name in REQUIRED:
        node["required"] = REQUIRED[field.name]
    if field.name in ONE_OF:
        node["oneOf"] = [{"required": [key]} for key in ONE_OF[field.name]]
    # null stands for "absent" wherever the checks read a section or setting with `or {}` or allow it
    # outright, so an editor must not mark an empty `defaults:` as wrong.
    if field.null or field.kind in ("mapping", "list"):
        if "type" in node:
            node["type"] = [node["type"], "null"]
        elif "enum" in node:
            node["enum"] = [*node["enum"], None]
    return node


def _shape(field: Field) -> dict[str, Any]:
    """The JSON Schema keywords of a field's kind, bounds and choices (the description aside)."""
    kind = field.kind
    if kind in ("seconds", "number"):
        low = {"minimum": field.low or 0} if field.zero else {"exclusiveMinimum": field.low or 0}
        return {"type": "number", **low, **({"maximum": field.high} if field.high is not None else {})}
    if kind == "whole":
        return {"type": "integer", **{key: value for key, value in (("minimum", field.low), ("maximum", field.high))
                                      if value is not None}}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "text":
        return {"type": "string", **({"pattern": f"^(?:{field.pattern})$"} if field.pattern else {})}
    if kind == "scalar":
        return {"type": ["string", "number", "boolean"]}
    if kind == "choice":
        return {"enum": list(field.choices)}
    if kind == "names":
        items: dict[str, Any] = {"enum": list(field.choices)} if field.choices else {"type": "string", "minLength": 1}
        return {"type": "array", "items": items, **({"minItems": int(field.low)} if field.low else {})}
    if kind == "mapping":
        shape: dict[str, Any] = {"type": "object"}
        if field.fields:
            shape["properties"] = {sub.name: _node(sub) for sub in field.fields}
            shape["additionalProperties"] = False
        elif field.item is not None:
            shape["additionalProperties"] = _node(field.item)
        return shape
    if kind == "list":
        return {"type": "array", **({"items": _node(field.item)} if field.item is not None else {})}
    return {}


# -- the reference page ------------------------------------------------------------------------------

INTRO = """# Every key of hermes.yaml

This page is generated from hermes.yaml's schema (`supervisor/config/schema.py`) each time the
documentation is built, the same schema `up` checks hermes.yaml against and `hermes-sup schema` prints
as a JSON Schema for editors. What the sections are for, with examples, is in [hermes.yaml](hermes-yaml.md).

"""


def kind_text(field: Field) -> str:
    """A field's type and bounds in a few words, for the page."""
    kind = field.kind
    if kind == "seconds":
        text = f"seconds, {'>= 0' if field.zero else '> 0'}, at most {field.high:,.0f}"
    elif kind == "number":
        text = f"number {'>= 0' if field.zero else '> 0'}" + (f", at most {field.high:g}" if field.high else "")
    elif kind == "whole":
        text = f"whole number, {field.low:,.0f} to {field.high:,.0f}"
    elif kind == "choice":
        text = " \\| ".join(f"`{choice}`" for choice in field.choices)
    elif kind == "names":
        text = "list of " + (", ".join(f"`{choice}`" for choice in field.choices) if field.choices else "names")
    elif kind == "mapping":
        text = "mapping"
    else:
        text = {"bool": "true or false", "text": "text", "list": "list", "scalar": "text or a number"}.get(
            kind, "see its section")
    return f"{text}, or null" if field.null else text


def _table(field: Field, path: str) -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for sub in field.fields:
        default = "" if sub.default is None else f"`{json.dumps(sub.default)}`"
        lines.append(f"| `{sub.name}` | {kind_text(sub)} | {default} | {sub.doc.replace('|', '&#124;')} |")
    return [*lines, ""]


def _sections(field: Field, path: str, depth: int) -> list[str]:
    """The page's sections: one per mapping or list of mappings with keys of its own, nested ones after."""
    lines: list[str] = []
    shown = field.item if field.item is not None and field.item.fields else field
    if shown.fields:
        lines += [f"{'#' * min(depth, 4)} `{path}`", "", field.doc, ""]
        if shown is not field:
            lines += [shown.doc, ""]
        lines += _table(shown, path)
        for sub in shown.fields:
            if sub.kind in ("mapping", "list"):
                each = "[]" if sub.kind == "list" else ".NAME" if sub.item is not None else ""
                lines += _sections(sub, f"{path}.{sub.name}{each}" if path else f"{sub.name}{each}", depth + 1)
    return lines


def markdown() -> str:
    """The reference page of every key, as Markdown."""
    lines = [INTRO, "## The top level", "", *_table(TOP, "")]
    for sub in TOP.fields:
        each = "[]" if sub.kind == "list" else ".NAME" if sub.item is not None else ""
        lines += _sections(sub, f"{sub.name}{each}", 2)
    return "\n".join(lines).rstrip() + "\n"
