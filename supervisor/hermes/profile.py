"""A Hermes Agent home or profile read as hostile input: every file bounded, never through a symlink, never a
FIFO; YAML without aliases; of .env only the names, so a key's value can reach neither hermes.yaml nor a log."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...agents.memory import FILES
from ...kanban.parse import PlainYamlError, load_plain
from .cron import read_jobs

MAX_CONFIG = 1 << 20
MAX_SOUL = 64 * 1024
MAX_MEMORY = 1 << 20
MAX_SKILL_FILE = 1 << 20
MAX_SKILL_FILES = 2000
MAX_SKILLS_BYTES = 50 << 20

ENV_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")
GATEWAY_KEYS = ("gateway", "platforms", "telegram", "discord", "slack", "whatsapp", "signal",
                "matrix", "email", "sms")


class HermesImportError(Exception):
    """The profile cannot be imported as it is; the message says which file and why."""


def read_bounded(path: Path, limit: int, what: str) -> bytes | None:
    """A regular file's bytes, at most `limit`; None when absent. Never through a symlink (O_NOFOLLOW)
    nor from a FIFO or a device (O_NONBLOCK, then checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise HermesImportError(f"{what} ({path}) is a symlink; it is not followed: copy the file itself "
                                    "into the profile") from None
        raise HermesImportError(f"{what} ({path}) cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HermesImportError(f"{what} ({path}) is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise HermesImportError(f"{what} ({path}) is larger than {limit:,} bytes, more than it can hold here")
    return data


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HermesImportError(f"{what} is not UTF-8 text (byte {exc.start})") from None


def load_config(text: str, what: str = "config.yaml") -> dict[str, Any]:
    try:
        data = load_plain(text, what)
    except PlainYamlError as exc:
        raise HermesImportError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HermesImportError(f"{what} must be a mapping" + (" (model:, fallback_providers:, ...)"
                                                               if what == "config.yaml" else ""))
    return data


def env_names(text: str) -> list[str]:
    """The variable names a .env file sets (pure); the values are not looked at."""
    return sorted({match.group(1) for line in text.splitlines() if (match := ENV_LINE.match(line))})


@dataclass
class Profile:
    path: Path
    config: dict[str, Any]
    env: list[str]
    soul: str | None
    memories: dict[str, bytes]                 # MEMORY.md / USER.md -> bytes
    skills: list[tuple[str, bytes]]            # path under skills/ -> bytes
    skipped: list[str] = field(default_factory=list)  # what was found and left out, and why
    present: list[str] = field(default_factory=list)  # NOT_CARRIED keys found
    jobs: list[dict[str, Any]] = field(default_factory=list)  # cron/jobs.json's
    description: str = ""  # profile.yaml's: what the profile is good for


def _skill_files(root: Path) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The files of skills/ that belong to a skill (a folder holding SKILL.md, directly or in a
    category folder), bounded; symlinks are not followed but named."""
    files: list[tuple[str, bytes]] = []
    skipped: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        relative = here.relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # .hub, .archive, .history
        for name in sorted(filenames) + [d for d in dirnames if (here / d).is_symlink()]:
            path = here / name
            shown = (relative / name).as_posix()
            if path.is_symlink():
                skipped.append(f"skills/{shown}: a symlink, not followed")
                continue
            if not any((p / "SKILL.md").is_file() for p in (here, *here.parents) if root in (p, *p.parents)):
                continue  # not inside a skill (DESCRIPTION.md of a category, say)
            if len(files) >= MAX_SKILL_FILES:
                raise HermesImportError(f"skills/ holds more than {MAX_SKILL_FILES} files")
            data = read_bounded(path, MAX_SKILL_FILE, f"skills/{shown}")
            if data is None:
                continue
            total += len(data)
            if total > MAX_SKILLS_BYTES:
                raise HermesImportError(f"skills/ holds more than {MAX_SKILLS_BYTES >> 20} MiB")
            files.append((shown, data))
    return files, skipped


def read_profile(path: Path) -> Profile:
    """Everything the import needs of a Hermes home or profile, read and checked before anything is
    written."""
    if not path.is_dir():
        raise HermesImportError(f"{path} is not a folder (a Hermes home such as ~/.hermes, or a profile such as "
                                "~/.hermes/profiles/NAME)")
    raw = read_bounded(path / "config.yaml", MAX_CONFIG, "config.yaml")
    config = load_config(_text(raw, "config.yaml")) if raw is not None else {}
    env = read_bounded(path / ".env", MAX_CONFIG, ".env")
    soul = read_bounded(path / "SOUL.md", MAX_SOUL, "SOUL.md")
    memories = {}
    if (path / "memories").is_symlink():  # O_NOFOLLOW guards a file's last part only
        raise HermesImportError(f"memories/ ({path / 'memories'}) is a symlink; it is not followed: copy the folder "
                                "itself into the profile")
    for name in FILES.values():
        data = read_bounded(path / "memories" / name, MAX_MEMORY, f"memories/{name}")
        if data is not None:
            _text(data, f"memories/{name}")
            memories[name] = data
    skills, skipped = ([], [])
    if (path / "skills").is_symlink():
        skipped.append("skills/: a symlink, not followed")
    elif (path / "skills").is_dir():
        skills, skipped = _skill_files(path / "skills")
    present = []
    platforms = config.get("platform_toolsets")
    messaging = isinstance(platforms, dict) and any(key != "cli" for key in platforms)
    if messaging or any(key in config for key in GATEWAY_KEYS) or (path / "gateway").exists() \
            or (path / "gateway.json").exists():
        present.append("gateway")
    for key, names in (("sessions", ("sessions", "state.db")), ("kanban", ("kanban.db", "kanban"))):
        if any((path / name).exists() for name in names):
            present.append(key)
    plugins = config.get("plugins")
    if isinstance(plugins, dict) and plugins.get("enabled"):  # an empty allow-list enables none
        present.append("plugins")
    if (path / "cron").is_symlink():
        raise HermesImportError(f"cron/ ({path / 'cron'}) is a symlink; it is not followed: copy the folder itself "
                                "into the profile")
    try:
        jobs = read_jobs(path / "cron" / "jobs.json", read_bounded)
    except ValueError as exc:
        raise HermesImportError(str(exc)) from None
    meta = read_bounded(path / "profile.yaml", MAX_SOUL, "profile.yaml")
    described = load_config(_text(meta, "profile.yaml"), "profile.yaml").get("description") if meta else None
    return Profile(path, config, env_names(_text(env, ".env")) if env is not None else [],
                   _text(soul, "SOUL.md").strip() if soul is not None else None, memories, skills, skipped, present,
                   jobs, described.strip()[:1000] if isinstance(described, str) else "")


# -- the plan (pure) --------------------------------------------------------------------------------
