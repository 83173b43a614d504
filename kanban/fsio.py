"""Atomic and link-safe file primitives: the only way the board writes a task document.

A document is written to a hidden temp file beside its destination, fsync'd, and renamed over it,
so a reader sees the old bytes or the new ones, never a mix; a process killed half-way leaves only
a hidden temp file, which the board's recovery sweeps away. Nothing here follows a symlink at the
last component: anyone who can write into the board's folders could plant one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from .redact import scrub, scrub_bytes

TMP_SUFFIX = ".tmp"
# Names the board makes from outside names stay this short: room under NAME_MAX (255 bytes) for a
# task id before them and "-NN" and ".error.txt" after.
NAME_LIMIT = 160
# Bytes that are not UTF-8 (decoded by Python as lone surrogates) and control characters.
_UNSAFE_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


# A pid has at most 7 digits (Linux pids stay below 2**22): a longer number is no writer of ours,
# and would overflow psutil.
TMP_RE = re.compile(r"\..+\.(\d{1,7})\.[0-9a-f]{6}\.tmp")


def tmp_path_for(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.{os.urandom(3).hex()}{TMP_SUFFIX}")


def tmp_writer_pid(name: str) -> int | None:
    """The pid that wrote a temp file of write_temp's naming, else None (not one of ours)."""
    match = TMP_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def dumps(doc: Any) -> bytes:
    # One line, not indented: with indent set, json falls back from its C encoder to pure Python,
    # several times slower on the claim path. `hermes-sup task show` is the readable view.
    # backslashreplace: a lone surrogate (an agent's error naming a non-UTF-8 file, say) is written
    # as the JSON escape \udcXX instead of failing the transition.
    return (json.dumps(doc, ensure_ascii=False, separators=(", ", ": ")) + "\n").encode("utf-8", "backslashreplace")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # the original byte, as Python's surrogateescape kept it
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_name(name: str, limit: int = NAME_LIMIT) -> str:
    """`name` safe to create and to show: bytes that are not UTF-8 and control characters written
    as \\xNN, and cut to `limit` bytes keeping a short extension (pure)."""
    text = _UNSAFE_CHAR.sub(_escape_char, name)
    if len(text.encode("utf-8")) <= limit:
        return text
    stem, dot, ext = text.rpartition(".")
    if not dot or len(ext.encode("utf-8")) > 16:
        stem, ext = text, ""
    room = limit - len(ext.encode("utf-8")) - len(dot if ext else "")
    cut = stem.encode("utf-8")[:room].decode("utf-8", "ignore")
    return f"{cut}.{ext}" if ext else cut


def create_exclusive(path: Path, data: bytes) -> None:
    """Create `path` with `data`; FileExistsError if anything, a symlink included, is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_temp(dest: Path, data: bytes, *, fsync: bool = True) -> Path:
    """Write `data` to a new hidden temp file beside `dest` and return its path; the caller renames
    it into place (under the board lock) or unlinks it."""
    tmp, fd = write_temp_open(dest, data)
    try:
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def write_temp_open(dest: Path, data: bytes) -> tuple[Path, int]:
    """write_temp's file, not yet fsync'd, and its descriptor, left open for the caller to fsync
    (kanban/fsyncs.py) and close: by the descriptor, what is made durable is what was written, even
    if another process renamed something else over the temp file's name meanwhile."""
    tmp = tmp_path_for(dest)
    data = scrub_bytes(data)  # no key this process knows reaches a file: a task's error, a transcript
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, mode_for(dest.parent))  # not the umask's say: 000 would make it world-writable
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return tmp, fd


