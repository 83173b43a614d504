"""The type checker (mypy) over the board (kanban/) and the supervisor's core, as `make test` runs it:
clean. The folders install as `hermes_sup.*`, so it checks them through a tree of that name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The supervisor's core: its top-level modules (the process supervisor itself), not its subpackages.
CORE = sorted(f"hermes_sup.supervisor.{path.stem}" for path in (ROOT / "supervisor").glob("*.py")
              if not path.stem.startswith("__"))


def test_mypy_finds_no_error_in_the_board_or_the_supervisors_core(tmp_path: Path) -> None:
    tree = tmp_path / "hermes_sup"
    tree.mkdir()
    for package in ("kanban", "agents", "supervisor"):
        (tree / package).symlink_to(ROOT / package, target_is_directory=True)
    modules = [arg for name in CORE for arg in ("-m", name)]
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--cache-dir", str(tmp_path / "cache"), "-p", "hermes_sup.kanban", *modules],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
