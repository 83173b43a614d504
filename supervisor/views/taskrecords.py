"""One task's records gathered from every agent's journals (model calls, tool calls, transcript) and
read at the edge: bounded, regular files only, torn and damaged lines skipped (timeline.py merges them).
"""

from __future__ import annotations

import glob
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...agents.resume import set_aside_attempt
from ...kanban import BoardError, BoardStore

LLM_LOG = "llm_calls.jsonl"
TOOL_LOG = "tool_calls.jsonl"
# Journals are the agents' to write and may be large or hostile: a read takes at most this much of a
# file (its end, where the newest records are), and delegation nests only so deep.
MAX_BYTES = 32 << 20
MAX_DEPTH = 4
ROLES = ("system", "user", "assistant", "tool")
WRITING_TOOLS = ("write_file", "patch")


@dataclass(frozen=True)
class Source:
    """One journal: whose (the agent's folder name) and what it holds (model, tool or message)."""
    agent: str
    kind: str
    path: Path


@dataclass
class Raw:
    """What was read of one journal: its records (in file order) for the task."""
    source: Source
    records: list[dict[str, Any]] = field(default_factory=list)


# -- reading (I/O) ----------------------------------------------------------------------------------

def _subdirs(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as found:
            # A symlink in an agent's folder could point anywhere: only real folders are agents.
            return sorted(Path(e.path) for e in found if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def agent_dirs(runs: Path) -> list[tuple[str, Path]]:
    """Every agent's working folder: runs/<agent>/ and its delegated children's, nested, under
    runs/<agent>/children/<child>/ (named by their folder)."""
    found: list[tuple[str, Path]] = []
    level = [(path.name, path) for path in _subdirs(runs)]
    for _ in range(MAX_DEPTH):
        found += level
        level = [(child.name, child) for _, folder in level for child in _subdirs(folder / "children")]
        if not level:
            break
    return found


def sources(runs: Path, task_id: str) -> list[Source]:
    """The journals that may hold records of the task, existing or not yet."""
    result = []
    for agent, folder in agent_dirs(runs):
        result.append(Source(agent, "model", folder / LLM_LOG))
        result.append(Source(agent, "tool", folder / TOOL_LOG))
        if "/" not in task_id and not task_id.startswith("."):  # ids are names; never a path out
            result.append(Source(agent, "message", folder / "transcripts" / f"{task_id}.jsonl"))
            # Conversations of earlier attempts, set aside when a new one started (kanban/journal.py).
            result += [Source(agent, "message", path)
                       for path in sorted((folder / "transcripts").glob(f"{glob.escape(task_id)}.attempt-*.jsonl"))]
    return result


@dataclass
class Lines:
    """What `read_lines` found: the complete lines, the offset after them, whether the file was
    read from its start again (rewritten), the file's inode, and notes."""
    lines: list[bytes]
    offset: int
    restarted: bool = False
    notes: list[str] = field(default_factory=list)
    inode: int | None = None


def read_lines(path: Path, offset: int, limit: int = MAX_BYTES, inode: int | None = None) -> Lines:
    """The complete lines of `path` after `offset`. A line still being written is left for the
    next call; a file that shrank or is another file than `inode` (a transcript is replaced whole,
    atomically, when compressed or taken over) is read from its start; a FIFO or device in its place
    is not read (it could block or never end); more than `limit` new bytes: only the last `limit`
    are read, from their first whole line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return Lines([], offset, inode=inode)
    notes: list[str] = []
    restarted = False
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Lines([], offset, notes=[f"{path.name}: not a regular file; not read"], inode=inode)
        if info.st_size < offset or (inode is not None and info.st_ino != inode):
            offset, restarted = 0, True
        start = offset
        if info.st_size - start > limit:
            start = info.st_size - limit
            notes.append(f"{path.name}: {start - offset:,} bytes skipped (read at most {limit:,} at a time)")
        handle.seek(start)
        data = handle.read(info.st_size - start)
    if start != offset:
        cut = data.find(b"\n") + 1  # the first line was cut by the skip
        data, start = data[cut:], start + cut
    end = data.rfind(b"\n")
    if end < 0:
        return Lines([], start, restarted, notes, info.st_ino)
    return Lines(data[:end].split(b"\n"), start + end + 1, restarted, notes, info.st_ino)


def parse(lines: Iterable[bytes], name: str, needle: bytes = b"") -> tuple[list[dict[str, Any]], list[str]]:
    """JSON objects, one a line, of the lines that hold `needle` (an agent's logs hold every task
    it worked: the others' lines are not decoded at all); a damaged line is skipped with a note,
    never raised (pure)."""
    records, notes = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or needle not in line:
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            notes.append(f"{name}: a line that is not JSON is skipped")
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            notes.append(f"{name}: line {number} is not a record and is skipped")
    return records, notes


def for_task(source: Source, records: list[dict[str, Any]], task_id: str) -> list[dict[str, Any]]:
    """The records of a journal that belong to the task (a transcript is the task's alone) (pure)."""
    if source.kind == "message":
        return [r for r in records if r.get("role") in ROLES]
    return [r for r in records if r.get("task") == task_id]


# The kinds of the board database's journal rows (kanban/pg/journal.py), as the journals here name them.
DB_KINDS = {"message": "message", "tool": "tool", "llm": "model"}
# A board's `journal_rows(task_id, kind, after=0)`: its rows, or None when it keeps none (the file board).
JournalRows = Callable[..., list[dict[str, Any]] | None]
# A board's `journal_marks(task_id)`: what its rows of the task are, without them (see the protocol).
JournalMarks = Callable[[str], list[dict[str, Any]] | None]
Marks = dict[tuple[str, str, str], tuple[int, int]]


def marks_of(rows: Iterable[dict[str, Any]]) -> Marks:
    """Per (kind, agent, name) of journal rows: how many and the newest seq, as `journal_marks` says
    them of the database's (pure)."""
    found: Marks = {}
    for row in rows:
        key = (str(row.get("kind")), str(row.get("agent")), str(row.get("name")))
        count, last = found.get(key, (0, 0))
        found[key] = (count + 1, max(last, _seq(row)))
    return found


def _seq(row: dict[str, Any]) -> int:
    seq = row.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0


def marks_read(marks: Iterable[dict[str, Any]]) -> Marks:
    """`journal_marks` rows of the kinds shown as `marks_of` has them (pure)."""
    return {(str(m.get("kind")), str(m.get("agent")), str(m.get("name"))): (int(m.get("rows") or 0),
                                                                             int(m.get("last") or 0))
            for m in marks if m.get("kind") in DB_KINDS}


def board_rows(board: BoardStore) -> JournalRows:
    """The board's reader of the journal rows it keeps (the protocol's `journal_rows`): rows on a
    PostgreSQL board, None from the file board, whose journals are the agents' files read here."""
    return board.journal_rows


def shown_transcript(name: str, task_id: str) -> bool:
    """Whether a transcript's name is the task's current one or an earlier attempt's: those are
    shown, a copy kept when one was replaced (compressed, taken over) is not (pure)."""
    return name == f"{task_id}.jsonl" or (set_aside_attempt(name, task_id) is not None
                                          and attempt_of(name) < ATTEMPT_LAST)


def db_raws(rows: dict[str, list[dict[str, Any]]], task_id: str) -> tuple[list[Raw], list[str]]:
    """The board database's journal rows of a task (by kind: message, tool, llm) as the journals
    the files would be, one per agent and kind (a transcript per name), in the order written; a row
    that is no record is skipped with a note (pure)."""
    found: dict[Source, Raw] = {}
    notes = []
    for kind, kind_rows in rows.items():
        for row in kind_rows:
            name = str(row.get("name") or "")
            if kind == "message" and not shown_transcript(name, task_id):
                continue
            entry = row.get("entry")
            if not isinstance(entry, dict):
                notes.append(f"journal row {row.get('seq')} in the board database is not a record and is skipped")
                continue
            path = Path(name if kind == "message" else (TOOL_LOG if kind == "tool" else LLM_LOG))
            source = Source(str(row.get("agent") or "-"), DB_KINDS[kind], path)
            found.setdefault(source, Raw(source)).records.append(entry)
    raws = [Raw(raw.source, for_task(raw.source, raw.records, task_id)) for raw in found.values()]
    return raws, notes


class Gatherer:
    """Reads a task's records from every journal, again and again: each call to `poll` reads what
    was appended since the last (new agents and children included), complete lines only. On a
    board that keeps the journal in its database (`rows`: PostgreSQL), that journal too: another
    host's agents' records are only there."""

    def __init__(self, runs: Path, task_id: str, rows: JournalRows | None = None,
                 marks: JournalMarks | None = None) -> None:
        self.runs = runs
        self.task_id = task_id
        self.rows = rows
        # With `marks` (the board's journal_marks) the database's rows are read again only when their
        # marks moved, and then only those after the newest held, unless the marks say more changed.
        self.marks = marks
        self.held: dict[str, list[dict[str, Any]]] | None = None  # the database's rows, by kind
        self.held_marks: Marks = {}
        self.rows_read = 0  # rows read from the database (the "bounded per poll" test counts them)
        self._shown: tuple[Any, list[str]] = (None, [])  # the rows db_raws last made raws of, its notes
        self.offsets: dict[Source, int] = {}
        self.inodes: dict[Source, int | None] = {}
        self.raws: dict[Source, Raw] = {}
        self.rewritten: set[Source] = set()  # transcripts rewritten (compressed) since the last poll
        self.in_db: set[Source] = set()

    def _read_db(self, rows: JournalRows) -> dict[str, list[dict[str, Any]]] | None:
        """The database's journal rows of the task, by kind: all of them, or with `marks` those held
        and the new ones, read whole again only when the marks say more than appends happened (a
        transcript set aside under another name, a row committed late, rows pruned). None: a board
        that keeps none; what is held when nothing changed."""
        if self.marks is None:
            found = {kind: rows(self.task_id, kind) for kind in DB_KINDS}
            self.rows_read += sum(len(kind_rows or []) for kind_rows in found.values())
            return None if any(kind_rows is None for kind_rows in found.values()) else \
                {kind: kind_rows for kind, kind_rows in found.items() if kind_rows is not None}
        said = self.marks(self.task_id)
        if said is None:
            return None
        now = marks_read(said)
        if self.held is not None and now == self.held_marks:
            return self.held
        if self.held is not None:
            after = max((last for _count, last in self.held_marks.values()), default=0)
            new = {kind: rows(self.task_id, kind, after=after) or [] for kind in DB_KINDS}
            self.rows_read += sum(map(len, new.values()))
            grown = {kind: self.held[kind] + new[kind] for kind in DB_KINDS}
            if marks_of(row for kind_rows in grown.values() for row in kind_rows) == now:
                self.held, self.held_marks = grown, now
                return grown
        found = {kind: rows(self.task_id, kind) for kind in DB_KINDS}
        if any(kind_rows is None for kind_rows in found.values()):
            return None
        whole = {kind: kind_rows or [] for kind, kind_rows in found.items()}
        self.rows_read += sum(map(len, whole.values()))
        # Marked by what was read: a change after the marks were read is seen at the next poll.
        self.held, self.held_marks = whole, marks_of(row for kind_rows in whole.values() for row in kind_rows)
        return whole

    def _poll_db(self, rows: JournalRows) -> list[str]:
        """Read the database's journal (its transcripts are renamed, not appended to, when replaced):
        a transcript that no longer starts as it did was rewritten."""
        kept = self._read_db(rows)
        if kept is None:  # a board that keeps no journal rows: the files are all there is
            return []
        if kept is self._shown[0]:  # nothing changed: what was made of it stands, its notes said again
            return list(self._shown[1])
        raws, notes = db_raws(kept, self.task_id)
        self._shown = (kept, notes)
        current = {raw.source: raw for raw in raws}
        for source in self.in_db - set(current):
            del self.raws[source]
        for source, raw in current.items():
            before = self.raws.get(source)
            if before is not None and source.kind == "message" and raw.records[:len(before.records)] != before.records:
                self.rewritten.add(source)
            self.raws[source] = raw
        self.in_db = set(current)
        return notes

    def poll(self) -> list[str]:
        """Read what is new; the notes about damaged or skipped lines."""
        notes = []
        if self.rows is not None:
            try:
                notes += self._poll_db(self.rows)
            except BoardError as exc:
                notes.append(f"the board database's journal could not be read: {exc}")
        # The model calls an agent logged here are in the database too: shown once, from there.
        in_db = {(source.agent, source.kind) for source in self.in_db}
        for source in sources(self.runs, self.task_id):
            if (source.agent, source.kind) in in_db and source.kind == "model":
                self.raws.pop(source, None)  # read before the agent's first row reached the database
                continue
            found = read_lines(source.path, self.offsets.get(source, 0), inode=self.inodes.get(source))
            notes += [f"{source.agent}: {note}" for note in found.notes]
            raw = self.raws.setdefault(source, Raw(source))
            if found.restarted:  # rewritten (a compressed transcript): what it holds now replaces it
                raw.records = []
                self.rewritten.add(source)
            self.offsets[source], self.inodes[source] = found.offset, found.inode
            # A task id is written as is (a slug: nothing JSON escapes), so its bytes are in its lines.
            needle = b"" if source.kind == "message" else self.task_id.encode()
            records, parse_notes = parse(found.lines, source.path.name, needle)
            notes += [f"{source.agent}: {note}" for note in parse_notes]
            raw.records += for_task(source, records, self.task_id)
        return notes

    def all(self) -> list[Raw]:
        return [raw for raw in self.raws.values() if raw.records]


def gather(runs: Path, task_id: str, rows: JournalRows | None = None) -> tuple[list[Raw], list[str]]:
    """Everything recorded of the task so far, and notes about what could not be read."""
    gatherer = Gatherer(runs, task_id, rows)
    notes = gatherer.poll()
    return gatherer.all(), notes


ATTEMPT_LAST = 1 << 62  # the order of a task's current transcript, after every attempt set aside


def attempt_of(name: str) -> int:
    """The attempt a set-aside transcript (`<task>.attempt-N.jsonl`) holds; ATTEMPT_LAST for the current one."""
    number = set_aside_attempt(name)
    return number if number is not None and number < 10 ** 17 else ATTEMPT_LAST
