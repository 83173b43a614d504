"""`hermes-sup board migrate --to postgres`: copy the workspace's file board onto a PostgreSQL board.

Registered on the `board` group when cli.py imports this module (at its end). The decisions are
supervisor/upkeep/migrate.py's (pure); the copy is one transaction of kanban/pg/bulk.py. The file board is
read under its lock and left as it was: the copy is a copy, and going back is switching hermes.yaml.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import click
from rich.text import Text

from ...kanban import BoardError, BoardStore
from ...kanban.backends import DEFAULT_DSN_ENV, ENV_NAME
from ...kanban.pg import NEEDS_PSYCOPG, dsn_not_set
from ...kanban.task import STATUSES
from ..cliargs import emit_json
from ..config.workspace import Workspace, board_settings, open_workspace_board
from ..statefile import supervisor_alive
from ..sweep import LOCK_FILE
from ..upkeep.migrate import MARKER_EVENT, Plan, marker_offset, marker_record, plan_migration, switch_hint
from .common import Failure, command, err, handled, json_option, literal, out, read_supervisor_state, workspace_of


@command("migrate")
@click.option("--to", "target", type=click.Choice(["postgres"]), required=True,
              help="The backend to copy the board to (postgres).")
@click.option("--dsn-env", "dsn_env", metavar="NAME", default=DEFAULT_DSN_ENV, show_default=True,
              help="The environment variable that holds the PostgreSQL connection string; the string itself "
                   "is never printed.")
@click.option("--dry-run", is_flag=True,
              help="Say what would be copied, skipped or refused; copy nothing (the board's tables are created "
                   "if missing, as by any command on it).")
@json_option
@click.pass_context
@handled
def migrate_command(ctx: click.Context, target: str, dsn_env: str, dry_run: bool, as_json: bool) -> None:
    """Copy every task of this workspace's file board (every status, with its history, comments,
    questions, attempts, results, meta and dependencies) and its events onto the PostgreSQL board,
    in one transaction. Refused while the team runs, and when the PostgreSQL board has a task with
    the same id and other content (one with the same content is skipped: running it again is
    safe). The file board is left as it was."""
    ws = workspace_of(ctx)
    section, host = board_settings(ws)
    if section["backend"] != "files":
        raise Failure(f"this workspace's board is already on {section['backend']} (hermes.yaml's board:); "
                      "migrate copies a file board", 2)
    if not ENV_NAME.fullmatch(dsn_env):
        raise Failure("--dsn-env must name an environment variable (the DSN itself is never given on the "
                      "command line)", 2)
    dsn = os.environ.get(dsn_env)
    if not dsn:
        raise Failure(dsn_not_set(dsn_env, "put the PostgreSQL connection string (DSN) in that environment "
                                  "variable (or name another with --dsn-env)", on_board=False), 2)
    try:
        from ...kanban.pg import check_dsn, open_store
        from ...kanban.pg.bulk import importing
        from ...kanban.pg.store import redact_dsn
    except ImportError:
        raise Failure(NEEDS_PSYCOPG, 2) from None
    try:
        check_dsn(dsn, dsn_env)
    except BoardError as exc:
        raise Failure(str(exc), 2) from None
    try:
        with _team_held_off(ws), open_workspace_board(ws) as files:
            snapshot = _read_file_board(files)
            with open_store({"dsn_env": dsn_env}, host=host) as store:
                report = _copy(store, importing, snapshot, dry_run=dry_run)
                report.update(dsn_env=f"${dsn_env}", schema=store.schema)
    except BoardError as exc:
        raise BoardError(redact_dsn(str(exc), dsn)) from None
    report["switch"] = switch_hint(dsn_env)
    if as_json:
        emit_json(report)
        return
    _print_report(report, dsn_env)


@contextlib.contextmanager
def _team_held_off(ws: Workspace) -> Iterator[None]:
    """Refuse while this workspace's supervisor runs, and hold `up`'s own lock meanwhile, so that no
    team starts on the file board halfway through the copy."""
    import filelock

    running = read_supervisor_state(ws)
    if supervisor_alive(running):
        raise Failure(f"hermes-sup is running in {ws.root} (pid {running.get('pid')}): stop the team with "
                      "`hermes-sup down` first, so that no task moves during the copy")
    ws.runs_path.mkdir(parents=True, exist_ok=True)
    singleton = filelock.FileLock(str(ws.runs_path / LOCK_FILE), blocking=False)
    try:
        singleton.acquire()
    except filelock.Timeout:
        raise Failure(f"hermes-sup is starting or running in {ws.root}: stop the team with `hermes-sup down` "
                      "first, so that no task moves during the copy") from None
    try:
        yield
    finally:
        singleton.release()


def _read_file_board(files: BoardStore) -> dict[str, Any]:
    """The file board's tasks and events as of one moment: read under its lock, which holds off
    every writer (a `task add` from another shell waits)."""
    events: list[tuple[int, dict[str, Any]]] = []
    cursor, inode, bad = 0, None, 0
    with files.exclusive():
        listing = files.list()
        while True:
            batch = files.events_since(cursor, inode=inode)
            inode = batch.inode if batch.inode is not None else inode
            bad += batch.bad
            events.extend(batch.events)
            if batch.cursor == cursor:
                break
            cursor = batch.cursor
    return {"tasks": listing.tasks, "damaged": listing.damaged, "events": events, "end": cursor, "inode": inode,
            "bad": bad, "root": str(files.root)}


def _copy(store: Any, importing: Any, snapshot: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
    source = snapshot["root"]
    with importing(store) as target:
        existing = target.existing([str(doc.get("id")) for doc in snapshot["tasks"]])
        after = marker_offset(target.marker(MARKER_EVENT, source), source=source, inode=snapshot["inode"])
        plan = plan_migration(snapshot["tasks"], snapshot["damaged"], existing, snapshot["events"], events_after=after)
        if not plan.ok:
            raise Failure(_refusal(plan))
        if not dry_run and (plan.copy or plan.events):
            target.write(plan.copy, plan.events, marker_record(
                at=target.now(), source=source, inode=snapshot["inode"], offset=snapshot["end"],
                tasks=len(plan.copy), events=len(plan.events)))
    if not dry_run and plan.copy:
        store.analyze()  # claims planned for an empty table would read every copied task
    return {"dry_run": dry_run, "to": "postgres", "file_board": source, "file_board_changed": False,
            "copied": plan.counts(plan.copy), "skipped": plan.skipped,
            "events": {"copied": len(plan.events), "copied_before": plan.events_already,
                       "unreadable": snapshot["bad"]},
            "altered": plan.altered}


def _refusal(plan: Plan) -> str:
    parts = list(plan.refusals)
    if plan.conflicts:
        parts.append(f"the PostgreSQL board already has {len(plan.conflicts)} task(s) with the same id and other "
                     f"content: {'; '.join(plan.conflicts[:20])}"
                     f"{f'; and {len(plan.conflicts) - 20} more' if len(plan.conflicts) > 20 else ''} "
                     "(cancel or remove them there, or copy into another database)")
    return "nothing was copied: " + "; ".join(parts)


def _print_report(report: dict[str, Any], dsn_env: str) -> None:
    copied = report["copied"]
    total = sum(copied.values())
    verb = "would copy" if report["dry_run"] else "copied"
    where = f"the PostgreSQL board (${dsn_env}, schema {report['schema']})"
    if total or not report["skipped"]:
        out.print(literal(f"{verb} {total} task(s) to {where}: "
                          + ", ".join(f"{copied[status]} {status}" for status in STATUSES)), soft_wrap=True)
    else:
        out.print(literal(f"nothing new to copy to {where}"), soft_wrap=True)
    if report["skipped"]:
        shown = ", ".join(report["skipped"][:20]) + (" ..." if len(report["skipped"]) > 20 else "")
        out.print(literal(f"skipped {len(report['skipped'])} task(s) already there with the same content: {shown}"),
                  soft_wrap=True)
    events = report["events"]
    line = f"{verb} {events['copied']} event(s)"
    if events["copied_before"]:
        line += f"; {events['copied_before']} copied by an earlier run"
    out.print(literal(line), soft_wrap=True)
    if events["unreadable"]:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(
            f"{events['unreadable']} line(s) of events.jsonl are no event and were not copied")), soft_wrap=True)
    for note in report["altered"]:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(note)), soft_wrap=True)
    if report["dry_run"]:
        out.print("dry run: nothing was written", soft_wrap=True)
        return
    out.print(literal(f"the file board in {report['file_board']} is left as it was (its task files, events.jsonl, "
                      "inbox/ and rejected/); drops waiting in its inbox/ go onto the PostgreSQL board once "
                      "it is the workspace's board"), soft_wrap=True)
    out.print(literal(f"next: put `{report['switch']}` in hermes.yaml instead of its board: section, with "
                      f"${dsn_env} set wherever hermes-sup runs; then `hermes-sup up`"), soft_wrap=True)
