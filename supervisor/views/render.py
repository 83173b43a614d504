"""Terminal pictures of the board and of tasks (rich), and the JSON shapes the CLI prints.

Everything a user, an agent or a model wrote (titles, bodies, results, names, log lines, paths,
error messages) reaches the terminal only through `visible` and `literal`: never as rich markup
(a title `[/var/tmp]` would raise MarkupError, `[link=...]` would forge a hyperlink), never
with its control characters (ESC, CSI, OSC, other C0/C1 controls, bidi overrides), which are
shown as escapes instead.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ...kanban import STATUSES
from ...kanban.why import Waiting

# Every C0 control but tab and newline, DEL, every C1 control (U+009B is a CSI by itself), and the
# bidirectional overrides and isolates that make text read differently from what it is.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {10: "\\n", 13: "\\r", 9: "\\t"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(value: object, *, one_line: bool = False) -> str:
    """`value` as text whose control characters are shown as escapes (`\\x1b`, `\\u202e`); with
    `one_line`, newlines and tabs too (pure)."""
    text = value if isinstance(value, str) else str(value)
    return (_CONTROLS_ONE_LINE if one_line else _CONTROLS).sub(_escape, text)


def literal(value: object, style: str = "", *, one_line: bool = False, **options: Any) -> Text:
    """User text as a rich Text: printed exactly (no markup, no emoji codes), controls made visible."""
    return Text(visible(value, one_line=one_line), style=style, **options)


STYLE = {"todo": "cyan", "doing": "yellow", "blocked": "magenta", "done": "green", "failed": "red",
         "cancelled": "dim"}
TOP_PER_COLUMN = 8


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The fields of a task a board listing needs."""
    claim = doc.get("claim") or {}
    return {
        "id": doc["id"], "title": doc["title"], "status": doc["status"], "priority": doc.get("priority", 0),
        "assignee": doc.get("assignee"), "role": doc.get("role"), "depends_on": doc.get("depends_on", []),
        "attempts": doc.get("attempts", 0), "max_attempts": doc.get("max_attempts"),
        "agent": claim.get("agent"), "error": doc.get("error"), "waiting": doc.get("waiting"),
        "updated_at": doc.get("updated_at"),
    }


