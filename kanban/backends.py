"""The one way to open a board: hermes.yaml's `board:` section names a backend, registered here by name.

A backend is one `register(name, opener)` call; a backend that ships separately (PostgreSQL, in
`hermes_sup.kanban.pg`) is named in PLUGINS, imported on first use, and registers itself on import.
`check_board_config` is the pure check of the section, shared with hermes.yaml's validation.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import BoardError
from .store import BoardStore

# opener(board folder, checked board section, *, lock_timeout=seconds, host=name or None) -> an open board
Opener = Callable[..., BoardStore]

DEFAULT_BACKEND = "files"
# Backends that live in a module of their own; importing it registers the backend.
PLUGINS = {"postgres": "hermes_sup.kanban.pg"}
SECTION_KEYS: dict[str, tuple[str, ...]] = {"files": ("backend",),
                                           "postgres": ("backend", "dsn_env", "host_timeout")}
# A dead host's tasks become claimable elsewhere after this many seconds (CONTRACT.md section 9).
DEFAULT_HOST_TIMEOUT = 30.0
MAX_HOST_TIMEOUT = 86_400.0
DEFAULT_DSN_ENV = "HERMES_SUP_PG_DSN"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_REGISTRY: dict[str, Opener] = {}


class BoardConfigError(BoardError):
    """hermes.yaml's `board:` section (or `host:`) names something this installation cannot open."""


def register(name: str, opener: Opener) -> None:
    """Make backend `name` openable; registering a name again replaces it (a reloaded plugin)."""
    _REGISTRY[name] = opener


def backend_names() -> tuple[str, ...]:
    return tuple(dict.fromkeys((*_REGISTRY, *PLUGINS)))


def check_board_config(section: object) -> dict[str, Any]:
    """The `board:` section checked and with its defaults (pure); BoardConfigError says what is wrong.
    The DSN itself never appears here: only the name of the variable that holds it."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise BoardConfigError("'board' must be a mapping (backend: files, or backend: postgres with dsn_env)")
    fields = {key: value for key, value in section.items() if key != "__line__"}
    backend = fields.get("backend", DEFAULT_BACKEND)
    known = backend_names()
    if not isinstance(backend, str) or backend not in known:
        raise BoardConfigError(f"board.backend {str(backend)[:40]!r} is not a board backend; expected one of "
                               f"{', '.join(known)}")
    allowed = SECTION_KEYS.get(backend, ("backend",))
    for key in fields:
        if key not in allowed:
            raise BoardConfigError(f"unknown key 'board.{str(key)[:40]}' for backend {backend}; expected "
                                   f"{', '.join(allowed)}")
    checked: dict[str, Any] = {"backend": backend}
    if "dsn_env" in allowed:
        dsn_env = fields.get("dsn_env", DEFAULT_DSN_ENV)
        if not isinstance(dsn_env, str) or not ENV_NAME.fullmatch(dsn_env):
            raise BoardConfigError("board.dsn_env must name an environment variable (the DSN itself is never "
                                   "written in hermes.yaml)")
        checked["dsn_env"] = dsn_env
    if "host_timeout" in allowed:
        timeout = fields.get("host_timeout", DEFAULT_HOST_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_HOST_TIMEOUT:
            raise BoardConfigError(f"board.host_timeout must be a number of seconds above 0 and at most "
                                   f"{MAX_HOST_TIMEOUT:,.0f}")
        checked["host_timeout"] = float(timeout)
    return checked


def check_host(value: object) -> str | None:
    """hermes.yaml's `host:` (this host's name on a shared board), or None for the hostname (pure)."""
    if value is None:
        return None
    if not isinstance(value, str) or not HOST_NAME.fullmatch(value):
        raise BoardConfigError("'host' must be a host name: letters, digits, '.', '_' and '-', at most 64")
    return value


def _opener(backend: str) -> Opener:
    if backend not in _REGISTRY and backend in PLUGINS:
        try:
            importlib.import_module(PLUGINS[backend])
        except ModuleNotFoundError as exc:
            missing = exc.name or PLUGINS[backend]
            raise BoardConfigError(
                f"board backend '{backend}' is not installed here (module {missing} is missing); use "
                f"backend: {DEFAULT_BACKEND}, or install hermes-sup with its {backend} support") from None
    if backend not in _REGISTRY:
        raise BoardConfigError(f"board backend '{backend}' did not register itself")
    return _REGISTRY[backend]


def open_board(workspace_root: str | os.PathLike[str], board_config: Mapping[str, Any] | None = None, *,
               lock_timeout: float = 60.0, host: str | None = None) -> BoardStore:
    """The workspace's board, by its `board:` section (None: the default file board in kanban/);
    `host` is hermes.yaml's `host:` (None: the hostname). Raises BoardConfigError for a section no
    installed backend can open, BoardError if the board cannot be opened."""
    section = check_board_config(board_config)
    return _opener(section["backend"])(Path(workspace_root) / "kanban", section, lock_timeout=lock_timeout,
                                       host=check_host(host))


def _open_files(folder: Path, section: Mapping[str, Any], *, lock_timeout: float, host: str | None) -> BoardStore:
    from .board import Board  # the file backend: imported by the factory alone

    return Board(folder, lock_timeout=lock_timeout)


register(DEFAULT_BACKEND, _open_files)
