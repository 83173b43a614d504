"""API keys from the workspace's `.env` file, so a key added while the team runs reaches it.

A variable set in the agent's own environment wins; the file only fills in the variables the
providers name (`api_key_env`, and the ones `auto` looks for), nothing else (not PATH, say). The
agent reads the file again whenever it looks for a provider and the file changed. Every value
of those variables, from either place, is handed to kanban.redact, so no file or log this process
writes holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from ..kanban.redact import remember
from .routing import KEYED, provider_configs

ENV_FILE = ".env"
AUTO_KEYS = tuple(variable for variable, *_ in KEYED)  # what `auto` looks for, in its order
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_env(text: str) -> dict[str, str]:
    """KEY=value lines as dotenv writes them: comments, `export`, single or double quotes (pure)."""
    values = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        name, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[name] = value
    return values


def key_names(config: Mapping[str, Any]) -> set[str]:
    """The variables a team's keys may come from: those `auto` looks for and those its providers name."""
    return set(AUTO_KEYS) | {c.api_key_env for c in provider_configs(config).values() if c.api_key_env}


class KeyFile:
    def __init__(self, path: Path, names: Iterable[str], environ: MutableMapping[str, str] = os.environ) -> None:
        self.path = path
        self.names = set(names)
        self.environ = environ
        self.fixed = {name for name in self.names if environ.get(name)}  # set by whoever started us
        remember(environ[name] for name in self.fixed)
        self.mine: dict[str, str] = {}
        self._seen: tuple[int, int] | None = None

    def refresh(self) -> bool:
        """Bring the environment in line with the file; whether any key changed."""
        try:
            stat = self.path.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            values = parse_env(self.path.read_text(encoding="utf-8")) if stamp else {}
        except (OSError, UnicodeDecodeError):
            values = {}
        wanted = {k: v for k, v in values.items() if k in self.names and k not in self.fixed and v}
        remember(wanted.values())
        changed = False
        for name in set(self.mine) - set(wanted):
            self.environ.pop(name, None)
            del self.mine[name]
            changed = True
        for name, value in wanted.items():
            if self.mine.get(name) != value:
                self.environ[name] = self.mine[name] = value
                changed = True
        return changed
