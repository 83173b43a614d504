"""One task's records gathered from every agent's journals (model calls, tool calls, transcript) and
merged in time order: the reading at the edge (bounded, regular files only, torn and damaged lines
skipped), the merge and the summary as pure functions over plain records.
"""

from __future__ import annotations

import glob
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_sup.agents.resume import set_aside_attempt
from hermes_sup.kanban import BoardError, BoardStore

from .usage import ended_calls, settle_call, summarize

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
                                          and _attempt_of(name) < ATTEMPT_LAST)


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


# -- merging (pure) ---------------------------------------------------------------------------------

def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def model_entry(agent: str, record: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "model", "at": _text(record.get("at")), "agent": agent,
            "provider": _text(record.get("provider")), "model": _text(record.get("model")),
            "outcome": _text(record.get("outcome")), "tokens_in": _number(record.get("tokens_in")),
            "tokens_out": _number(record.get("tokens_out")), "tokens_cached": _number(record.get("tokens_cached")),
            "latency_s": _number(record.get("latency_s")), "cost_usd": _number(record.get("cost_usd")),
            "estimated": record.get("estimated") is True, "error": _text(record.get("error")),
            **({"route": route} if (route := route_entry(record.get("route"))) else {})}


ROUTE_KEYS = ("strategy", "tier", "check", "decision", "why")


def route_entry(route: Any) -> dict[str, str] | None:
    """A routing decision of an LLM-call record (agents/cascade.py) as text fields, or None: the
    record is a file anyone with access to runs/ may have written (pure)."""
    if not isinstance(route, dict):
        return None
    kept = {key: route[key][:300] for key in ROUTE_KEYS if isinstance(route.get(key), str)}
    return kept or None


def tool_entry(agent: str, record: dict[str, Any]) -> dict[str, Any]:
    entry = {"kind": "tool", "at": _text(record.get("at")), "agent": agent, "tool": _text(record.get("tool")),
             "call_id": str(record.get("call_id")), "turn": str(record.get("turn")),
             "status": _text(record.get("status"))}
    if record.get("status") == "done":
        entry.update(outcome=_text(record.get("outcome")), result=_text(record.get("result")),
                     duration_s=_number(record.get("duration_s")))
    else:
        entry["args"] = record.get("args")
    return entry


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append({"id": str(call.get("id")), "name": _text(function.get("name")),
                          "arguments": function.get("arguments")})
    return calls if isinstance(message.get("tool_calls"), list) else []


