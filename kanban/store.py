"""The protocol every board backend implements, verb by verb: what it does, what is atomic, what it returns and raises.

The CLI, the supervisor, doctor, the agents and delegation use a board only through these verbs,
obtained from `kanban.backends.open_board`. The filesystem board (`kanban.board.Board`) is the
first backend; a shared one (PostgreSQL) implements the same verbs with the same semantics
(CONTRACT.md section 3) and reuses the pure rules of `kanban.rules`.

Errors are the exceptions of `kanban.errors` (all `BoardError`) and `kanban.task.TaskError` (a
field or text a person or agent gave that is not valid). A backend never raises anything else for
bad input: an unreadable task is moved aside (`rejected/`) and named in `problems`, never guessed at.

Task documents are plain JSON-able dicts (schema: `kanban.task`); every verb that changes a task
returns its new document. A *transition* (a status change) is atomic and durable when the verb
returns: it is in exactly one status, its event is in the log, and a process killed at any moment
leaves a state that the next verb of any process finishes or discards. Comments, lease renewals and
waiting notes are not transitions: they write no event.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # named in signatures only: a command that opens no board need not import them
    from .events import CursorRead
    from .ingest import IngestReport
    from .reads import Listing
    from .watch import ChangeSignal

TaskDoc = dict[str, Any]
Check = tuple[str, str, str]  # (what, level: ok|info|warn|error, detail), as doctor prints it


@runtime_checkable
class BoardStore(Protocol):
    # -- what every backend exposes ------------------------------------------------------------

    root: Path
    """The board's local folder on this host: `inbox/` (drops) and `rejected/` (what was set aside,
    each beside its `.error.txt`) are always local files, whatever holds the tasks."""

    problems: list[str]
    """Things found wrong and repaired while this board was open (a status folder recreated, a
    damaged task moved aside), for doctor; append-only."""

    signal: ChangeSignal
    """Bumped whenever the board may have changed (once `start_watching` ran): wait on it with
    `signal.wait(seen_generation, timeout)` instead of polling."""

    @property
    def watch_mode(self) -> str:
        """How changes are noticed: "inotify" (at once), "polling" (every few seconds) or "off"."""
        ...

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the board's resources (watcher thread, log handle, lock file). Idempotent."""
        ...

    def __enter__(self) -> BoardStore: ...

    def __exit__(self, *exc: object) -> None: ...

    def health(self) -> list[Check]:
        """The backend's own checks for doctor (storage type, change notification); starts watching."""
        ...

    # -- reads (never block on a writer for long; never change a task) --------------------------

    def get(self, task_id: str) -> TaskDoc:
        """The task's current document. Raises TaskNotFound (also for a string that is no valid id:
        ids from tools or the command line may be hostile), BoardError if its document is damaged."""
        ...

    def list(self, status: str | None = None) -> Listing:
        """Every task (or those of one status) in claim order within each status, each exactly once,
        as of one moment; `Listing.damaged` names unreadable ones (see `quarantine_damaged`).
        Raises BoardError for an unknown status."""
        ...

    def list_fields(self, status: str | None = None) -> Listing:
        """`list`, each task as `kanban.reads.listed_fields` of its document: the fields a board
        listing shows and judges it by, its history as the number of its entries; what `board`
        reads of a board of 10,000 tasks (a backend may keep these apart to read less)."""
        ...

    def counts(self) -> dict[str, int]:
        """How many tasks each status holds (every status present, 0 included), each counted once."""
        ...

    def task_ids(self) -> builtins.list[str]:
        """The id of every task on the board, in every status, each once and sorted, as of one moment:
        what naming a task by a prefix of its id is resolved against (`kanban.prefix`). Names only,
        no document read, so a task whose document is damaged is among them."""
        ...

    def quarantine_damaged(self, damaged: Iterable[dict[str, str]]) -> builtins.list[str]:
        """Re-check the damaged entries a `list` found, atomically per task; move the still damaged
        aside to rejected/. Returns the names they were moved to."""
        ...

    # -- adding and changing by hand -------------------------------------------------------------

    def add(self, fields: dict[str, Any], *, by: str = "cli") -> TaskDoc:
        """Validate `fields` as a dropped file's and add the task (atomically, with its event).
        Raises TaskError for invalid fields, an id already taken, or a dependency cycle."""
        ...

    def move(self, task_id: str, to: str, *, by: str = "cli", note: str = "") -> TaskDoc:
        """Move a task to status `to` by hand (not doing: only a claim enters doing), revoking any
        claim (its holder's token stops working) and any open question; to todo resets attempts.
        One atomic transition. Raises TaskNotFound, InvalidTransition (unknown or same status)."""
        ...

    def cancel(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        """`move` to cancelled, also of a held task (its holder learns it at its next verb: ClaimLost).
        Raises InvalidTransition if it is done or cancelled already."""
        ...

    def retry(self, task_id: str, *, by: str = "cli") -> TaskDoc:
        """A blocked, failed or cancelled task back to todo with attempts reset. InvalidTransition otherwise."""
        ...

    def comment(self, task_id: str, text: str, *, by: str = "cli", wait: float = 5.0) -> TaskDoc:
        """Append a comment (any status; not a transition: no event, status and updated_at kept).
        Atomic with respect to transitions: one in flight is waited out for `wait` seconds, then
        InvalidTransition. TaskError for text that is not a string, too large, or no room left."""
        ...

    def answer(self, task_id: str, text: str, *, by: str = "cli") -> TaskDoc:
        """Answer the question a blocked task asked: it goes to todo with the answer among its
        comments (one transition). InvalidTransition if it waits on no question or text is empty."""
        ...

    # -- claims: the holder's verbs are fenced by the claim token ---------------------------------

    def claim(self, agent: str, *, roles: Iterable[str] = (), lease: float | None = None,
              pid: int | None = None, steps_only: bool = False, assigned_only: bool = False) -> TaskDoc | None:
        """Atomically take the best eligible todo task (`kanban.rules`: role, assignee, dependencies
        done, priority then age then id) for `agent`, or None. Exactly one claimer gets a task; the
        returned document's `claim.token` is new and larger than any earlier token of that task."""
        ...

    def renew(self, task_id: str, token: int, lease: float | None = None) -> TaskDoc:
        """Extend the holder's lease (not a transition). Raises ClaimLost unless `token` holds it."""
        ...

    def complete(self, task_id: str, token: int, result: Any = None) -> TaskDoc:
        """The held task to done with `result`. Raises ClaimLost unless `token` holds it (a stale
        holder's write is rejected, never applied)."""
        ...

    def fail(self, task_id: str, token: int, error: str, *, permanent: bool = False) -> TaskDoc:
        """A failed attempt: to todo, or to failed once attempts reached max_attempts (or at once
        when `permanent`). ClaimLost unless `token` holds it."""
        ...

    def block(self, task_id: str, token: int, reason: str, *, question: str | None = None) -> TaskDoc:
        """The held task to blocked; with a `question` it waits for `answer` and the attempt is given
        back. ClaimLost unless `token` holds it."""
        ...

    def release(self, task_id: str, token: int, note: str = "released", *, count_attempt: bool = False) -> TaskDoc:
        """The held task back to todo; the attempt is given back unless `count_attempt`. ClaimLost
        unless `token` holds it."""
        ...

    def mark_waiting(self, reason: str | None, *, needs_llm: bool = True, agent: str | None = None,
                     roles: Iterable[str] = ()) -> int:
        """Note on todo tasks (those `agent` could claim) why nobody works them, or clear the note with
        None. Not a transition. Returns how many documents changed."""
        ...

    def wait_for_work(self, agent: str, *, roles: Iterable[str] = (), timeout: float | None = None,
                      lease: float | None = None, stop: threading.Event | None = None,
                      steps_only: bool = False, assigned_only: bool = False, ingest: bool = True) -> TaskDoc | None:
        """`claim`, waiting for a task to become eligible (ingesting drops, unless not `ingest`, and
        recovering dead claims meanwhile, so no other process is needed); None on timeout or once
        `stop` is set. A supervisor's agents pass ingest=False: it ingests for them (`wait_for_drops`)."""
        ...

    def wake(self) -> None:
        """Wake every thread of this process waiting in `wait_for_work` or on `signal`."""
        ...

    def start_watching(self) -> None:
        """Start noticing changes (bumping `signal`); idempotent."""
        ...

    def hand_over_watch(self, give: Callable[[int], object]) -> None:
        """Give the descriptor of each inotify instance the board watches with (the current one at
        once) to `give`: an agent passes it to its supervisor to hold, so that its death is not
        slowed by the kernel's teardown of it. A backend that watches no files gives nothing."""
        ...

    def task_journal(self, task_id: str, token: int, agent: str, workdir: Path) -> Any:
        """Where `agent`, holding the task with `token`, keeps the task's journal (an
        `kanban.journal.TaskJournal`: its transcript, tool calls and model calls), and reads those
        of the agents that held it before. The file board: files in `workdir`, the agent's folder,
        seen by this host only. A shared backend keeps it where any host resuming the task reads
        it, every write fenced by `token` (ClaimLost once another claim holds the task)."""
        ...

    def journal_rows(self, task_id: str | None, kind: str, *, agents: Iterable[str] | None = None,
                     name: str | None = None, after: int = 0) -> builtins.list[dict[str, Any]] | None:
        """The journal rows this board keeps of a task (None: of every task), for readers on any host
        (`task log`, `usage`): those of one `kind` (message, tool, llm), of `agents` (None: every
        agent's), for messages of one transcript `name`, and with a seq above `after` (a follower
        reads only what is new: seqs grow in the order written; see `journal_marks` for what else
        may have changed), in the order written; each {seq, fence,
        task_id, kind, agent, name, entry}, `entry` as written (a reader checks it is a record).
        Reads are not fenced. None when the board keeps no journal rows at all (the file board: the
        journal is the agents' files, read there), so a reader tells "kept elsewhere" from "nothing yet"."""
        ...

    def journal_marks(self, task_id: str) -> builtins.list[dict[str, Any]] | None:
        """What the task's journal rows are now, without reading them: per kind, agent and transcript
        name, {kind, agent, name, rows (how many), last (the newest seq)}, in one read. A follower
        that holds rows whose marks are these holds them all; any other change (a transcript set
        aside under another name, a row committed late with a smaller seq, rows pruned) changes
        them. None when the board keeps no journal rows (the file board)."""
        ...

    def journal_prune(self, task_ids: Iterable[str], *, dry_run: bool = False) -> dict[str, int] | None:
        """Remove the journal rows this board keeps of the tasks `task_ids` (their transcripts and tool
        calls) that are finished (done, failed, cancelled) when the rows go, atomically: a task a
        `retry` took back meanwhile keeps its rows. The model-call rows stay (what `usage` counts, as
        the file board's `llm_calls.jsonl` stays), and so do the task documents. Returns {tasks, rows,
        bytes} removed (`dry_run`: that would be, nothing removed). None when the board keeps no
        journal rows (the file board: `prune` removes the agents' files itself)."""
        ...

    # -- maintenance -----------------------------------------------------------------------------

    def ingest(self) -> IngestReport:
        """Turn finished drops in inbox/ into tasks, each atomically and at most once; a drop that is
        no valid task goes to rejected/ beside its reason. Never raises for a drop's content."""
        ...

    def wait_for_drops(self, timeout: float) -> None:
        """Return once a drop may have arrived in this host's inbox/ since the last return (at once
        the first time), or after `timeout` seconds, or at `wake`: an ingester's sleep between
        `ingest` passes. Wakes on the drops' arrival alone, not on the board's other changes."""
        ...

    def recover(self, *, sweep: bool = True) -> builtins.list[dict[str, str]]:
        """Return held tasks whose holder died or whose lease ran out to todo (or failed once
        max_attempts is used up), finish interrupted transitions, and with `sweep` remove dead
        writers' leftovers. Returns {task, to, reason} per recovered task."""
        ...

    # -- the event log, read by cursor -----------------------------------------------------------

    def events_since(self, cursor: int, *, max_events: int = 10_000, inode: int | None = None) -> CursorRead:
        """The complete events after `cursor` (0: from the start), each with the cursor just after
        it; no event is missed or doubled by a reader that passes each read's `cursor` to the next.
        A log replaced since (`inode` differs) is read from its start (`restarted`)."""
        ...

    def events_end(self) -> int:
        """The cursor after the last complete event: a reader starting now sees only later events."""
        ...

    def events_marker(self) -> Any:
        """A cheap look at the stream for a reader that looks often (the dashboard, 10 times a second):
        a value that differs from an earlier one whenever the stream may have grown or been replaced
        since (it may differ without that too, never the other way round), read without any lock and
        in one read (the file board: its log's inode, size and time; PostgreSQL: the cursor sequence's
        last value, in one statement). Read it before `events_end`: while it stays equal, so does
        that. Raises BoardError or OSError when it cannot be read."""
        ...

    def check_cursor(self, cursor: int) -> None:
        """Raise events.CursorError unless `cursor` is one this board's log can continue from."""
        ...

    def announce_host(self, agents: Callable[[], builtins.list[dict[str, Any]]] | None = None) -> None:
        """Say, from now until close(), that this host's supervisor is alive, so that other hosts
        take its tasks back only once it falls silent (PostgreSQL: the hosts row heartbeats from a
        thread, every sixth of host_timeout, by the database's clock), and with each heartbeat what
        `agents()` says of this host's agents (the dashboard's agents panel: name, pid, state,
        restarts, heartbeat age, task, rss, last exit; None or an error: nothing said). Called by the
        supervisor, never by an agent. A single-host backend does nothing."""
        ...

    def host_agents(self) -> builtins.list[dict[str, Any]]:
        """Every host of a shared board as its last heartbeat left it: {host, heartbeat (ISO, the
        board's clock), age (seconds since it), silent (heartbeat older than host_timeout), agents
        (what its announce_host published, or None)}, by host. A single-host backend returns []: its
        agents are its workspace's own (runs/supervisor.json). Other hosts wrote it: judge it."""
        ...

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold every change of the board off while the block runs (the file board's lock), for a
        maintenance pass that must see finished tasks stay finished (`prune`). The team waits
        meanwhile: keep the block short (renames, not deletions)."""
        ...

    def append_event(self, record: dict[str, Any]) -> None:
        """Append one event that moves no task (the supervisor's, an agent's, an alert's; its `kind`
        says which) to the stream, whole and after every event already there, so its cursor is
        greater than theirs. Atomic: a reader sees all of it or none. Raises OSError when it cannot
        be stored (a full disk): the caller decides what that costs."""
        ...

    def watch_events(self) -> Callable[[], None] | None:
        """From now on bump `signal` at each append to the stream, also those that move no task, until
        the returned function is called. None where the backend cannot watch: callers then read
        the stream on a timer."""
        ...
