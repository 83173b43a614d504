"""`runtime: hermes`: an agent that works each task it claims with Hermes Agent's own CLI, in its
one-shot mode (`hermes -z PROMPT --usage-file F`), against a Hermes profile's own config.

The agent process stays hermes-sup's (claims, heartbeats, restarts, cancel: as for `runtime:
command`, agents/clirun.py, whose confined run this uses). Hermes' board tools reach this board
through a bridge: before the run, Hermes' own code (its venv's Python, hermes_cli.kanban_db) makes a
one-task kanban.db in the task's folder holding this task, claimed, and the CLI is pointed at it
with the variables Hermes' dispatcher gives its workers (HERMES_KANBAN_TASK, _RUN_ID, _CLAIM_LOCK,
_DB), so its kanban_show, kanban_comment, kanban_block and kanban_complete work as under Hermes'
dispatcher. After the run that file is read (read-only, bounded: the CLI could have written
anything there): a block becomes this task blocked on its question, a completion its summary, the
comments this task's comments. The usage file's tokens and cost become one record of the agent's
LLM-call log, so `usage` counts a Hermes run, and with telemetry on one model-call span marked as
the run's sum (agents/spans.py): hermes-sup learns nothing finer of its model calls. Its tool calls
are read from Hermes' session store after the run, for their spans (agents/hermestools.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..kanban.task import now_iso
from . import sandbox
from .budget import price
from .clirun import DEFAULT_MAX_RUNTIME, REASON_LINES, Run, Verdict, given_env, run, workdir_for
from .logline import say
from .tools import ToolContext

BRIDGE_DB = ".hermes-kanban.db"  # in the task's folder
BRIDGE_INPUT = ".hermes-kanban-task.json"
USAGE_FILE = ".hermes-usage.json"
MAX_USAGE_BYTES = 64 * 1024
MAX_BRIDGE_BYTES = 64 << 20
MAX_VALUE = 1 << 20
MAX_COMMENTS = 200
MAX_QUESTION = 4000  # characters of a block's reason, the task's question
BRIDGE_SECONDS = 60.0
READ_SECONDS = 5.0
CLAIMER = "hermes-sup"

# Run by the Hermes venv's own Python: its kanban code makes the board file, so the schema is
# always the one the CLI expects, whatever its version.
SETUP = """\
import json, sys
from pathlib import Path
from hermes_cli import kanban_db as kb
spec = json.loads(Path(sys.argv[1]).read_text())
conn = kb.connect(db_path=Path(spec["db"]))
tid = kb.create_task(conn, title=spec["title"], body=spec["body"], assignee=spec["assignee"], created_by="hermes-sup")
task = kb.claim_task(conn, tid, claimer=spec["claimer"])
print(json.dumps({"task": tid, "run": task.current_run_id, "lock": task.claim_lock}) if task else "{}")
"""


@dataclass(frozen=True)
class HermesRunResult:
    """What a Hermes run makes of its task: the verdict, the comments it wrote on Hermes' board, and
    its usage as an LLM-call record (None when the CLI wrote none)."""
    verdict: Verdict
    comments: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    # Where the run's tool calls can be read (agents/hermestools.py): the profile folder, the
    # session id its usage file reported (anything, as written), the run's start and end (epoch s).
    profile_dir: Path | None = None
    session: Any = None
    window: tuple[float, float] | None = None


def program_of(runtime: Mapping[str, Any], path: str | None) -> str | None:
    """The Hermes CLI to run: `program` as given when it is a path, else found on PATH."""
    program = str(runtime.get("program") or "hermes")
    return program if os.sep in program else shutil.which(program, path=path)


def python_of(program: str) -> str | None:
    """The Python a console script runs with (its `#!` line), which has Hermes' packages; None when
    the program is no Python script (a wrapper: then there is no bridge). Read without blocking: a
    FIFO in its place would hold the agent."""
    first = _read_regular(os.path.realpath(program), 4096).split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return None
    interpreter = first[2:].decode("utf-8", "replace").strip().split(" ")[0]
    return interpreter if "python" in os.path.basename(interpreter) and os.path.isabs(interpreter) else None


def venv_of(program: str) -> str:
    """The folder to show the confined CLI read-only: the venv (or prefix) its program is in."""
    return os.path.dirname(os.path.dirname(os.path.realpath(program)))


def judge(ran: Run, usage: dict[str, Any] | None, board: dict[str, Any] | None, *, max_runtime: float) -> Verdict:
    """What a Hermes run makes of its task (pure). In one-shot mode Hermes exits 0 even when the model
    failed: its usage file's `failed` says so."""
    if ran.stopped:
        return Verdict("interrupted", {})
    tail = "\n".join(ran.output.rstrip().splitlines()[-REASON_LINES:])
    if ran.timed_out:
        return Verdict("failed", {}, f"hermes ran longer than max_runtime ({max_runtime:g} s) and was ended"
                                     + (f"; its last output:\n{tail}" if tail else ""))
    if ran.returncode != 0:
        return Verdict("failed", {}, f"hermes exited with status {ran.returncode}"
                                     + (f"; its last output:\n{tail}" if tail else " and printed nothing"))
    status = (board or {}).get("status")
    if status == "blocked":
        question = str((board or {}).get("reason") or "").strip() or "(Hermes blocked the task without a reason)"
        return Verdict("blocked", {}, question)
    if status == "done":
        summary = (board or {}).get("summary") or (board or {}).get("result") or ran.output.strip()
        return Verdict("done", {"answer": str(summary), "output": ran.output, "seconds": ran.seconds})
    if usage is not None and (usage.get("failed") is True or usage.get("completed") is False):
        failure = usage.get("failure") if isinstance(usage.get("failure"), str) else tail
        return Verdict("failed", {}, "hermes did not complete the task (its usage file says failed)"
                                     + (f": {failure[-2000:]}" if failure else ""))
    if not ran.output.strip():
        return Verdict("failed", {}, "hermes exited 0 and printed nothing")
    return Verdict("done", {"answer": ran.output, "seconds": ran.seconds})


