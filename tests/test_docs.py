"""The documentation site: `mkdocs build --strict` succeeds (every page in the nav, no link that leads
nowhere, the command reference generated from the CLI), and the tutorials "Your first team" and "Your
first skill" run as written: their shell lines in order, in a folder of the test's, each exiting 0
and printing what its comment quotes."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, init_workspace
from .docrun import run_as_written


def test_the_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("hermes-sup task add", "hermes-sup skills new", "hermes-sup systemd-unit", "--max-attempts"):
        assert command in reference, command


def test_the_command_reference_names_every_command() -> None:
    import click

    sys.path.insert(0, str(ROOT / "docs_tools"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs_tools"))
    from hermes_sup.supervisor.cli import main

    page = cli_reference.markdown()
    ctx = click.Context(main, info_name="hermes-sup")
    for name in main.list_commands(ctx):
        assert f"`hermes-sup {name}`" in page, name


@pytest.mark.timeout(600)
def test_your_first_team_as_written(tmp_path: Path) -> None:
    assert run_as_written("tutorials/first-team.md", tmp_path) >= 12


@pytest.mark.timeout(600)
def test_your_first_skill_as_written(tmp_path: Path) -> None:
    assert run_as_written("tutorials/first-skill.md", tmp_path) >= 8


def test_the_readme_is_a_front_page_whose_links_lead_somewhere() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\((?!https?:)([^)#]+)", text):
        assert (ROOT / target).exists(), target
    assert "CONTRACT" not in text and "pip install hermes-sup" not in text


def test_a_local_prometheus_scrapes_a_team_as_the_telemetry_page_says(tmp_path: Path) -> None:
    """docs/how-to/telemetry.md's block run as one script beside a team served with its dashboard:
    Prometheus' answer holds the team's tasks. Only the two ports differ: free ones of this machine."""
    import json
    import signal
    import socket

    from .conftest import CLI

    page = (ROOT / "docs" / "how-to" / "telemetry.md").read_text()
    section = page[page.index("## A local Prometheus scraping a team"):]
    [script] = re.findall(r"```sh\n(.*?)```", section, re.S)[:1]
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    script = script.replace("127.0.0.1:8765", f"127.0.0.1:{ports[0]}")
    script = script.replace("127.0.0.1:9090", f"127.0.0.1:{ports[1]}")
    ws = tmp_path / "ws"
    init_workspace(ws)
    subprocess.run([*CLI, "-w", str(ws), "task", "add", "Counted"], check=True, capture_output=True, cwd=ROOT,
                   timeout=120)
    up = subprocess.run([*CLI, "-w", str(ws), "up", "--detach", "--dashboard", "--dashboard-port", str(ports[0])],
                        capture_output=True, text=True, cwd=ROOT, timeout=180)
    shell = None
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        # Into files, not pipes: the prometheus the script leaves running holds its output open.
        with open(tmp_path / "out", "w") as out_file, open(tmp_path / "err", "w") as err_file:
            shell = subprocess.Popen(["bash", "-c", script], cwd=ws, stdout=out_file, stderr=err_file,
                                     start_new_session=True)
            assert shell.wait(timeout=120) == 0, (tmp_path / "err").read_text()
        out = (tmp_path / "out").read_text()
        answer = json.loads(out.strip().splitlines()[-1])
        assert answer["status"] == "success" and answer["data"]["result"], answer
        assert sum(float(sample["value"][1]) for sample in answer["data"]["result"]) == 1, answer  # "Counted"
    finally:
        if shell is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)  # the script's prometheus, left running as the page says
        subprocess.run([*CLI, "-w", str(ws), "down"], capture_output=True, cwd=ROOT, timeout=120)
