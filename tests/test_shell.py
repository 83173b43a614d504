"""hermes-sup in the user's own tools (supervisor/cli/shell.py): bash completes it for real from the script
`completion bash` prints, and the unit `systemd-unit` prints passes systemd's own check and does what it
says: its ExecStart runs the team, SIGHUP (ExecReload) reloads it, SIGTERM (KillMode=mixed) brings it
down cleanly."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import CLI, ROOT, gone, wait_until
from .test_supervisor import agent, make_ws

BIN = str(Path(CLI[0]).parent)


def complete(words: list[str]) -> list[str]:
    """What bash offers for `words` (the last one being typed), through the sourced script."""
    script = ('eval "$(hermes-sup completion bash)"; COMP_WORDS=(' + " ".join(shlex.quote(w) for w in words)
              + f"); COMP_CWORD={len(words) - 1}; COMPREPLY=(); _hermes_sup_completion hermes-sup; "
              'printf "%s\\n" "${COMPREPLY[@]}"')
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_commands_subcommands_and_choices_from_the_printed_script():
    assert complete(["hermes-sup", "ta"]) == ["task"]
    assert set(complete(["hermes-sup", "task", ""])) >= {"add", "list", "show", "log", "wait"}
    assert complete(["hermes-sup", "task", "add", "x", "--tier", ""]) == ["auto", "cheap", "standard", "premium"]
    assert complete(["hermes-sup", "completion", ""]) == ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_the_zsh_and_fish_scripts_call_hermes_sup_back_for_their_shell(shell):
    done = subprocess.run([*CLI, "completion", shell], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"_HERMES_SUP_COMPLETE={shell}_complete" in done.stdout


def test_an_unknown_shell_is_a_usage_error():
    done = subprocess.run([*CLI, "completion", "tcsh"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "tcsh" in done.stderr


def unit_of(ws: Path) -> str:
    done = subprocess.run([*CLI, "-w", str(ws), "systemd-unit"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def value(unit: str, key: str) -> str:
    [line] = [line for line in unit.splitlines() if line.startswith(f"{key}=")]
    return line.split("=", 1)[1]


def test_the_unit_passes_systemds_check_even_for_a_folder_named_with_its_specifiers(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not on this machine")
    ws = make_ws(tmp_path / "100% $HOME", "- name: worker\n", defaults="stop_timeout: 40")
    unit = unit_of(ws)
    assert value(unit, "TimeoutStopSec") == "70", "the slowest stop_timeout and a margin"
    assert value(unit, "WorkingDirectory") == str(ws).replace("%", "%%")
    assert "100%% $$HOME" in value(unit, "ExecStart")
    path = tmp_path / "hermes-sup-check.service"
    path.write_text(unit)
    checked = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_units_command_runs_the_team_its_reload_is_sighup_and_its_stop_is_sigterm(tmp_path):
    ws = make_ws(tmp_path, "- name: worker\n")
    unit = unit_of(ws)
    assert value(unit, "KillMode") == "mixed" and value(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"
    argv = shlex.split(value(unit, "ExecStart").replace("$$", "$").replace("%%", "%"))
    main = subprocess.Popen(argv, cwd=value(unit, "WorkingDirectory"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: agent(ws, "worker").get("state") == "running", timeout=60)
        pid = agent(ws, "worker")["pid"]
        with (ws / "hermes.yaml").open("a") as config:
            config.write("  - name: second\n")
        main.send_signal(signal.SIGHUP)  # systemctl reload
        wait_until(lambda: agent(ws, "second").get("state") == "running", timeout=60)
        main.send_signal(signal.SIGTERM)  # systemctl stop: KillMode=mixed signals the main process alone
        assert main.wait(timeout=int(value(unit, "TimeoutStopSec"))) == 0
        assert gone(pid)
        events = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
        assert any(e.get("event") == "reload" for e in events)
    finally:
        if main.poll() is None:
            os.killpg(main.pid, signal.SIGKILL)
            main.wait()


@pytest.mark.parametrize("name", ["team\\x2f..\\x2fother", "team\\"])
def test_a_folder_with_a_backslash_is_refused_as_systemd_would_read_another_path_or_directive(tmp_path, name):
    # systemd unescapes C escapes in ExecStart even within quotes (-w '/x/team\x2f..\x2fother' runs the
    # team of /x/other) and joins the next line to one that ends with a backslash (no ExecStart left).
    ws = make_ws(tmp_path / name, "- name: worker\n")
    done = subprocess.run([*CLI, "-w", str(ws), "systemd-unit"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode != 0 and "backslash" in done.stderr, done.stdout
    assert "ExecStart" not in done.stdout
