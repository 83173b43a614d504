"""Runs a docs page's shell blocks as written: each command in order in a folder of the test's, exiting 0
and printing the texts its comment quotes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hermes_sup.supervisor.statefile import supervisor_alive

from .conftest import ROOT, wait_until

BIN = Path(sys.executable).parent
# A block that cannot run here says so on the page, in its first line, with the reason.
NOT_RUN = "# not run by the test suite:"


@dataclass
class Command:
    """One command of a page: its text (continuation lines included), the texts its comments quote,
    and whether it follows something until Ctrl-C."""

    text: str
    quoted: list[str] = field(default_factory=list)
    follows: bool = False


def _quoted(comment: str) -> list[str]:
    # "... (pid ...)": the parts between the ellipses, each of which must be printed.
    return [part.strip() for text in re.findall(r'"([^"]*)"', comment) for part in text.split("...") if part.strip()]


def _code(text: str) -> str:
    return "\n".join(line.partition(" # ")[0].rstrip() for line in text.splitlines())


def _complete(text: str) -> bool:
    """Whether `text` is a whole command: no line continued, no heredoc or quote left open (pure)."""
    code = _code(text)
    if code.endswith("\\"):
        return False
    heredoc = re.search(r"<<-?'?(\w+)'?", code)
    if heredoc and not re.search(rf"\n{heredoc.group(1)}$", code):
        return False
    try:
        shlex.split(code)
    except ValueError:
        return False
    return True


def block_commands(block: str) -> list[Command]:
    """A shell block's commands, with what their comments quote (pure)."""
    commands: list[Command] = []
    pending = ""
    for line in block.splitlines():
        if not pending and not line.partition(" # ")[0].strip():
            if commands and line.strip().startswith("#"):  # a comment going on from the line above
                commands[-1].quoted += _quoted(line)
            continue
        pending = f"{pending}\n{line}" if pending else line
        if _complete(pending):
            comment = pending.splitlines()[-1].partition(" # ")[2]
            commands.append(Command(pending, _quoted(comment), "Ctrl-C" in comment))
            pending = ""
    assert not pending, f"a command left open: {pending}"
    return commands


def page_blocks(page: str, section: str | None = None) -> tuple[list[list[Command]], list[str]]:
    """The page's shell blocks to run (of its `section` alone, a heading line, when given), and the
    reasons given for those not run (pure but for reading the page)."""
    text = (ROOT / "docs" / page).read_text()
    if section is not None:
        text = text[text.index(f"\n{section}\n"):]
        end = text.find("\n## ", len(section) + 2)
        text = text if end < 0 else text[:end]
    run, reasons = [], []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        first = block.splitlines()[0].strip()
        if first.startswith(NOT_RUN):
            reasons.append(first[len(NOT_RUN):].strip())
            assert reasons[-1], f"{page}: a block not run says why"
        else:
            run.append(block_commands(block))
    return run, reasons


def _flat(text: str) -> str:
    # Rich wraps at 80 columns when piped: compare words, not line breaks.
    return " ".join(text.split())


def _follow(script: str, command: Command, cwd: Path, env: dict[str, str], out: Path) -> str:
    """Runs a command that follows until Ctrl-C: until it printed what its comment quotes (or anything,
    when it quotes nothing), then Ctrl-C, which must end it cleanly."""
    with open(out, "w") as sink:
        proc = subprocess.Popen(["bash", "-c", script], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
    try:
        try:
            wait_until(lambda: (seen := _flat(out.read_text())) and all(_flat(t) in seen for t in command.quoted),
                       timeout=60, interval=0.05)
        except AssertionError:
            raise AssertionError((command.text, command.quoted, out.read_text())) from None
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    printed = _flat(out.read_text())
    assert code in (0, 130, -signal.SIGINT), (command.text, code, printed)
    return printed


def _running(ws: Path) -> bool:
    try:
        return supervisor_alive(json.loads((ws / "runs" / "supervisor.json").read_text()))
    except (OSError, ValueError):
        return False


def run_as_written(page: str, tmp_path: Path, env: dict[str, str] | None = None,
                   fill: Callable[[str, Path], str] = lambda text, cwd: text, cwd: Path | None = None,
                   section: str | None = None) -> int:
    """Runs the page's blocks in `cwd` (else `tmp_path`; a `cd` carries on to the next command);
    `fill` rewrites a command and its quoted texts before it runs (a pid the page leaves to the
    reader, a port). Returns how many ran."""
    env = {key: value for key, value in (env or os.environ).items() if key != "HERMES_SUP_WORKSPACE"}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    # A wide terminal's: the board's columns wrap their cards' lines to fit the width, splitting a quote.
    env["COLUMNS"] = "200"
    cwd, ran, where = cwd or tmp_path, 0, tmp_path / ".cwd"
    blocks, _ = page_blocks(page, section)
    try:
        for command in (command for block in blocks for command in block):
            # The shell's folder after the command, for the next one, as in a terminal.
            script = f'{fill(command.text, cwd)}\nrc=$?; pwd > "{where}"; exit $rc'
            command = Command(command.text, [fill(text, cwd) for text in command.quoted], command.follows)
            if command.follows:
                printed = _follow(script, command, cwd, env, tmp_path / ".followed")
            else:
                result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                                        timeout=240, cwd=cwd)
                printed = _flat(result.stdout + result.stderr)
                assert result.returncode == 0, (command.text, printed)
            assert "Traceback" not in printed, (command.text, printed)
            missing = [text for text in command.quoted if _flat(text) not in printed]
            assert not missing, (command.text, missing, printed)
            if where.exists():
                cwd = Path(where.read_text().strip())
            ran += 1
    finally:
        for ws in {cwd, *tmp_path.glob("*/")}:
            if _running(ws):  # a page stopped midway: the team it started
                subprocess.run([str(BIN / "hermes-sup"), "-w", str(ws), "down", "--timeout", "10"],
                               capture_output=True, env=env, timeout=60, check=False)
    return ran
