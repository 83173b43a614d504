"""Atomic file primitives: the only way the board writes a task document.

A document is written to a hidden temp file beside its destination, fsync'd, and renamed over it,
so a reader sees the old bytes or the new ones, never a mix; a process killed half-way leaves only
a hidden temp file, which the board's recovery sweeps away.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"


TMP_RE = re.compile(r"\..+\.\d+\.[0-9a-f]{6}\.tmp")


def tmp_path_for(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.{os.urandom(3).hex()}{TMP_SUFFIX}")


def is_tmp_name(name: str) -> bool:
    """A temp file written by write_atomic (and left behind if its writer was killed)."""
    return TMP_RE.fullmatch(name) is not None


def dumps(doc: Any) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def write_atomic(dest: Path, data: bytes, *, fsync: bool = True) -> None:
    tmp = tmp_path_for(dest)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.rename(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(dest: Path, doc: Any, *, fsync: bool = True) -> None:
    write_atomic(dest, dumps(doc), fsync=fsync)


def read_bytes_nofollow(path: Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of a regular file; refuses a symlink at the last component."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line with a single write; repair a torn last line left by a killed writer first.

    Callers hold the board lock, so the check of the last byte and the append cannot interleave.
    """
    line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and _last_byte(path, size) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as handle:
        return os.pread(handle.fileno(), 1, size - 1)


def unique_path(folder: Path, name: str) -> Path:
    """`folder/name`, or `folder/name-1`, `-2`, ... (before the extension) if it exists."""
    candidate = folder / name
    stem, dot, ext = name.partition(".")
    index = 1
    while candidate.exists() or candidate.is_symlink():
        candidate = folder / f"{stem}-{index}{dot}{ext}"
        index += 1
    return candidate
