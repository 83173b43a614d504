"""The docs' "Run a team on several machines" (docs/how-to/postgres-hosts.md, once the README's
"Running a team on several machines"), run as written: its shell lines in order against the
suite's PostgreSQL server (a database of its own instead of the page's /tmp/pg server), its
workspaces under the test's temp dir instead of /tmp. What a line's comment quotes must be in what
the line printed; a comment that starts with "after" is waited for (the line run again until then)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import pgserver
from .pgserver import PgServer

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "how-to" / "postgres-hosts.md"  # the section, a page of its own
DSN_ENV = "HERMES_SUP_PG_DSN"
WAIT = 90.0  # for a line whose comment says "after ...", on a loaded machine


def readme_lines() -> list[tuple[str, list[str], bool]]:
    """The section's shell lines (continuations joined), each with the texts its comment quotes and
    whether it is waited for (pure but for reading the page)."""
    section = PAGE.read_text()
    found = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.strip():
                continue
            command, _, comment = line.partition(" # ")
            quoted = [part.strip() for text in re.findall(r'"([^"]*)"', comment)
                      for part in text.split("...") if part.strip()]
            found.append((command.strip(), quoted, comment.strip().startswith("after")))
    return found


def test_the_section_names_what_the_test_replaces() -> None:
    lines = [command for command, _, _ in readme_lines()]
    assert any(line.startswith('"$PGBIN/initdb"') for line in lines)
    assert f'export {DSN_ENV}="host=/tmp/pg port=55432 dbname=postgres user=hermes"' in lines
    assert any("board migrate --to postgres" in line for line in lines)
    assert any("xargs kill -9" in line for line in lines)


@pytest.fixture
def database(pg_server: PgServer) -> Iterator[str]:
    with pgserver.fresh_database(pg_server, "readme") as dsn:
        yield dsn


def _flat(text: str) -> str:
    # Rich wraps at 80 columns when piped: compare words, not line breaks.
    return " ".join(text.split())


@pytest.mark.timeout(600)
def test_running_a_team_on_several_machines_as_written(database: str, tmp_path: Path) -> None:
    env = {**os.environ, DSN_ENV: database, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    boxes = {"/tmp/box-a": str(tmp_path / "box-a"), "/tmp/box-b": str(tmp_path / "box-b")}
    ran = 0
    try:
        for command, quoted, waited in readme_lines():
            if "$PGBIN" in command or command.startswith("PGBIN=") or command.startswith(f"export {DSN_ENV}="):
                continue  # the page's own server: the suite's server stands in for it
            for readme_path, here in boxes.items():
                command = command.replace(readme_path, here)
            deadline = time.monotonic() + (WAIT if waited else 0)
            while True:
                result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                                        timeout=240, cwd=tmp_path)
                printed = _flat(result.stdout + result.stderr)
                missing = [text for text in quoted if _flat(text) not in printed]
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(1)  # a host's silence is measured by the database's clock: nothing to wait on here
            assert "Traceback" not in printed, (command, printed)
            assert not missing, (command, missing, printed)
            if "doctor" not in command:  # doctor exits 1 on a warning, as the offline provider is
                assert result.returncode == 0, (command, printed)
            ran += 1
        assert ran >= 20
    finally:
        for here in boxes.values():
            if Path(here).exists():
                subprocess.run([str(Path(sys.executable).parent / "hermes-sup"), "-w", here, "down", "--timeout", "10"],
                               capture_output=True, env=env, timeout=60, check=False)