def usage_record(task_id: str, profile: str, usage: Mapping[str, Any], seconds: float, failed: bool,
                 prices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The LLM-call log's record of one Hermes run, all its model calls in one (pure): tokens as Hermes
    counted them; its cost by hermes.yaml's `prices` when they name its model, else Hermes' own
    estimate when it had one, else unpriced (never free)."""
    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12 else 0

    cost = usage.get("estimated_cost_usd")
    known = usage.get("cost_status") not in (None, "unknown") and isinstance(cost, (int, float)) \
        and not isinstance(cost, bool) and 0 <= cost < 1e6
    model = str(usage.get("model") or "-")[:200]
    tokens = Tokens(count("input_tokens"), count("output_tokens"), count("cache_read_tokens"))
    ours = price(prices or {}, model, tokens)
    return {"at": now_iso(), "task": task_id, "provider": f"hermes:{profile}", "model": model,
            "outcome": "error" if failed else "ok", "latency_s": seconds,
            "error": "the Hermes run failed" if failed else None, "tokens_in": tokens.input,
            "tokens_out": tokens.output, "tokens_cached": tokens.cached,
            "cost_usd": ours if ours is not None else float(cost) if known else None,
            "calls": count("api_calls"), "runtime": "hermes"}


@dataclass(frozen=True)
class Tokens:
    """A run's tokens, as budget.price reads a call's usage."""
    input: int
    output: int
    cached: int


def _read_regular(path: str | Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, b"" for anything else: never through a link, never
    blocking on a FIFO."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: Path, limit: int) -> dict[str, Any] | None:
    """A small JSON object the CLI wrote, or None: never through a link, never a FIFO, bounded."""
    data = _read_regular(path, limit + 1)
    if not data or len(data) > limit:
        return None
    try:
        value = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def open_hostile(path: Path, tables: Sequence[str], *, seconds: float = READ_SECONDS,
                 max_value: int = MAX_VALUE, readonly: bool = True) -> sqlite3.Connection:
    """A read-only connection to an SQLite file someone else wrote: `tables` must be tables (a view
    runs a query of the file's choosing, endless if it likes), reads stop after `seconds`, and no
    value may be larger than `max_value` (a generated column can make one of a gigabyte).
    sqlite3.Error (or ValueError naming the table that is no table) when it is not so."""
    # A private copy (private_copy) is opened read-write, so that SQLite may read its -wal.
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode={'ro' if readonly else 'rw'}", uri=True, timeout=5)
    try:
        deadline = time.monotonic() + seconds
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value)
        marks = ",".join("?" * len(tables))
        kinds = dict(conn.execute(f"SELECT lower(name), type FROM sqlite_master WHERE lower(name) IN ({marks})",
                                  [t.lower() for t in tables]).fetchall())
        for name in tables:
            if kinds.get(name.lower(), "table") != "table":
                raise ValueError(f"{name} is a {kinds[name.lower()]}, not a table")
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def private_copy(path: Path, limit: int) -> Iterator[Path | None]:
    """A copy of an SQLite file someone else may write (and of its -wal, where a killed writer left
    its last changes), in a folder of our own, for as long as it is read; None when the file is no
    regular file within `limit`. SQLite is never pointed at theirs: a FIFO at its -journal would
    block the reader in open(), and a file swapped mid-read would be read half old, half new."""
    with tempfile.TemporaryDirectory(prefix="hermes-sup-sqlite-") as folder:
        copy = Path(folder) / "copy.db"
        if not _copy_regular(path, copy, limit):
            yield None
            return
        if not _copy_regular(Path(f"{path}-wal"), Path(f"{copy}-wal"), limit):
            Path(f"{copy}-wal").unlink(missing_ok=True)
        yield copy


def _copy_regular(source: Path, target: Path, limit: int) -> bool:
    """Copy a regular file of at most `limit` bytes (never through a link, never from a FIFO) to
    `target`, in pieces; False when it is not one."""
    import stat

    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        copied = 0
        with open(target, "wb") as out:
            while chunk := os.read(fd, 1 << 20):
                copied += len(chunk)
                if copied > limit:
                    return False
                out.write(chunk)
        return copied > 0
    finally:
        os.close(fd)


def read_bridge(path: Path, task_id: str, run_id: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """(the task's state on the bridge board: status, reason, summary, result; the worker's comments)
    or (None, []) when the file cannot be read as one."""
    with private_copy(path, MAX_BRIDGE_BYTES) as copy:
        return _read_bridge(copy, task_id, run_id) if copy is not None else (None, [])


def _read_bridge(path: Path, task_id: str, run_id: Any) -> tuple[dict[str, Any] | None, list[str]]:
    try:
        conn = open_hostile(path, ("tasks", "task_runs", "task_comments", "task_events"), readonly=False)
    except (OSError, sqlite3.Error, ValueError):
        return None, []
    try:
        row = conn.execute("SELECT status, result FROM tasks WHERE id = ?", (task_id,)).fetchone()
        runs = conn.execute("SELECT outcome, summary FROM task_runs WHERE task_id = ? AND id = ?",
                            (task_id, run_id)).fetchone()
        events = conn.execute("SELECT payload FROM task_events WHERE task_id = ? AND kind = 'blocked' "
                              "ORDER BY id DESC LIMIT 1", (task_id,)).fetchone()
        comments = conn.execute("SELECT body FROM task_comments WHERE task_id = ? ORDER BY id LIMIT ?",
                                (task_id, MAX_COMMENTS)).fetchall()
        created = conn.execute("SELECT title FROM tasks WHERE id != ? ORDER BY rowid LIMIT 21", (task_id,)).fetchall()
    except sqlite3.Error:
        return None, []
    finally:
        conn.close()
    if row is None:
        return None, []
    reason = None
    if events and isinstance(events[0], str):
        try:
            payload = json.loads(events[0])
            reason = payload.get("reason") if isinstance(payload, dict) else None
        except ValueError:
            reason = None
    summary = runs[1] if runs and isinstance(runs[1], str) else None
    state = {"status": str(row[0])[:40], "result": row[1] if isinstance(row[1], str) else None,
             "summary": summary, "reason": (reason if isinstance(reason, str) else summary or "")[:MAX_QUESTION]}
    said = [str(body)[:8000] for (body,) in comments if isinstance(body, str) and body.strip()]
    if created:  # kanban_create on the one-task board: said, never dropped without a word
        titles = [str(title)[:200] for (title,) in created[:20]]
        said.append(f"Hermes created {'more than 20' if len(created) > 20 else len(created)} task(s) on its own "
                    f"board, not carried to this one (add them with hermes-sup task add): " + "; ".join(titles))
    return state, said


def work(ctx: ToolContext, prompt: str, capabilities: Sequence[str],
         prices: Mapping[str, Any] | None = None) -> HermesRunResult:
    """Run Hermes' CLI for the task in `ctx` (`ctx.settings["runtime"]`, kind hermes) and judge it."""
    from .files import root_of

    runtime = ctx.settings.get("runtime") or {}
    max_runtime = float(runtime.get("max_runtime") or DEFAULT_MAX_RUNTIME)
    task = ctx.task or {}
    task_id = str(task.get("id"))
    own = root_of(ctx)
    program = program_of(runtime, os.environ.get("PATH"))
    if program is None:
        return HermesRunResult(Verdict("failed", {}, f"the Hermes CLI {runtime.get('program') or 'hermes'!r} is "
                                                     "not on PATH; install hermes-agent, or name it with program: in "
                                                     "hermes.yaml"))
    profile_dir = Path(os.path.realpath(str(runtime["profile_dir"])))
    workdir = workdir_for(ctx)
    shown, writable = [venv_of(program)], [profile_dir]
    inside = [p for p in (os.path.realpath(program), venv_of(program)) if Path(p) == profile_dir
              or profile_dir in Path(p).parents]
    if inside:  # a run could rewrite the code every profile's runs use (checked at load too; PATH may differ)
        return HermesRunResult(Verdict("failed", {}, f"the Hermes CLI ({inside[0]}) is inside the profile folder "
                                                     f"{profile_dir}, which its runs may write: install it elsewhere, "
                                                     "or name it with program"))
    # The home's own profile (`default`) holds the others: its runs do not see them. Landlock cannot
    # take a folder back from inside a writable one, so there such a run is refused.
    conceal = [profile_dir / "profiles"] if (profile_dir / "profiles").is_dir() else []
    if conceal and sandbox.how(str(ctx.settings.get("sandbox") or "auto"))[0] not in ("bubblewrap", "none"):
        return HermesRunResult(Verdict("failed", {}, f"the profile folder {profile_dir} holds other profiles "
                                                     "(profiles/), which this machine's sandbox (Landlock) cannot keep "
                                                     "from its runs: use a profile of its own (hermes profile create), "
                                                     "or bubblewrap"))
    env = {**given_env(runtime), "HERMES_HOME": str(profile_dir), "HERMES_PROFILE": str(runtime.get("profile")),
           "HERMES_SUP_TASK_ID": task_id, "TERMINAL_CWD": str(workdir),
           # No pip installs at run time (a confined run could not make them, and they are no task's).
           "HERMES_DISABLE_LAZY_INSTALLS": "1"}
    own.mkdir(parents=True, exist_ok=True, mode=0o700)
    usage_path, db = own / USAGE_FILE, own / BRIDGE_DB
    for stale in (usage_path, db, *(Path(f"{db}-{end}") for end in ("wal", "shm", "journal")), own / BRIDGE_INPUT):
        stale.unlink(missing_ok=True)  # an earlier attempt's are not this one's
    bridge = _bridge(ctx, program, db, str(task.get("title") or task_id), prompt, str(runtime.get("profile")),
                     capabilities, shown, writable, conceal)
    if ctx.stop.is_set():
        return HermesRunResult(Verdict("interrupted", {}))
    if bridge is None:
        say(ctx.agent, f"{task_id}: Hermes' board file could not be made with {program}'s Python; the run goes "
                       "without its kanban tools (its answer is the result)", error=True)
    else:
        # Hermes' board tools take the task's id as an argument (its dispatcher's prompt is "work kanban
        # task <id>"): the model is told it.
        prompt += (f"\n\nOn your kanban board this task is {bridge['task']}: comment on it there, and end with "
                   "kanban_complete, or kanban_block with your question when you need a person's answer.")
        env.update({"HERMES_KANBAN_DB": str(db), "HERMES_KANBAN_TASK": bridge["task"],
                    "HERMES_KANBAN_RUN_ID": str(bridge["run"]), "HERMES_KANBAN_CLAIM_LOCK": str(bridge["lock"]),
                    "HERMES_KANBAN_WORKSPACE": str(workdir)})
    argv = [program, "-z", prompt, "--usage-file", str(usage_path)]
    began = time.time()
    ran = run(ctx, argv, env, capabilities, max_runtime, shown=shown, writable=writable, conceal=conceal)
    window = (began, time.time())
    if ran.problem:
        return HermesRunResult(Verdict("failed", {}, ran.problem))
    usage = read_json(usage_path, MAX_USAGE_BYTES)
    state, comments = read_bridge(db, bridge["task"], bridge["run"]) if bridge else (None, [])
    verdict = judge(ran, usage, state, max_runtime=max_runtime)
    record = None
    if usage is not None and not ran.stopped:
        record = usage_record(task_id, str(runtime.get("profile")), usage, ran.seconds, verdict.kind == "failed",
                              prices)
    return HermesRunResult(verdict, comments, record, profile_dir, (usage or {}).get("session_id"), window)


def _bridge(ctx: ToolContext, program: str, db: Path, title: str, body: str, profile: str,
            capabilities: Sequence[str], shown: list[str], writable: list[Path], conceal: list[Path]
            ) -> dict[str, Any] | None:
    """The one-task board file made by Hermes' own code, as {task, run, lock}, or None when this CLI
    has no Python of its own to make it with (the run then goes without Hermes' board tools)."""
    from .files import root_of

    python = python_of(program)
    if python is None:
        return None
    spec = root_of(ctx) / BRIDGE_INPUT
    spec.write_text(json.dumps({"db": str(db), "title": title[:500], "body": body, "assignee": profile,
                                "claimer": CLAIMER}), encoding="utf-8")
    made = run(ctx, [python, "-I", "-c", SETUP, str(spec)], {"HERMES_HOME": str(writable[0])}, capabilities,
               BRIDGE_SECONDS, shown=shown, writable=writable, conceal=conceal)
    spec.unlink(missing_ok=True)
    if made.returncode != 0 or made.stopped:
        return None
    try:
        answer = json.loads(made.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("task"), str) or answer.get("run") is None:
        return None
    return answer