def message_entry(agent: str, message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    entry = {"kind": "message", "at": None, "agent": agent, "role": message.get("role"),
             "content": content if isinstance(content, str) else (None if content is None else json.dumps(content))}
    if _calls(message):
        entry["tool_calls"] = _calls(message)
    if message.get("tool_call_id") is not None:
        entry["tool_call_id"] = str(message.get("tool_call_id"))
    if message.get("is_error") is True:
        entry["is_error"] = True
    return entry


ATTEMPT_LAST = 1 << 62  # the order of a task's current transcript, after every attempt set aside


def _attempt_of(name: str) -> int:
    """The attempt a set-aside transcript (`<task>.attempt-N.jsonl`) holds; ATTEMPT_LAST for the current one."""
    number = set_aside_attempt(name)
    return number if number is not None and number < 10 ** 17 else ATTEMPT_LAST


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _new_part(messages: list[dict[str, Any]], earlier: list[list[dict[str, Any]]]) -> int:
    """Where the messages of a transcript stop repeating one an agent wrote before it (a reclaimed
    task's transcript starts with a copy of the previous holder's)."""
    best = 0
    for other in earlier:
        shared = 0
        while shared < min(len(messages), len(other)) and _same(messages[shared], other[shared]):
            shared += 1
        best = max(best, shared)
    return best


Key = tuple[str, str, int | str]  # an entry's source (kind, agent) and its index there: what follow mode printed


def claims(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """When which agent claimed the task, from its history, in order (pure)."""
    return [(str(entry.get("at")), str(entry.get("by"))) for entry in doc.get("history") or []
            if isinstance(entry, dict) and entry.get("to") == "doing"]


def _holder(held: Sequence[tuple[str, str]], at: str, candidates: list[str]) -> str:
    """Of the agents whose logs hold a record, the one that held the task when it was written: a
    copy sits in the next holder's log too (pure)."""
    holder = None
    for since, agent in held:
        if since <= at:
            holder = agent
    return holder if holder in candidates else candidates[0]


def merge(raws: list[Raw], held: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The task's records as entries in time order (see `merge_keyed`) (pure)."""
    return [entry for _, entry in merge_keyed(raws, held)]


def merge_keyed(raws: list[Raw], held: Sequence[tuple[str, str]] = (),
                open_calls: bool = True) -> list[tuple[Key, dict[str, Any]]]:
    """The task's model calls, tool calls and messages as entries in time order (pure).

    A model call started and never ended is shown as interrupted when its agent logged something
    after it, and, with `open_calls`, also when it is the agent's last (killed mid-call, or still
    under way: follow mode, which cannot take a line back, waits for what comes next).

    Model and tool records carry their time. Messages do not: each is placed by what it follows: an
    assistant message after the model call that produced it (the agent's next answered call), a tool
    result after its call's logged end, any other after the message before it. A record copied from
    the agent that held the task before (tool records, the transcript's head) is shown once, under
    the agent that wrote it: the holder at its time by `held` (see `claims`) for a tool record."""
    keyed: list[tuple[str, int, int, Key, dict[str, Any]]] = []
    seq = 0
    tool_agents: dict[str, list[str]] = {}
    for raw in raws:
        if raw.source.kind == "tool":
            for record in raw.records:
                key = json.dumps([record.get(k) for k in ("turn", "call_id", "status", "at")], default=str)
                tool_agents.setdefault(key, []).append(raw.source.agent)
    seen_tools: set[str] = set()
    done_at: dict[str, str] = {}
    answered: dict[str, list[str]] = {}
    for raw in sorted(raws, key=lambda r: (r.source.kind, r.source.agent)):
        ended = ended_calls((raw.source.agent, r) for r in raw.records) if raw.source.kind == "model" else set()
        for index, record in enumerate(raw.records):
            if raw.source.kind == "model":
                settled = settle_call(raw.source.agent, record, ended)  # a call's start: shown if it never ended
                if settled is None or (settled is not record and not open_calls and index == len(raw.records) - 1):
                    continue
                entry = model_entry(raw.source.agent, settled)
                ident: Key = ("model", raw.source.agent, index)
                if entry["outcome"] == "ok" and entry["at"]:
                    answered.setdefault(raw.source.agent, []).append(entry["at"])
            elif raw.source.kind == "tool":
                # Told apart by content, not by whose log: the same record copied to the next holder
                # is one call (and follow mode, which printed it once, knows it by its content).
                key = json.dumps([record.get(k) for k in ("turn", "call_id", "status", "at")], default=str)
                if key in seen_tools:
                    continue
                seen_tools.add(key)
                agents = sorted(set(tool_agents[key]))
                entry = tool_entry(_holder(held, str(record.get("at")), agents) if len(agents) > 1 else agents[0],
                                   record)
                ident = ("tool", "", key)
                if entry["status"] == "done" and entry["at"]:
                    done_at.setdefault(entry["call_id"], entry["at"])
            else:
                continue
            keyed.append((entry["at"] or "", 0, seq, ident, entry))
            seq += 1
    # The shorter transcript first: a copy is as long as its original at most. Of two as long, the
    # one of the agent that called a model first is the original.
    # Earlier attempts' transcripts (set aside when a new conversation started) first, in order: their
    # answers take an agent's first model calls, and the transcripts after them the calls left.
    transcripts = sorted((raw for raw in raws if raw.source.kind == "message"),
                         key=lambda r: (_attempt_of(r.source.path.name), len(r.records),
                                        min(answered.get(r.source.agent) or ["~"]), r.source.agent))
    placed: list[tuple[list[dict[str, Any]], list[str]]] = []
    used: dict[str, str] = {}  # per agent: the last model call an earlier attempt's answer took
    for raw in transcripts:
        shared, previous = 0, ""
        for messages, anchors in placed:
            count = _new_part(raw.records, [messages])
            if count > shared:
                shared, previous = count, anchors[count - 1]
        times = sorted(t for t in answered.get(raw.source.agent, []) if t > used.get(raw.source.agent, ""))
        if shared < len(raw.records):  # its new messages come after the agent's earlier attempts
            previous = max(previous, used.get(raw.source.agent, ""))
        anchors = [previous] * shared
        for index, message in enumerate(raw.records[shared:], start=shared):
            entry = message_entry(raw.source.agent, message)
            anchor = previous
            if entry["role"] == "assistant":
                later = [t for t in times if t >= previous]
                if later:
                    anchor = later[0]
                    times.remove(anchor)
            elif entry["role"] == "tool" and entry.get("tool_call_id") in done_at:
                anchor = max(previous, done_at[entry["tool_call_id"]])
            entry["at"] = anchor or None
            anchors.append(anchor)
            previous = anchor
            # An earlier attempt's transcript numbers its messages from 0 too: its name keeps them apart.
            where: int | str = index if set_aside_attempt(raw.source.path.name) is None else \
                f"{raw.source.path.name}#{index}"
            keyed.append((anchor, 1, seq, ("message", raw.source.agent, where), entry))
            seq += 1
        if _attempt_of(raw.source.path.name) < ATTEMPT_LAST and anchors:
            used[raw.source.agent] = max(used.get(raw.source.agent, ""), max(anchors))
        placed.append((raw.records, anchors))
    return [(key, entry) for *_, key, entry in sorted(keyed, key=lambda k: k[:3])]


def overview(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What `task show` adds from the records: the models that answered, the files written (as each
    agent's scratch-relative path) and the cost so far, unpriced calls counted apart (pure)."""
    models: dict[tuple[Any, Any], int] = {}
    calls = []
    for entry in entries:
        if entry["kind"] == "model":
            calls.append((entry["agent"], entry))
            if entry["outcome"] == "ok":
                key = (entry["provider"], entry["model"])
                models[key] = models.get(key, 0) + 1
    started = {(e["agent"], e["call_id"]): e.get("args") for e in entries
               if e["kind"] == "tool" and e["status"] == "started"}
    files: list[dict[str, Any]] = []
    for entry in entries:
        if entry["kind"] != "tool" or entry["status"] != "done" or entry.get("outcome") != "ok" \
                or entry["tool"] not in WRITING_TOOLS:
            continue
        args = started.get((entry["agent"], entry["call_id"]))
        path = args.get("path") if isinstance(args, dict) else None
        item = {"agent": entry["agent"], "path": path, "tool": entry["tool"]}
        if isinstance(path, str) and item not in files:
            files.append(item)
    total = summarize(calls)["total"]
    cost = {key: total[key] for key in ("calls", "failed_calls", "tokens_in", "tokens_out", "cost_usd",
                                        "unpriced_calls", "estimated_calls")}
    return {"models": [{"provider": p, "model": m, "calls": n} for (p, m), n in models.items()],
            "files": files, "cost": cost}
