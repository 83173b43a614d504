"""What a command imports: the CLI loads a command's module only when it runs, and a look at the team
pays for nothing it does not use (a driver it has no board for, `up`'s or the config's checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, init_workspace


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    init_workspace(tmp_path / "ws")
    return tmp_path / "ws"


def test_the_command_line_imports_no_postgresql_driver_until_a_board_needs_it():
    """psycopg is the `postgres` extra's: `make up` installs without it, so a command of a file board
    must never import it (nor pay its 100 ms)."""
    code = ("import sys\nfrom hermes_sup.supervisor.cli import main\n"
            "assert not [m for m in sys.modules if m.startswith('psycopg')], sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


def test_status_imports_neither_the_config_checks_nor_the_agent_runtime(ws):
    """`status` while 256 agents start competes with them for the cores: the config's checks, the
    agent runtime's tools and the process specs (what `up` needs) are not imported for a look."""
    code = ("import sys\nfrom hermes_sup.supervisor.cli import main\n"
            "try:\n    main(['status', '--json'])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "loaded = [m for m in ('hermes_sup.supervisor.config.checks', 'hermes_sup.supervisor.spec',\n"
            "                      'hermes_sup.agents.tools', 'hermes_sup.supervisor.cli.run') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ws)
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"agents"' in done.stdout


def test_a_command_of_a_group_imports_none_of_its_siblings_modules(ws):
    """`task add` need not import what `task log` and `task wait` do (their modules import the
    timeline views and `up`'s), nor `board` what `board migrate` does; `task --help` still lists them."""
    code = ("import sys\nfrom hermes_sup.supervisor.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "loaded = [m for m in ('hermes_sup.supervisor.cli.tasklog', 'hermes_sup.supervisor.cli.steer',\n"
            "                      'hermes_sup.supervisor.cli.migrate') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    for args in (["task", "add", "a title"], ["task", "list"], ["board"]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, cwd=ws)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    helped = subprocess.run([sys.executable, "-m", "hermes_sup.supervisor", "task", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=ws)
    assert all(f"  {name} " in helped.stdout for name in ("add", "log", "wait", "comment")), helped.stdout
