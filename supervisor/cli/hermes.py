"""`hermes-sup import-hermes PATH`: a Hermes Agent home or profile becomes an agent of hermes.yaml.

hermes.yaml is the user's file, comments and all: the agent and its providers are added as text,
in the file's own layout, and the result is parsed back and checked (it must hold exactly the old
file plus the additions, and pass `load_config`) before anything is written. The memory and skill
files are staged beside their place and moved in, and hermes.yaml is replaced last, atomically: an
import that fails leaves the workspace as it was. Registered on the command line by cli.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from ...kanban import BoardStore
from ...kanban.fsio import write_atomic
from ...kanban.parse import PlainYamlError, load_plain
from ..cliargs import emit_json
from ..config.checks import skill_names
from ..config.workspace import CONFIG_NAME, MAX_CONFIG_BYTES, ConfigError, load_config, open_workspace_board
from .common import Failure, command, handled, json_option, literal, out, workspace_of

if TYPE_CHECKING:
    from ..hermes.importer import Plan

TOP_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)\s*:(.*)$")


def parse_plain(text: str) -> dict[str, Any]:
    """hermes.yaml as plain data (without the lines workspace.load_config adds); PlainYamlError if it is not."""
    data = load_plain(text, CONFIG_NAME)
    return data if isinstance(data, dict) else {}


def _blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Each top-level key's lines: (its line, the line after its last non-blank, non-comment line)."""
    starts = [(i, m.group(1)) for i, line in enumerate(lines) if (m := TOP_KEY.match(line))]
    blocks = {}
    for index, (start, key) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(lines)
        while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        blocks[key] = (start, end)
    return blocks


