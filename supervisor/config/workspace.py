"""The workspace: a directory holding hermes.yaml, found like git finds a repository, and its config.

Config errors name the file and line, because a person has to go and fix them.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ...kanban import BoardError, BoardStore
from ...kanban.backends import BoardConfigError, check_board_config, check_host, open_board
from ...kanban.parse import PlainLoader

CONFIG_NAME = "hermes.yaml"
WORKSPACE_ENV = "HERMES_SUP_WORKSPACE"
# The example team and its tasks, shipped beside the code (the repository's examples/ folder).
class ConfigError(Exception):
    """hermes.yaml cannot be used; the message starts with file:line."""


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def board_path(self) -> Path:
        return self.root / "kanban"

    @property
    def runs_path(self) -> Path:
        return self.root / "runs"

    @property
    def skills_path(self) -> Path:
        return self.root / "skills"


def find_workspace(explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Workspace:
    """-w/--workspace, else $HERMES_SUP_WORKSPACE, else the current directory upward."""
    chosen = explicit or os.environ.get(WORKSPACE_ENV)
    if chosen:
        root = Path(chosen).expanduser().absolute()
        if not (root / CONFIG_NAME).is_file():
            raise ConfigError(f"{root}: not a workspace (no {CONFIG_NAME}); create one with `hermes-sup init {root}`")
        return Workspace(root)
    start = (cwd or Path.cwd()).absolute()
    for folder in (start, *start.parents):
        if (folder / CONFIG_NAME).is_file():
            return Workspace(folder)
    raise ConfigError(
        f"{start}: no {CONFIG_NAME} here or in any parent folder; run `hermes-sup init` to create a workspace, "
        f"or name one with -w DIR or ${WORKSPACE_ENV}"
    )


MAX_CONFIG_BYTES = 1 << 20
MAX_NESTING = 32  # hermes.yaml needs about 6 levels; PyYAML's composer recurses once per level
class _LineLoader(PlainLoader):
    """The board's plain-data YAML loader (no aliases, duplicate keys, dates, deep nesting), which also
    remembers the line of every mapping, for error messages."""

    source = "hermes.yaml"
    max_depth = MAX_NESTING

    def construct_plain_mapping(self, node: yaml.MappingNode) -> dict[Any, Any]:
        mapping = super().construct_plain_mapping(node)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip_lines(item) for key, item in value.items() if key != "__line__"}
    if isinstance(value, list):
        return [_strip_lines(item) for item in value]
    return value


def _parse_config(path: Path) -> dict[str, Any]:
    """hermes.yaml as plain data, each mapping with its `__line__`; ConfigError if it is no YAML mapping."""
    data = _read_regular(path, MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}:1: larger than {MAX_CONFIG_BYTES:,} bytes, the most hermes.yaml may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x})") from None
    try:
        raw = yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.reader.ReaderError as exc:  # a control character: it carries a position, not a mark
        line = text[:exc.position].count("\n") + 1
        raise ConfigError(f"{path}:{line}: invalid YAML: character {exc.character:#06x} is not allowed "
                          "(write it as an escape in a double-quoted string)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: invalid YAML: {problem}") from None
    except (ValueError, RecursionError, OverflowError) as exc:  # an integer of 5,000 digits, say
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if raw is None:
        raw = {"__line__": 1}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: the top level must be a mapping (providers, tiers, defaults, agents)")
    return raw


def _board_settings(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], str | None]:
    """The checked `board:` section and `host:` of a parsed hermes.yaml; ConfigError at their line."""
    section = raw.get("board")
    line = section.get("__line__", raw.get("__line__", 1)) if isinstance(section, dict) else raw.get("__line__", 1)
    try:
        return check_board_config(section), check_host(raw.get("host"))
    except BoardConfigError as exc:
        raise ConfigError(f"{path}:{line}: {exc}") from None


def board_settings(ws: Workspace) -> tuple[dict[str, Any], str | None]:
    """The board section and host of the workspace's hermes.yaml, for commands that need the board
    but not the team: a hermes.yaml whose team does not check out still names its board. One that
    is no YAML at all names none: the default file board, as before there was a `board:` section."""
    try:
        raw = _parse_config(ws.config_path)
    except ConfigError:
        return check_board_config(None), None
    return _board_settings(raw, ws.config_path)


def open_workspace_board(ws: Workspace, *, lock_timeout: float = 60.0) -> BoardStore:
    """The workspace's board through the one factory; a board section this installation cannot
    open, or a board on a network filesystem, is a ConfigError (exit 2), never a traceback."""
    section, host = board_settings(ws)
    try:
        return open_board(ws.root, section, lock_timeout=lock_timeout, host=host)
    except BoardConfigError as exc:
        raise ConfigError(f"{ws.config_path}: {exc}") from None
    except BoardError as exc:
        if "network filesystem" in str(exc):
            raise ConfigError(str(exc)) from None
        raise


def load_config(path: Path, *, skills: Callable[[], Collection[str]] | None = None) -> dict[str, Any]:
    """Read and check hermes.yaml; ConfigError names file:line of the first problem. `skills` gives
    the names of the skills present (default: discovered beside the file, never run)."""
    # Imported here: the checks (every section's, the runtimes', the alerts') cost a command that only
    # reads state, such as `status` while a team starts, a sixth of its start-up.
    from ..governance.alerts import bare_on, check_alerts
    from ..governance.schedules import check_schedules
    from .checks import (
        check_agent,
        check_observability,
        check_prices,
        check_providers,
        check_settings,
        check_skills,
        runnable,
        skill_names,
    )
    from .folders import check_folders
    from .mcpconfig import check_mcp_servers
    from .runtimes import check_budgeted, check_profiles
    from .schema import TOP, check_keys, check_sections

    raw = _parse_config(path)

    def fail(node: Any, message: str) -> ConfigError:
        line = node.get("__line__", 1) if isinstance(node, dict) else 1
        return ConfigError(f"{path}:{line}: {message}")

    check_keys(raw, TOP, fail)
    bare_on(raw)
    check_sections(raw, fail)
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise fail(raw, "'defaults' must be a mapping")
    check_keys(defaults, TOP.field("defaults"), fail, prefix="defaults.")
    check_settings(defaults, "defaults", fail)
    _board_settings(raw, path)
    check_providers(raw, fail)
    check_prices(raw, fail)
    check_schedules(raw, fail)
    check_alerts(raw, fail)
    check_observability(raw, fail)
    agents = raw.get("agents") or []
    if not isinstance(agents, list):
        raise fail(raw, "'agents' must be a list")
    if not agents:
        raise fail(raw, "no agents: 'agents' must list at least one (a name and its roles)")
    names: set[str] = set()
    for agent in agents:
        if not isinstance(agent, dict):
            raise fail(raw, "each entry of 'agents' must be a mapping with at least a name")
        check_agent(agent, raw.get("providers"), fail)
        name, count = agent["name"], agent.get("count", 1)
        expanded = [name] if count == 1 else [f"{name}-{index}" for index in range(1, count + 1)]
        command = agent.get("command")
        if command and not runnable(command[0], path.parent / "runs" / expanded[0], agent.get("env") or {}):
            raise fail(agent, f"agent {name}: command {command[0]!r} is not an executable file"
                              + ("" if "/" in command[0] else " on PATH"))
        for item in expanded:
            if item in names:
                raise fail(agent, f"agent name '{item}' is used twice")
            names.add(item)
    check_budgeted(raw, fail)
    check_skills(agents, fail, skills or (lambda: skill_names(path.parent)))
    check_folders(raw, path.parent, fail)
    check_profiles(raw, path.parent, fail)
    check_mcp_servers(raw, fail)
    return _strip_lines(raw)


def _read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file. A FIFO in its place would block a reload forever
    and /dev/zero would never end, so the file is opened without blocking and checked first."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: cannot be read: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(limit)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


PRIVATE_UMASK = 0o077
SHARED_UMASK = 0o022  # the bits the command line always masks


def private_dir(path: Path) -> Path:
    """`path` as a directory of ours with mode 0700, whatever the umask or a previous occupant left
    (runs/ of a workspace made before it was private, or under a loose umask).

    Anything else at that name (a file, a symlink, another user's folder planted in a writable
    runs/) is moved aside rather than trusted."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()):
        os.rename(path, path.with_name(f"{path.name}.suspect-{time.time_ns()}"))
        info = None
    if info is None:
        os.mkdir(path, 0o700)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path

