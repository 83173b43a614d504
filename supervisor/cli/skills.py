"""`skills list|new|history|rollback`: the workspace's skills, a new one, their versions and rolling one back."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from ..cliargs import emit_json
from ..config.skillnew import KINDS, LinkedFolder, create, files_for
from ..views import render
from .common import Failure, group, handled, json_option, literal, out, print_table, workspace_of


@group()
def skills() -> None:
    """The skills: Python files that add tools, and instruction skills (SKILL.md)."""


def _skills(ctx: click.Context, name: str | None = None) -> Any:
    from ...agents.skills import SKILL_NAME, Skills  # only these commands need the agents package

    if name is not None and not SKILL_NAME.fullmatch(name):
        raise Failure(f"{name!r} is not a skill name (a-z, 0-9 and _, starting with a letter)", 2)
    return Skills(workspace_of(ctx).root)


@skills.command("list")
@json_option
@click.pass_context
@handled
def skills_list(ctx: click.Context, as_json: bool) -> None:
    """Every skill, where it comes from, whether it is valid (and why not), and its tools."""
    rows = [skill.as_dict() for skill in _skills(ctx).catalog()]
    if as_json:
        emit_json({"skills": rows})
        return
    if not rows:
        out.print("no skills (drop a .py file or a folder with a SKILL.md into skills/)")
        return
    print_table(render.skills_table(rows))


@skills.command("new")
@click.argument("name")
@click.option("--kind", type=click.Choice(KINDS), default="python", show_default=True,
              help="python: a tool the agents call (and its test); instructions: a SKILL.md the agents read.")
@json_option
@click.pass_context
@handled
def skills_new(ctx: click.Context, name: str, kind: str, as_json: bool) -> None:
    """Start a skill named NAME that works as written: skills/NAME.py and tests/test_NAME.py, or
    skills/NAME/SKILL.md; then edit it, and name it in an agent's `skills:` in hermes.yaml."""
    found = _skills(ctx, name)
    if name in found.names():
        raise Failure(f"a skill named {name} exists already (`hermes-sup skills list`); choose another name")
    root = workspace_of(ctx).root
    try:
        written = create(root, files_for(name, kind))
    except FileExistsError as exc:
        raise Failure(f"{root / str(exc)} exists already; nothing was written") from None
    except LinkedFolder as exc:
        raise Failure(f"{root / str(exc)} is a symbolic link: a new skill's files are written in the workspace "
                      "only; nothing was written") from None
    if as_json:
        emit_json({"skill": name, "kind": kind, "files": written})
        return
    for relative in written:
        out.print(literal(f"created {relative}"), highlight=False)
    steps = [f"edit {written[0]}"]
    if kind == "python":
        steps.append(f"{shlex.quote(sys.executable)} {written[1]}   (its test, with hermes-sup's Python)")
    steps += ["hermes-sup skills list   (checked as the agents will load it)",
              f"add it to an agent in hermes.yaml:  skills: [{name}]"]
    out.print("next:\n" + "\n".join(f"  {step}" for step in steps), highlight=False)


@skills.command("history")
@click.argument("name")
@json_option
@click.pass_context
@handled
def skills_history(ctx: click.Context, name: str, as_json: bool) -> None:
    """The versions of a skill kept by skill_manage and rollbacks, oldest first."""
    found = _skills(ctx, name)
    entries = found.history(name)
    if not entries and name not in found.names():  # a typo is not a skill without history
        raise Failure(f"no skill named {name!r}; skills: {', '.join(sorted(found.names())) or 'none'}")
    if as_json:
        emit_json({"skill": name, "versions": entries})
        return
    if not entries:
        out.print(literal(f"skill {name} has no earlier versions"))
        return
    for entry in entries:
        out.print(literal(f"{entry.get('version', '?'):>3}  {entry.get('at')}  {entry.get('digest')}  "
                          f"by {entry.get('by')}: {entry.get('note')}", one_line=True), highlight=False)


@skills.command("rollback")
@click.argument("name")
@click.argument("version", type=click.IntRange(1, 10**9), required=False)
@json_option
@click.pass_context
@handled
def skills_rollback(ctx: click.Context, name: str, version: int | None, as_json: bool) -> None:
    """Make an earlier version of a skill current again (default: the latest kept)."""
    from ...agents.tools import ToolError

    try:
        chosen, skill = _skills(ctx, name).rollback(name, version, by="cli")
    except ToolError as exc:
        raise Failure(str(exc)) from None
    if as_json:
        emit_json({"skill": name, "restored": chosen, **skill.as_dict()})
        return
    out.print(literal(f"skill {name}: version {chosen} restored ({skill.state}"
                      f"{': ' + skill.error if skill.error else ''})"), highlight=False)