def write_atomic(dest: Path, data: bytes, *, fsync: bool = True) -> None:
    tmp = write_temp(dest, data, fsync=fsync)
    try:
        os.rename(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(dest: Path, doc: Any, *, fsync: bool = True) -> None:
    write_atomic(dest, dumps(doc), fsync=fsync)


def write_atomic_at(folder: int, name: str, data: bytes, *, fsync: bool = True) -> None:
    """write_atomic for the file `name` in the folder open as descriptor `folder` (an agent's file
    tools reach it without following a symlink on the way): a symlink at `name` is replaced, never
    written through."""
    # Its bytes, not characters, bounded: a temp name past NAME_MAX would fail a name that is not.
    stem = name.encode("utf-8", "ignore")[:100].decode("utf-8", "ignore")
    tmp = f".{stem}.{os.getpid()}.{os.urandom(3).hex()}{TMP_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        try:
            os.fchmod(fd, _mode_of(os.fstat(folder).st_mode))
            write_all(fd, scrub_bytes(data))  # no key this process knows reaches a file
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)  # a full disk or a folder in the way leaves no temp file
        raise


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_bytes_nofollow(path: Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of a regular file. A symlink at the last component raises OSError
    ELOOP, anything else that is not a regular file (a FIFO, a device) OSError EINVAL, unread."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` + 1 bytes from an open file (one more than allowed tells the caller it is too big)."""
    chunks = []
    remaining = limit + 1
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def record_line(record: dict[str, Any]) -> bytes:
    """One record as a line of a JSONL log: compact, scrubbed of known secrets, newline-terminated."""
    return (scrub(json.dumps(record, ensure_ascii=False, separators=(",", ":"))) + "\n").encode(
        "utf-8", "backslashreplace")


def open_log(path: Path) -> int:
    """A descriptor for appending to the log at `path` (created if missing, never through a symlink)."""
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)


def append_line(fd: int, folder: Path, line: bytes) -> None:
    """Append `line` with one write(2) to the log open at `fd`, closing first a torn last line (its
    writer killed mid-write), so that it is never glued to the new one. A log just created gets
    the mode its `folder` says (mode_for), not the umask's."""
    info = os.fstat(fd)
    if not info.st_size and info.st_uid == os.getuid():
        os.fchmod(fd, mode_for(folder))
    if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
        line = b"\n" + line
    os.write(fd, line)


class AppendLog:
    """An append-only JSONL file, one record per write(2), the descriptor kept open between appends.

    Callers hold the board lock, so the repair of a torn last line (a writer killed mid-write)
    and the append cannot interleave. If the file is replaced or removed by hand, the next append
    reopens it by name.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _descriptor(self) -> int:
        if self._fd is not None:
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                    return self._fd
            except FileNotFoundError:
                pass
            self.close()
        self._fd = open_log(self.path)
        return self._fd

    def append(self, record: dict[str, Any]) -> None:
        line = record_line(record)
        append_line(self._descriptor(), self.path.parent, line)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_complete_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines appended to `path` since `offset`, and the offset after them. A file
    that shrank (truncated, rotated, replaced) is read again from its start; a line still being
    written is left for the next call."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < offset:
                offset = 0
            if size == offset:
                return [], offset
            handle.seek(offset)
            data = handle.read(size - offset)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[:end].split(b"\n"), offset + end + 1


def unique_path(folder: Path, name: str, companions: tuple[str, ...] = ()) -> Path:
    """`folder/name`, or `folder/name-1`, `-2`, ... (before the extension) if it, or it with one of
    the `companions` suffixes appended, exists (a symlink, dangling or not, included)."""
    candidate = folder / name
    stem, dot, ext = name.partition(".")
    index = 1
    while any(os.path.lexists(f"{candidate}{suffix}") for suffix in ("", *companions)):
        candidate = folder / f"{stem}-{index}{dot}{ext}"
        index += 1
    return candidate


def mode_for(folder: Path) -> int:
    """The mode of a file the board (or an agent) writes in `folder`, whatever the writer's umask:
    the folder's read bits, and write for the owner only (0755 gives 0644, 0700 gives 0600, a
    world-writable 0777 still 0644). The board's folders are 0755, so a team's humans can read it;
    an agent's state under runs/ (0700) stays private."""
    try:
        return _mode_of(os.stat(folder).st_mode)
    except OSError:
        return 0o600


def _mode_of(folder_mode: int) -> int:
    return stat.S_IMODE(folder_mode) & 0o644 | 0o600
