"""The page's picture as pure functions: which cards each column ships and in what order, and the one
serialization of it that every stream client is sent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...kanban.why import Team
from .. import team
from ..views import render

# Cards each column ships: a board of thousands of tasks is a picture of at most 600 cards, each
# with why it waits, whatever the board holds; the column's count stays whole.
COLUMN_LIMIT = 100
FINISHED = ("done", "failed", "cancelled")


def page_order(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A board listing's tasks in the order the page shows them: todo, doing and blocked in claim
    order (the next to move first, as the listing has them), the finished columns newest first (by
    updated_at), so that a task just finished is on the page however many its column holds."""
    active = [doc for doc in tasks if doc["status"] not in FINISHED]
    finished = [doc for doc in tasks if doc["status"] in FINISHED]
    finished.sort(key=lambda doc: str(doc.get("updated_at") or ""), reverse=True)  # stable: ties keep claim order
    return active + finished


def board_columns(tasks: list[dict[str, Any]], damaged: list[dict[str, str]], members: Team | None,
                  limit: int = COLUMN_LIMIT) -> dict[str, Any]:
    """The board as the page shows it: `board --json`'s document of the listing (`tasks`, each as
    the board's listing fields) in page order, each column cut to its first `limit` cards with its
    count whole, why each shipped card waits, and each card's creation time, holder's host and
    lease end (the page shows its age and counts the lease down)."""
    ordered = page_order(tasks)
    shown = render.top_of_columns(ordered, limit)
    statuses = {doc["id"]: doc["status"] for doc in tasks}  # a shipped card may wait for one not shipped
    document = render.board_document(ordered, damaged, None, team.reasons(shown, members, statuses), limit=limit)
    docs = {doc["id"]: doc for doc in shown}
    for items in document["columns"].values():
        for item in items:
            doc = docs[item["id"]]
            item["created_at"] = doc.get("created_at")
            claim = doc.get("claim") or {}
            item["host"] = claim.get("host")
            item["lease_until_ts"] = claim.get("lease_until_ts")
    document["limit"] = limit
    return document


def shipped_costs(costs: Mapping[str, Any], document: Mapping[str, Any]) -> dict[str, Any]:
    """The cost of each card `document` ships, of the costs of every task `usage` counted."""
    return {item["id"]: costs[item["id"]] for items in document["columns"].values()
            for item in items if item["id"] in costs}


def serialize(picture: Mapping[str, Any]) -> bytes:
    """The picture as the one JSON text every client is sent: without indent it has no raw newline,
    so it is one `data:` line of a server-sent event as it is."""
    return json.dumps(picture, separators=(",", ":"), default=str).encode()
