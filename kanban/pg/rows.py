"""A task document as the parameters of its row: the one place a document is adapted for psycopg (Jsonb),
so that kanban/pg/rules.py stays pure and importable without psycopg; and the one row of a statement
that always returns one."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..errors import BoardError
from .rules import TaskDoc, document_part


def row_params(doc: TaskDoc) -> dict[str, Any]:
    """A task document as the parameters of its row: the columns, and the rest in `document`."""
    return {"id": doc["id"], "status": doc["status"], "role": doc.get("role"), "assignee": doc.get("assignee"),
            "priority": doc.get("priority", 0), "has_steps": bool(doc.get("steps")),
            "has_deps": bool(doc.get("depends_on")), "attempts": doc.get("attempts", 0),
            "max_attempts": doc["max_attempts"], "claims": doc.get("claims", 0),
            "document": Jsonb(document_part(doc))}


def one(cur: psycopg.Cursor[Any]) -> dict[str, Any]:
    """The row of a statement that always returns one (now(), SHOW, an aggregate, a sequence's one
    row): fetchone() says None only where there is no row, which such a statement never gives."""
    row = cur.fetchone()
    if row is None:
        raise BoardError("the board database returned no row for a statement that always returns one")
    return row
