"""hermes.yaml's `routing:` section: its keys and the check of it, pure and light, so that loading the
config (every CLI command does) never imports the provider layer and its HTTP clients."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

STRATEGIES = ("tiers", "cascade")
ROUTING_KEYS = ("strategy", "cheap", "premium", "min_confidence", "verify")
TIER_NAMES = ("cheap", "standard", "premium")


def routing_error(spec: Any) -> str | None:
    """What is wrong with hermes.yaml's `routing` mapping, or None (pure)."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        return "'routing' must be a mapping (strategy, cheap, premium, min_confidence)"
    for key in spec:
        if key != "__line__" and key not in ROUTING_KEYS:
            return f"unknown key 'routing.{key}'; expected one of {', '.join(ROUTING_KEYS)}"
    if spec.get("strategy", "tiers") not in STRATEGIES:
        return f"routing strategy {spec.get('strategy')!r} is unknown; strategies are {', '.join(STRATEGIES)}"
    for key in ("cheap", "premium"):
        if key in spec and spec[key] not in TIER_NAMES:
            return f"'routing.{key}' must be a tier ({', '.join(TIER_NAMES)}), got {spec[key]!r}"
    level = spec.get("min_confidence", 0.7)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not math.isfinite(level) \
            or not 0 <= level <= 1:
        return f"'routing.min_confidence' must be a number from 0 to 1, got {level!r}"
    if not isinstance(spec.get("verify", False), bool):
        return f"'routing.verify' must be true or false, got {spec.get('verify')!r}"
    return None