def top_of_columns(tasks: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The first `limit` tasks of each status of a listing, in its order (pure): what the picture shows."""
    taken: dict[str, int] = {}
    shown = []
    for doc in tasks:
        if taken.get(doc["status"], 0) < limit:
            taken[doc["status"]] = taken.get(doc["status"], 0) + 1
            shown.append(doc)
    return shown


def board_document(tasks: list[dict[str, Any]], damaged: list[dict[str, str]],
                   ingest: dict[str, Any] | None = None, reasons: Mapping[str, Waiting] | None = None,
                   warnings: list[str] | None = None,
                   rejected: tuple[list[dict[str, str]], int] | None = None, *,
                   limit: int | None = None) -> dict[str, Any]:
    """The board as `board --json` prints it. `reasons` (by id) say why a todo or blocked task waits:
    they replace the note an agent left on it; `warnings` are about tasks just ingested; `rejected` is
    the newest notes of rejected/ and how many it holds. With `limit`, each column holds only its
    first `limit` tasks (the counts stay whole): all the picture shows, and `reasons` need cover no more."""
    by_status: dict[str, list[dict[str, Any]]] = {status: [] for status in STATUSES}
    for doc in tasks:
        by_status[doc["status"]].append(doc)
    done = {doc["id"] for doc in by_status["done"]}
    columns: dict[str, list[dict[str, Any]]] = {}
    for status, docs in by_status.items():
        items = columns[status] = []
        for doc in docs if limit is None else docs[:limit]:
            item = summary(doc)
            if reasons is not None:
                why = reasons.get(doc["id"])
                item["waiting"], item["waiting_kind"] = (why.text, why.kind) if why else (None, None)
            if status in ("todo", "blocked"):
                item["needs"] = [dep for dep in item["depends_on"] if dep not in done]
            items.append(item)
    return {
        "counts": {status: len(docs) for status, docs in by_status.items()},
        "columns": columns,
        "damaged": damaged,
        "ingest": ingest or {},
        "warnings": warnings or [],
        "rejected": {"latest": (rejected or ([], 0))[0], "total": (rejected or ([], 0))[1]},
    }


def _card(item: dict[str, Any]) -> Group:
    lines = [literal(item["id"], "bold", one_line=True, no_wrap=True, overflow="ellipsis")]
    if item["priority"]:
        lines[0].append(f" p{item['priority']}", style="dim")
    lines.append(literal(str(item["title"])[:80], one_line=True))
    who = item.get("agent") or item.get("assignee")
    if who:
        lines.append(literal(f"@{who}", "dim", one_line=True, no_wrap=True, overflow="ellipsis"))
    if item.get("needs") and not str(item.get("waiting_kind") or "").startswith("dependency"):  # said below
        lines.append(literal(f"needs {', '.join(item['needs'])}", "dim", one_line=True))
    if item["status"] in ("failed", "blocked") and item.get("error"):
        lines.append(literal(str(item["error"])[:80], "red", one_line=True))
    if item["status"] == "todo" and item.get("waiting"):
        lines.append(literal(f"waiting: {str(item['waiting'])[:80]}", "yellow", one_line=True))
    return Group(*lines)


# Always shown; the others only when they hold a task, so the picture fits an 80-column terminal.
CORE_COLUMNS = ("todo", "doing", "done")


def board_picture(document: dict[str, Any]) -> Table:
    shown_statuses = [s for s in STATUSES if s in CORE_COLUMNS or document["counts"][s]]
    table = Table(expand=True, show_lines=False, pad_edge=False, box=box.SIMPLE_HEAD)
    for status in shown_statuses:
        table.add_column(Text(f"{status} {document['counts'][status]}", no_wrap=True), style=STYLE[status],
                         header_style=f"bold {STYLE[status]}", ratio=1, overflow="fold")
    cells = []
    for status in shown_statuses:
        items = document["columns"][status][:TOP_PER_COLUMN]
        shown = [_card(item) for item in items]
        if document["counts"][status] > len(items):  # a document made with a limit holds no more
            shown.append(Text(f"... {document['counts'][status] - len(items)} more", style="dim"))
        cells.append(Group(*[Group(card, Text("")) for card in shown]) if shown else Text(""))
    table.add_row(*cells)
    return table


def _damaged(document: dict[str, Any]) -> list[Text]:
    return [literal(f"damaged: {item['path']}: {item['reason']}", "red") for item in document["damaged"]]


def _rejected(document: dict[str, Any]) -> list[Text]:
    """The footer of rejected drops: the newest with their reason, and how many rejected/ holds."""
    rejected = document.get("rejected") or {}
    latest, total = rejected.get("latest") or [], int(rejected.get("total") or 0)
    # The board's note names the file and says why: "inbox/x.md was rejected on TIME: REASON".
    lines = [Text.assemble(("rejected:", "red"), " ", literal(item["note"], one_line=True)) for item in latest]
    if total > len(latest):
        lines.append(Text(f"... {total - len(latest)} more in rejected/", style="dim"))
    return lines


def print_board(console: Console, document: dict[str, Any]) -> None:
    console.print(board_picture(document))
    for line in [*_damaged(document), *_rejected(document)]:
        console.print(line, soft_wrap=True)
    print_ingest(console, document.get("ingest") or {})
    for warning in document.get("warnings") or []:
        console.print(Text.assemble(("warning", "yellow"), " ", literal(warning)))


def watched_board(document: dict[str, Any], mode: str) -> Group:
    """The picture `board --watch` redraws, with a line saying when and how it is watching."""
    note = Text(f"{time.strftime('%H:%M:%S')}  watching the board ({mode} events); Ctrl-C to stop", style="dim")
    warnings = [Text.assemble(("warning", "yellow"), " ", literal(line)) for line in document.get("warnings") or []]
    return Group(board_picture(document), *_damaged(document), *_rejected(document), *warnings, note)


def print_ingest(console: Console, ingest: dict[str, Any]) -> None:
    for task_id in ingest.get("ingested", []):
        console.print(Text.assemble(("ingested", "green"), " ", literal(task_id)))
    for item in ingest.get("rejected", []):
        console.print(Text.assemble(("rejected", "red"), " ", literal(
            f"{item['file']}: {item['reason']} (see {item['moved_to']}.error.txt)")))
    for name in ingest.get("waiting", []):
        console.print(Text.assemble(("waiting", "yellow"), " ", literal(f"{name} is still being written")))


def task_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in ("id", "status", "pri", "title", "who", "attempts"):
        table.add_column(column, overflow="fold")
    for doc in tasks:
        item = summary(doc)
        who = item["agent"] or item["assignee"] or (f"role:{item['role']}" if item["role"] else "")
        table.add_row(literal(item["id"], one_line=True), Text(item["status"], style=STYLE[item["status"]]),
                      str(item["priority"]), literal(item["title"], one_line=True), literal(who or "", one_line=True),
                      f"{item['attempts']}/{item['max_attempts']}")
    return table


def result_text(result: Any) -> str:
    """A task's result for a person (pure): a model's answer as the text it wrote, its lines kept
    (not a Python repr with `\\n` in it), each step's result on a line of its own, anything else as
    JSON. Control characters are left to `visible`."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict) and list(result) == ["answer"] and isinstance(result["answer"], str):
        return result["answer"]
    if isinstance(result, dict) and list(result) == ["steps"] and isinstance(result["steps"], list):
        return "\n".join(f"step {number}: {item if isinstance(item, str) else _json(item)}"
                         for number, item in enumerate(result["steps"], 1))
    return _json(result)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def task_detail(doc: dict[str, Any]) -> Panel:
    lines = Text()
    for key in ("status", "waiting", "priority", "assignee", "role", "depends_on", "tier", "attempts",
                "max_attempts", "created_at", "updated_at"):
        value = doc.get(key)
        if value in (None, [], ""):
            continue
        lines.append(f"{key:>13}: ", style="dim")
        lines.append(visible(', '.join(map(str, value)) if isinstance(value, list) else value, one_line=True) + "\n")
    claim = doc.get("claim")
    if claim:
        lines.append(f"{'claim':>13}: ", style="dim")
        lines.append(visible(f"{claim.get('agent')} (pid {claim.get('pid')}, token {claim.get('token')}, "
                             f"lease until {claim.get('lease_until')})", one_line=True) + "\n")
    if doc.get("error"):
        lines.append(f"{'error':>13}: ", style="dim")
        lines.append(visible(doc["error"]) + "\n", style="red")
    if doc.get("result") is not None:
        shown = result_text(doc["result"])
        lines.append(f"{'result':>13}:" + ("\n" if "\n" in shown else " "), style="dim")
        lines.append(visible(shown) + "\n")
    if doc.get("status") == "blocked" and doc.get("question"):
        lines.append(f"{'question':>13}: ", style="dim")
        lines.append(visible(doc["question"]) + "\n", style="magenta")
    for key, shown in activity_fields(doc):
        lines.append(f"{key:>13}: ", style="dim")
        lines.append(visible(shown, one_line=True) + "\n")
    if doc.get("body"):
        lines.append("\n" + visible(doc["body"]) + "\n")
    comments = [entry for entry in doc.get("comments") or [] if isinstance(entry, dict)]
    if comments:  # where a teammate's remark and a person's answer to `ask_human` are read
        lines.append("\ncomments\n", style="bold")
        for entry in comments:
            answers = f" (answer to: {visible(entry['answers'], one_line=True)})" if entry.get("answers") else ""
            lines.append(visible(f"  {entry.get('at')}  {entry.get('by')}", one_line=True) + answers + ": ")
            lines.append(visible(entry.get("text", "")) + "\n")
    lines.append("\nhistory\n", style="bold")
    for entry in doc.get("history", []):
        lines.append(visible(f"  {entry['at']}  {entry.get('from') or '-'} -> {entry['to']}  by {entry['by']}"
                             f"{'  ' + str(entry['note']) if entry.get('note') else ''}", one_line=True) + "\n")
    return Panel(lines, title=literal(f"{doc['id']}: {doc['title']}", one_line=True), title_align="left")


def _size(count: int) -> str:
    return f"{count:,} B" if count < 1024 else f"{count / 1024:,.1f} KiB" if count < 1 << 20 else \
        f"{count / (1 << 20):,.1f} MiB"


def _dollars(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def activity_fields(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The lines `task show` adds from the agents' records (models, files, cost), as (label, text) (pure)."""
    shown = []
    models = doc.get("models") or []
    if models:
        shown.append(("models", ", ".join(f"{m['provider']} ({m['model']}) x{m['calls']}" for m in models)))
    files = doc.get("files") or []
    if files:
        shown.append(("files written", ", ".join(f"{f['path']} ({f['agent']})" for f in files)))
    folder = doc.get("folder")
    if folder:
        names = [f"{f['path']} ({'link' if f.get('link') else _size(f['bytes'])})" for f in folder["files"]]
        more = f", and {folder['more']} more" if folder.get("more") else ""
        shown.append(("work folder", f"{folder['path']}: " + (", ".join(names) + more if names else "empty")))
    for name, tree in sorted((doc.get("worktrees") or {}).items()):
        if tree.get("error"):
            shown.append((f"worktree {name}", f"{tree['branch']}: {tree['error']}"))
            continue
        commits = tree.get("commits") or []
        text = f"branch {tree['branch']} from {tree['base']}: " + (
            f"{len(commits)} commit(s), {tree['diffstat'] or 'no change'}" if commits else "no commit yet")
        shown.append((f"worktree {name}", text + "".join(f"\n  {line}" for line in commits)))
    cost = doc.get("cost") or {}
    if cost.get("calls"):
        text = f"{_dollars(cost['cost_usd'])} over {cost['calls']} model call(s)"
        extra = [f"{cost[k]} {label}" for k, label in (("unpriced_calls", "unpriced, not counted"),
                                                       ("failed_calls", "failed"),
                                                       ("estimated_calls", "with estimated tokens")) if cost.get(k)]
        shown.append(("cost", text + (f" ({'; '.join(extra)})" if extra else "")))
    return shown


CONTENT_CHARS = 2000  # a message's text in a task's log: enough to follow it, not a whole file
SHORT_CHARS = 300  # a tool's arguments and result


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def _clock(at: Any) -> str:
    return at[11:19] if isinstance(at, str) and len(at) >= 19 else "--:--:--"


def _seconds(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, (int, float)) else "? s"


def route_text(route: dict[str, Any]) -> str:
    """A routing decision in words: `cheap escalated (confidence 0.3 below 0.7)` (pure)."""
    words = " ".join(str(route[key]) for key in ("tier", "check", "decision") if route.get(key))
    return f"{words} ({route['why']})" if route.get("why") else words


def log_lines(entry: dict[str, Any]) -> list[str]:
    """One entry of a task's log (see supervisor/views/timeline.py) as lines for a terminal, user and
    model text made visible, never markup (pure)."""
    head = f"{_clock(entry.get('at'))} {entry.get('agent')}"
    kind = entry.get("kind")
    if kind == "model":
        cost = entry.get("cost_usd")
        line = (f"{head}  model  {entry.get('provider')} ({entry.get('model')}) {entry.get('outcome')}  "
                f"{entry.get('tokens_in') or 0} in / {entry.get('tokens_out') or 0} out tokens"
                f"{' (estimated)' if entry.get('estimated') else ''}  {_seconds(entry.get('latency_s'))}  "
                + (_dollars(cost) if isinstance(cost, (int, float)) else "unpriced")
                + (f"  error: {entry['error']}" if entry.get("error") else "")
                + (f"  route: {route_text(entry['route'])}" if entry.get("route") else ""))
        return [visible(line, one_line=True)]
    if kind == "tool":
        if entry.get("status") == "done":
            line = (f"{head}  tool   {entry.get('tool')} -> {entry.get('outcome')} in "
                    f"{_seconds(entry.get('duration_s'))}: {_cut(entry.get('result') or '', SHORT_CHARS)}")
        else:
            args = _json(entry.get("args"))
            line = f"{head}  tool   {entry.get('tool')} {_cut(args, SHORT_CHARS)}"
        return [visible(line, one_line=True)]
    content = entry.get("content") or ""
    limit = SHORT_CHARS if entry.get("role") == "system" else CONTENT_CHARS
    label = str(entry.get("role")) + (" (error)" if entry.get("is_error") else "")
    body = visible(_cut(content, limit)).split("\n")
    lines = [visible(f"{head}  {label}:", one_line=True) + (" " + body[0] if body[0] else "")]
    lines += ["    " + line for line in body[1:]]
    for call in entry.get("tool_calls") or []:
        arguments = call.get("arguments")
        text = arguments if isinstance(arguments, str) else _json(arguments)
        lines.append(visible(f"    calls {call.get('name')} {_cut(text, SHORT_CHARS)}", one_line=True))
    return lines


AGENT_STYLE = {"running": "green", "starting": "cyan", "queued": "cyan", "backoff": "yellow", "fatal": "bold red",
               "stopping": "yellow", "stopped": "dim"}


def status_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    # Names, numbers and states never wrap; the task and the last exit give way on a narrow terminal.
    for column in ("agent", "pid", "state", "restarts", "uptime", "task", "rss", "cpu", "last exit"):
        if column in ("task", "last exit"):
            table.add_column(column, overflow="fold", ratio=1)
        else:
            table.add_column(column, no_wrap=True)
    for row in rows:
        uptime = row.get("uptime_s")
        state = row.get("state") or "-"
        shown = f"{state} (by hand)" if row.get("held") and state == "stopped" else state
        table.add_row(
            literal(row["name"], one_line=True), literal(row.get("pid") or "-"),
            literal(shown, AGENT_STYLE.get(str(state), ""), one_line=True),
            literal(row.get("restarts") or 0), "-" if uptime is None else f"{uptime:.0f}s",
            literal(row.get("task") or "-", one_line=True),
            "-" if row.get("rss_mb") is None else f"{row['rss_mb']:.0f} MB",
            "-" if row.get("cpu_percent") is None else f"{row['cpu_percent']:.0f}%",
            literal(row.get("last_exit") or "-", one_line=True),
        )
        for child in row.get("children") or []:
            table.add_row(literal(f"  └ {child.get('name')}", one_line=True), literal(child.get("pid")),
                          Text("child", style="cyan"), "-", "-", literal(child.get("task") or "-", one_line=True),
                          "-", "-", "-")
    return table


def live_view(snapshot: dict[str, Any], counts: dict[str, int], rss: Callable[[int], float]) -> Group:
    """What a foreground `up` keeps on screen: the agents, then the board's counts."""
    now_rows = []
    for name, agent in (snapshot.get("agents") or {}).items():
        pid = agent.get("pid")
        now_rows.append({"name": name, "pid": pid, "state": agent.get("state"),
                         "restarts": agent.get("restarts"), "task": agent.get("task"),
                         "last_exit": agent.get("last_exit"), "uptime_s": agent.get("uptime_s"),
                         "held": agent.get("held"),
                         "rss_mb": rss(pid) if pid else None, "cpu_percent": None})
    counts_line = Text("board: ", style="bold")
    for status in STATUSES:
        counts_line.append(f"{status} {counts.get(status, 0)}  ", style=STYLE[status])
    title = literal(f"hermes-sup (pid {snapshot.get('pid')}) in {snapshot.get('workspace')}  Ctrl-C stops",
                    "bold", one_line=True)
    return Group(title, status_table(now_rows), counts_line)


def usage_table(label: str, rows: dict[str, dict[str, Any]]) -> Table:
    table = Table(show_edge=False, header_style="bold")
    for column in (label, "calls", "failed", "tokens in", "cached", "tokens out", "cost"):
        table.add_column(column, justify="left" if column == label else "right")
    for key, row in sorted(rows.items(), key=lambda item: -item[1]["cost_usd"]):
        cost = f"${row['cost_usd']:.4f}" + (f" (+{row['unpriced_calls']} unpriced)" if row["unpriced_calls"] else "")
        about = "~" if row.get("estimated_calls") else ""  # some of its tokens are estimates
        table.add_row(literal(key, one_line=True), str(row["calls"]), str(row["failed_calls"]),
                      f"{about}{row['tokens_in']:,}", f"{row['tokens_cached']:,}", f"{about}{row['tokens_out']:,}",
                      cost)
    return table


def budget_table(rows: list[dict[str, Any]]) -> Table:
    """Spend (settled and reserved) against each cap of hermes.yaml's budgets."""
    table = Table(show_edge=False, header_style="bold")
    for column in ("budget", "cap", "spent", "limit", "left"):
        table.add_column(column, justify="left" if column in ("budget", "cap") else "right")
    for row in rows:
        style = "red" if row["left"] <= 0 else ""
        table.add_row(literal(row["scope"], one_line=True), row["cap"], Text(f"${row['spent']:.4f}", style=style),
                      f"${row['limit']:.2f}", f"${row['left']:.4f}")
    return table


def skills_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("skill", "kind", "source", "state", "tools / description"):
        table.add_column(column)
    for row in rows:
        state = Text("ok", style="green") if row["state"] == "ok" else literal(f"rejected: {row['error']}", "red")
        detail = ", ".join(map(str, row["tools"])) if row["kind"] == "python" else row["description"]
        table.add_row(literal(row["name"], one_line=True), literal(row["kind"]), literal(row["source"]), state,
                      literal(detail))
    return table


# -- agent log lines (compose style) ----------------------------------------------------------------

# No red: it reads as an error. Each agent keeps its colour across runs and commands.
def event_line(record: dict[str, Any]) -> str:
    """One event as a line of text, its user text with controls made visible (pure). A board transition
    reads `AT  TASK  FROM -> TO  by WHO  NOTE`; the supervisor's and the alerts' `AT  KIND  EVENT  NOTE`."""
    kind = record.get("kind", "board")
    if kind != "board":
        text = f"{visible(record.get('at') or '-', one_line=True)}  {visible(kind, one_line=True)}  " \
               f"{visible(record.get('event') or '-', one_line=True)}"
        note = record.get("note")
        return text + (f"  {visible(note, one_line=True)}" if note else "")
    src, dst = record.get("from"), record.get("to")
    line = (f"{visible(record.get('at') or '-', one_line=True)}  {visible(record.get('task'), one_line=True)}  "
            f"{visible(src or '-', one_line=True)} -> {visible(dst or '-', one_line=True)}  "
            f"by {visible(record.get('by') or '-', one_line=True)}")
    note = record.get("note")
    return line + (f"  {visible(note, one_line=True)}" if note else "")