class _Dumper(yaml.SafeDumper):
    """Multi-line text (SOUL.md) as a literal block, as a person would write it."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _dump(value: Any) -> list[str]:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100,
                     default_flow_style=None).splitlines()


def _indent_of(lines: list[str], start: int, end: int, default: str) -> str:
    for line in lines[start + 1:end]:
        if line.strip() and not line.lstrip().startswith("#"):
            return line[:len(line) - len(line.lstrip())]
    return default


def _add(lines: list[str], key: str, rendered: list[str]) -> list[str]:
    """`lines` with `rendered` (the block's items) added at the end of top-level `key`'s block, in its
    indentation; the key is added at the end of the file when absent (pure)."""
    from ..hermes.profile import HermesImportError

    blocks = _blocks(lines)
    if key not in blocks:
        return [*lines, f"{key}:", *(f"  {line}" for line in rendered)]
    start, end = blocks[key]
    inline = TOP_KEY.match(lines[start]).group(2).split("#")[0].strip()  # type: ignore[union-attr]
    if inline in ("[]", "{}", "null", "~"):  # empty, on one line: becomes a block
        return [*lines[:start], f"{key}:", *(f"  {line}" for line in rendered), *lines[start + 1:]]
    if inline:
        raise HermesImportError(f"hermes.yaml writes {key} on one line ({key}: {inline[:40]}); the import adds to "
                                f"a {key} block only: write it as a block, or add the entry by hand (nothing was "
                                "changed)")
    indent = _indent_of(lines, start, end, "  ")
    return [*lines[:end], *(f"{indent}{line}" for line in rendered), *lines[end:]]


def new_config_text(text: str, plan: Plan) -> str:
    """hermes.yaml's text with the plan's agent, providers, MCP servers and schedules added (pure)."""
    lines = text.splitlines()
    if plan.providers:
        lines = _add(lines, "providers", _dump(plan.providers))
    if plan.mcp_servers:
        lines = _add(lines, "mcp_servers", _dump(plan.mcp_servers))
    if plan.schedules:
        lines = _add(lines, "schedules", _dump(plan.schedules))
    lines = _add(lines, "agents", _dump([plan.entry]))
    return "\n".join(lines) + "\n"


def expected(before: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """What the new file must parse to: the old one plus the plan's additions (pure)."""
    after = dict(before)
    if plan.providers:
        after["providers"] = {**(before.get("providers") or {}), **plan.providers}
    if plan.mcp_servers:
        after["mcp_servers"] = {**(before.get("mcp_servers") or {}), **plan.mcp_servers}
    if plan.schedules:
        after["schedules"] = [*(before.get("schedules") or []), *plan.schedules]
    after["agents"] = [*(before.get("agents") or []), plan.entry]
    return after


def checked_config(config_path: Path, text: str, plan: Plan) -> str:
    """The new hermes.yaml text, once parsed back and checked as `hermes-sup up` would."""
    from ..hermes.profile import HermesImportError

    try:
        before = parse_plain(text)
    except PlainYamlError as exc:
        raise HermesImportError(f"{config_path} is not valid YAML{exc.where}, fix it first: {exc.problem}") from None
    new = new_config_text(text, plan)
    if len(new.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise HermesImportError(f"hermes.yaml would be larger than {MAX_CONFIG_BYTES:,} bytes (SOUL.md is long?)")
    try:
        parsed = parse_plain(new)
    except PlainYamlError as exc:
        raise HermesImportError(f"the import could not write hermes.yaml in its layout ({exc.problem}{exc.where}); "
                                "nothing was changed") from None
    if parsed != expected(before, plan):
        raise HermesImportError("the import could not add to hermes.yaml in its layout (the result would mean "
                                "something else); nothing was changed: add the agent by hand")
    with tempfile.TemporaryDirectory(dir=config_path.parent, prefix=".import-check-") as folder:
        candidate = Path(folder) / CONFIG_NAME
        candidate.write_text(new, encoding="utf-8")
        try:
            # The copy sits in a temp folder with no skills/ beside it: the skills it may name are the
            # workspace's (and the bundled ones), as `up` finds them; the imported agent names none.
            load_config(candidate, skills=lambda: skill_names(config_path.parent) | set(plan.entry.get("skills") or ()))
        except ConfigError as exc:
            raise HermesImportError(f"hermes.yaml would not be valid after the import: "
                                    f"{str(exc).replace(str(candidate), CONFIG_NAME)}; nothing was changed") from None
    return new


def _staged(base: Path, files: list[tuple[str, bytes]], folder_name: str) -> Path:
    stage = Path(tempfile.mkdtemp(dir=base, prefix=f".import-{folder_name}-"))
    for relative, data in files:
        target = stage / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return stage


def top_folders(folders: set[str]) -> list[str]:
    """The folders not inside another of them (pure): a skill may hold another (Hermes' hermes-agent
    skill holds model-selection/SKILL.md), and moves with it."""
    return sorted(f for f in folders if not any(f.startswith(other + "/") for other in folders))


def apply(root: Path, plan: Plan, config_text: str) -> list[str]:
    """Write the plan: memory and skills moved in from staging folders, hermes.yaml last. Returns
    what was written; on a failure, what was moved in is taken out again."""
    from ..hermes.profile import HermesImportError

    runs = root / "runs"
    memory_dir = runs / plan.name / "memory"
    if any((memory_dir / name).exists() for name in plan.memories):
        raise HermesImportError(f"{memory_dir} already holds memory files (an earlier agent of this name?); move "
                                "them away or import under another name (nothing was changed)")
    skills_root = root / "skills"
    skill_dirs = top_folders({path.rsplit("/", 1)[0] for path, _ in plan.skills if path.endswith("/SKILL.md")})
    skipped = [d for d in skill_dirs if (skills_root / d).exists()]
    files = [(p, d) for p, d in plan.skills if not any(p.startswith(s + "/") for s in skipped)]
    written: list[str] = []
    moved: list[Path] = []
    stages: list[Path] = []
    try:
        if plan.memories:
            # Private, as Hermes keeps them (0600 in 0700) and as all of runs/ is, under any umask.
            for folder in (runs, runs / plan.name, memory_dir):
                folder.mkdir(mode=0o700, exist_ok=True)
                os.chmod(folder, 0o700)
            stage = _staged(runs, list(plan.memories.items()), "memory")
            stages.append(stage)
            for name in plan.memories:
                os.chmod(stage / name, 0o600)
                os.replace(stage / name, memory_dir / name)
                moved.append(memory_dir / name)
                written.append(f"runs/{plan.name}/memory/{name}")
        if files:
            skills_root.mkdir(exist_ok=True)
            stage = _staged(skills_root, files, "skills")
            stages.append(stage)
            for folder in skill_dirs:
                if folder in skipped:
                    continue
                (skills_root / folder).parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / folder, skills_root / folder)
                moved.append(skills_root / folder)
                written.append(f"skills/{folder}/")
        write_atomic(root / CONFIG_NAME, config_text.encode("utf-8"))
        written.append(CONFIG_NAME)
    except BaseException:
        for path in reversed(moved):
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        raise
    finally:
        for stage in stages:
            shutil.rmtree(stage, ignore_errors=True)
    written += [f"skipped skills/{d}/: a skill of that name is already in the workspace" for d in skipped]
    return written


def board_file(path: Path) -> Path:
    """The kanban.db of a Hermes home or profile: Hermes keeps one board for all its profiles, at the
    home's root (~/.hermes/kanban.db), so a profile without one of its own has its home's."""
    own = path / "kanban.db"
    resolved = path.resolve()
    if not os.path.lexists(own) and resolved.parent.name == "profiles":
        return resolved.parent.parent / "kanban.db"
    return own


def board_plan(board: BoardStore, path: Path, plan: Plan, current: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks --board adds, checked against the board before anything is written; the plan's
    notes say what they are."""
    from ..hermes.board import board_tasks, conflicts, read_board
    from ..hermes.profile import HermesImportError

    rows, links, comments = read_board(board_file(path))
    # A Hermes assignee is a profile name: this profile's is its folder's (the home's is "default").
    own = path.resolve().name if path.resolve().parent.name == "profiles" else "default"
    agents = {str(a.get("name")): str(a.get("name")) for a in current.get("agents") or [] if isinstance(a, dict)}
    tasks, notes = board_tasks(rows, links, comments, {**agents, **({own: plan.name} if plan.name else {})})
    taken = conflicts(board, tasks)
    if taken:
        raise HermesImportError(f"--board: the board already has tasks {', '.join(taken[:5])} that are not "
                                "Hermes' (nothing was changed)")
    plan.not_carried = [item for item in plan.not_carried if item["what"] != "kanban"]
    waiting = sum(1 for task in tasks if task.get("status") == "blocked")
    plan.notes.append(f"board: {len(tasks)} open tasks of {board_file(path)}, in todo (claims do not carry over; "
                      "a one-way copy: neither board sees the other's changes from now on)"
                      + (f", {waiting} of them blocked: they wait on Hermes' board (triage, scheduled, blocked, "
                         "review); a comment on each says for what" if waiting else ""))
    plan.warnings += notes
    return tasks


@command("import-hermes")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", help="the new agent's name (default: the profile folder's name)")
@click.option("--dry-run", is_flag=True, help="say what would be done, write nothing")
@click.option("--board", "with_board", is_flag=True, help="also put the open tasks of its kanban.db on the board")
@click.option("--board-only", is_flag=True, help="only put the open tasks of its kanban.db on the board (the home's, "
              "which Hermes shares between its profiles), adding no agent")
@json_option
@click.pass_context
@handled
def import_hermes(ctx: click.Context, path: Path, name: str | None, dry_run: bool, with_board: bool,
                  board_only: bool, as_json: bool) -> None:
    """Make a Hermes Agent home or profile (config.yaml, .env key names, SOUL.md, memories/, skills/)
    an agent of hermes.yaml, and say what could not be carried over."""
    # Imported here: the other commands do not pay for them.
    from ..hermes.board import add_tasks
    from ..hermes.importer import Plan, agent_name, make_plan
    from ..hermes.profile import HermesImportError, read_profile

    ws = workspace_of(ctx)
    config_path = ws.config_path
    try:
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Failure(f"no {CONFIG_NAME} in {ws.root}: run hermes-sup init first", 2) from None
    except UnicodeDecodeError:
        raise Failure(f"{config_path} is not UTF-8 text", 2) from None
    board = None
    with_board = with_board or board_only
    try:
        if board_only:  # the board alone: no profile is read, hermes.yaml is left as it is
            if not path.is_dir():
                raise HermesImportError(f"{path} is not a folder (a Hermes home such as ~/.hermes)")
            current = parse_plain(text)
            plan = Plan("", {}, {}, {}, [], [], [], [])
        else:
            profile = read_profile(path)  # the profile's problems first, then hermes.yaml's
            current = parse_plain(text)
            plan = make_plan(profile, agent_name(name, path), current)
            new_text = checked_config(config_path, text, plan)
        if with_board:
            board = open_workspace_board(ws)
            tasks = board_plan(board, path, plan, current)
        written = [] if dry_run or board_only else apply(ws.root, plan, new_text)
        if with_board and not dry_run:
            added, there = add_tasks(board, tasks)
            written.append(f"board: {len(added)} tasks added" + (f", {len(there)} already there" if there else ""))
    except PlainYamlError as exc:
        raise Failure(f"{config_path} is not valid YAML{exc.where}, fix it first: {exc.problem}", 1) from None
    except HermesImportError as exc:
        raise Failure(str(exc), 1) from None
    finally:
        if board is not None:
            board.close()
    document = {"agent": plan.name or None, "dry_run": dry_run, "providers": plan.providers,
                "schedules": plan.schedules, "carried_over": plan.notes, "not_carried_over": plan.not_carried,
                "warnings": plan.warnings, "written": written}
    if as_json:
        emit_json(document)
        return
    lines = [f"{'would import' if dry_run else 'imported'} {path} as agent {plan.name}" if plan.name else
             f"{'would import' if dry_run else 'imported'} the board of {path} (no agent added)",
             *(f"  {note}" for note in plan.notes),
             *(f"  {item}" if item.startswith("skipped") else f"  wrote {item}" for item in written),
             *(f"warning: {warning}" for warning in plan.warnings)]
    if plan.not_carried:
        lines += ["not carried over:", *(f"  {item['what']}: {item['why']}" for item in plan.not_carried)]
    if not dry_run and plan.name:
        lines.append("hermes-sup reload (or up) starts it")
    for line in lines:
        out.print(literal(line), highlight=False, soft_wrap=True)
