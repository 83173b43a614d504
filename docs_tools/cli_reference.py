"""The command reference page, generated from the CLI itself: walks click's command tree of
`hermes_sup.supervisor.cli:main` and writes every command, its usage, arguments and options as
Markdown. Used by mkdocs as a hook (mkdocs.yml `hooks:`), which adds the page `reference/cli.md`
to the site at build time; `python docs_tools/cli_reference.py` prints the same page."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

PAGE = "reference/cli.md"
PROGRAM = "hermes-sup"

INTRO = """# Every command and option

This page is generated from the command line itself each time the documentation is built (the
hook `docs_tools/cli_reference.py` walks click's command tree of `hermes_sup.supervisor.cli:main`),
so it lists exactly what `hermes-sup <command> --help` prints. What each command does in more words,
and the rules every command shares, are in [Commands](commands.md); exit codes in
[Exit codes](exit-codes.md).

"""


def _prose(text: str) -> str:
    """Help text as Markdown prose: a `<` outside backticks is shown, never taken as an HTML tag."""
    parts = text.split("`")
    return "`".join(part.replace("<", "&lt;") if i % 2 == 0 else part for i, part in enumerate(parts))


def _cell(text: str) -> str:
    return _prose(" ".join(text.split())).replace("|", "\\|")


def _help(text: str) -> list[str]:
    """A command's help as Markdown: its paragraphs, and one click keeps as written (after a line
    holding only \\b) as a text block."""
    lines: list[str] = []
    for paragraph in inspect.cleandoc(click.unstyle(text).split("\f")[0]).split("\n\n"):
        rows = paragraph.splitlines()
        if rows and rows[0].strip() == "\b":
            lines += ["```text", *rows[1:], "```", ""]
        elif rows:
            lines += [*map(_prose, rows), ""]
    return lines


def _walk(command: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx))


def _section(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    depth = min(len(path.split()), 4)
    lines = [f"{'#' * (depth + 1)} `{path}`", ""]
    if command.help:
        lines += _help(command.help)
    pieces = " ".join(command.collect_usage_pieces(ctx))
    lines += ["```text", f"{path} {pieces}".rstrip(), "```", ""]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        lines += ["| argument | required | takes |", "|---|---|---|"]
        for arg in arguments:
            kind = arg.type.name if not isinstance(arg.type, click.Choice) else " | ".join(arg.type.choices)
            many = ", may be given several times" if arg.nargs == -1 else ""
            lines.append(f"| `{arg.human_readable_name}` | {'yes' if arg.required else 'no'} | {_cell(kind)}{many} |")
        lines.append("")
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    records = [p.get_help_record(ctx) for p in options]
    records = [r for r in records if r]
    if records:
        lines += ["| option | what it does |", "|---|---|"]
        for names, help_text in records:
            flag = " ".join(names.split())  # in backticks: a pipe there is no column's edge
            lines.append(f"| `{flag}` | {_cell(help_text) or ' '} |")
        lines.append("")
    if isinstance(command, click.Group):
        subs = [name for name in command.list_commands(ctx)
                if (sub := command.get_command(ctx, name)) is not None and not sub.hidden]
        if subs:
            lines += ["Commands: " + ", ".join(f"`{name}`" for name in subs) + ".", ""]
    return lines


def markdown() -> str:
    from hermes_sup.supervisor.cli import main

    root = click.Context(main, info_name=PROGRAM, max_content_width=100)
    body = [INTRO]
    for command, ctx in _walk(main, root):
        body += _section(command, ctx)
    return "\n".join(body).rstrip() + "\n"


def on_files(files, config):  # mkdocs hook: the page is made at build time, never kept in docs/
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=markdown()))
    return files


if __name__ == "__main__":
    print(markdown(), end="")
