"""Query JSON files and summarize CSV files of the agent's folder (read only)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from typing import Any

from hermes_sup.agents.files import read_text
from hermes_sup.agents.offer import FILE_CUE
from hermes_sup.agents.tools import Tool, ToolError, register


def query(data: Any, path: str) -> Any:
    """Follow a dotted path (`items.0.name`, `*` maps over a list) into JSON data (pure)."""
    if not path:
        return data
    head, _, rest = path.partition(".")
    if head == "*":
        if not isinstance(data, list):
            raise ToolError("'*' applies to a list")
        return [query(item, rest) for item in data]
    if isinstance(data, list):
        try:
            return query(data[int(head)], rest)
        except (ValueError, IndexError):
            raise ToolError(f"no index {head!r} in a list of {len(data)}") from None
    if isinstance(data, dict):
        if head not in data:
            raise ToolError(f"no key {head!r}; keys: {', '.join(map(str, list(data)[:20]))}")
        return query(data[head], rest)
    raise ToolError(f"cannot go into a {type(data).__name__} with {head!r}")


def json_query(ctx: Any, args: dict[str, Any]) -> str:
    try:
        data = json.loads(read_text(ctx, args["path"]))
    except ValueError as exc:
        raise ToolError(f"{args['path']} is not JSON: {exc}") from None
    return json.dumps(query(data, args.get("query") or ""), ensure_ascii=False, indent=1)[:20_000]


def csv_summary(ctx: Any, args: dict[str, Any]) -> str:
    rows = list(csv.DictReader(io.StringIO(read_text(ctx, args["path"]), newline="")))
    columns = list(rows[0]) if rows else []
    summary: dict[str, Any] = {"rows": len(rows), "columns": {}}
    for column in columns:
        values = [row[column] for row in rows if row.get(column) not in (None, "")]
        try:
            numbers = [float(v) for v in values]
        except ValueError:
            numbers = []
        if numbers:
            summary["columns"][column] = {"numeric": True, "count": len(numbers), "min": min(numbers),
                                          "max": max(numbers), "mean": round(statistics.fmean(numbers), 6),
                                          "sum": round(sum(numbers), 6)}
        else:
            distinct = sorted(set(values))
            summary["columns"][column] = {"numeric": False, "count": len(values), "distinct": len(distinct),
                                          "examples": distinct[:5]}
    return json.dumps(summary, ensure_ascii=False)


register(Tool("json_query", "Read a JSON file of your folder and return the part a dotted query selects "
              "(e.g. items.0.name, items.*.price).", json_query, {"type": "object", "properties": {
                  "path": {"type": "string", "minLength": 1}, "query": {"type": "string"}},
                  "required": ["path"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, cues=(FILE_CUE,)))  # not "json": JSON output is no file
register(Tool("csv_summary", "Summarize a CSV file of your folder: row count, and per column min/max/mean/sum or "
              "distinct values.", csv_summary, {"type": "object", "properties": {
                  "path": {"type": "string", "minLength": 1}}, "required": ["path"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, cues=(FILE_CUE, "csv")))
