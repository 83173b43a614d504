"""Stopping and starting agents by hand (pure): which agents a name means, and which held agents a
supervisor keeps stopped after reading its previous state."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .spec import agent_names


def agent_groups(config: dict[str, Any]) -> dict[str, list[str]]:
    """For each agent entry with a count above one, its name and the names of its instances
    (`worker` with count 2: worker-1, worker-2)."""
    groups = {}
    for entry in config.get("agents") or []:
        names = agent_names(entry)
        if len(names) > 1:
            groups[str(entry["name"])] = names
    return groups


def targets(name: object, present: Collection[str], groups: dict[str, list[str]]) -> list[str] | None:
    """The agents `name` means: itself, or every instance of an agent with a count (an instance's
    own name is preferred when both exist); None if it means none."""
    if not isinstance(name, str):
        return None
    if name in present:
        return [name]
    members = [member for member in groups.get(name, ()) if member in present]
    return members or None


def held_from(previous: dict[str, Any], known: Collection[str]) -> set[str]:
    """The agents a person stopped, from a previous supervisor.json, that the team still has: an
    agent removed from hermes.yaml is forgotten, so one added later under its name starts."""
    held = previous.get("held")
    if not isinstance(held, list):
        return set()
    return {name for name in held if isinstance(name, str) and name in known}
