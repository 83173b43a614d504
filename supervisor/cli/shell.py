"""hermes-sup in the user's own tools: `completion bash|zsh|fish` (the shell's completion script) and
`systemd-unit` (a systemd user unit that keeps the team up for days)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from ..config.workspace import load_config
from ..spec import build_specs
from .common import Failure, command, handled, workspace_of

PROGRAM = "hermes-sup"
COMPLETE_VAR = "_HERMES_SUP_COMPLETE"  # click's variable for this program: _{PROG_NAME}_COMPLETE
SHELLS = ("bash", "zsh", "fish")
STOP_MARGIN = 30  # seconds systemd waits beyond the slowest agent's stop_timeout before SIGKILL


@command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print SHELL's completion script for hermes-sup: commands, options and choices complete.

    \b
    bash:  eval "$(hermes-sup completion bash)"   (in ~/.bashrc)
    zsh:   eval "$(hermes-sup completion zsh)"    (in ~/.zshrc)
    fish:  hermes-sup completion fish > ~/.config/fish/completions/hermes-sup.fish
    """
    root = ctx.find_root().command
    found = get_completion_class(shell)
    assert found is not None  # every name of SHELLS is one of click's
    click.echo(found(root, {}, PROGRAM, COMPLETE_VAR).source())


def program_argv() -> list[str]:
    """How systemd should start this hermes-sup: the installed script beside this Python when there is
    one (a virtual environment's), else this Python running the package."""
    script = Path(sys.executable).with_name(PROGRAM)
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which(PROGRAM)
    return [os.path.abspath(found)] if found else [sys.executable, "-m", "hermes_sup.supervisor"]


def unit_text(root: Path, argv: list[str], stop_seconds: float) -> str:
    """The unit (pure): `up` in the foreground as the main process; SIGTERM is `down` (the supervisor
    stops its agents within their stop_timeout, then exits 0), SIGHUP is `reload`, and only what is
    left after the timeout is SIGKILLed (KillMode=mixed)."""
    start = shlex.join([*argv, "-w", str(root), "up"]).replace("%", "%%").replace("$", "$$")
    where = str(root).replace("%", "%%")  # systemd expands %-specifiers in every value, $ in commands
    return f"""[Unit]
Description=hermes-sup: the team of {where}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
WorkingDirectory={where}
ExecStart={start}
ExecReload=/bin/kill -HUP $MAINPID
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec={int(stop_seconds) + STOP_MARGIN}
Restart=on-failure
RestartSec=5
Environment=PYTHONUNBUFFERED=1

[Install]
WantedBy=default.target
"""


@command("systemd-unit")
@click.pass_context
@handled
def systemd_unit(ctx: click.Context) -> None:
    """Print a systemd user unit that runs this workspace's team (`up` in the foreground).

    \b
    hermes-sup systemd-unit > ~/.config/systemd/user/hermes-sup.service
    systemctl --user daemon-reload && systemctl --user enable --now hermes-sup
    loginctl enable-linger "$USER"   # keep it running after you log out
    """
    ws = workspace_of(ctx)
    if any(char in str(ws.root.resolve()) for char in "\n\r"):
        raise Failure(f"{ws.root!r}: a folder whose path holds a line break cannot be named in a unit file")
    if "\\" in str(ws.root.resolve()):
        # systemd reads a backslash as an escape in ExecStart (`\x2f` is a `/`: `-w` would name another
        # folder than WorkingDirectory) and, at the end of a line, as a continuation (the next
        # directive joins the value): no spelling of it means the same in every directive.
        raise Failure(f"{ws.root!r}: a folder whose path holds a backslash cannot be named in a unit file "
                      "(systemd reads it as an escape)")
    specs = build_specs(load_config(ws.config_path), ws.root)
    slowest = max((spec.stop_timeout for spec in specs), default=10.0)
    click.echo(unit_text(ws.root.resolve(), program_argv(), slowest), nl=False)
