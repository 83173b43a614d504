"""The wheel as a user installs it: one import name, beside openai-agents and supervisord, with the
bundled skills and the example team, run outside the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT, wait_until

# `make test` (and `make test-latest`) download these two wheels (no dependencies) into the virtual
# environment that runs the suite: the suite itself never reaches a package index.
WHEELHOUSE = next((path for path in (Path(sys.prefix) / "wheelhouse", ROOT / ".venv" / "wheelhouse") if path.is_dir()),
                  ROOT / ".venv" / "wheelhouse")
NEIGHBOURS = ("openai_agents-", "supervisor-")
SKIP_IN_COPY = {".git", ".venv", ".venv-latest", ".venv-lock", "build", "dist", "runs", ".pytest_cache",
                ".ruff_cache", "__pycache__"}


def neighbour_wheels() -> list[Path]:
    wheels = [next(iter(sorted(WHEELHOUSE.glob(f"{prefix}*.whl"))), None) for prefix in NEIGHBOURS]
    if None in wheels:
        message = f"no openai-agents/supervisor wheels in {WHEELHOUSE}: `make test` downloads them"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [wheel for wheel in wheels if wheel is not None]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our wheel, built from a copy of the checkout (a build/ folder in the checkout could carry stale
    files into it)."""
    base = tmp_path_factory.mktemp("build")
    source = base / "src"

    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name in SKIP_IN_COPY or name.endswith(".egg-info")}
        if Path(folder).name == "kanban":
            # The board's contents; kanban/pg (a package of the code) is kept.
            skipped |= {name for name in names
                        if (Path(folder) / name).is_dir() and not (Path(folder) / name / "__init__.py").exists()}
        return skipped

    shutil.copytree(ROOT, source, ignore=ignore, symlinks=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(base / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    return next((base / "dist").glob("hermes_sup-*.whl"))


def test_the_wheel_owns_one_import_name_and_carries_the_skills_and_the_example(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"hermes_sup"}
    for shipped in ("hermes_sup/skills/data_tools.py", "hermes_sup/skills/code_review/SKILL.md",
                    "hermes_sup/examples/hermes.yaml", "hermes_sup/examples/weekly-report.json",
                    "hermes_sup/agents/__main__.py", "hermes_sup/supervisor/__main__.py",
                    "hermes_sup/supervisor/dashboard/app.py", "hermes_sup/supervisor/dashboard/static/index.html",
                    "hermes_sup/supervisor/dashboard/static/app.js", "hermes_sup/supervisor/dashboard/static/app.css",
                    "hermes_sup/kanban/pg/store.py"):
        assert shipped in names, shipped


def test_installed_beside_openai_agents_and_supervisord_it_runs_the_example_team_outside_the_repo(
        wheel: Path, tmp_path: Path) -> None:
    neighbours = neighbour_wheels()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    python, cli = venv / "bin" / "python", venv / "bin" / "hermes-sup"
    # Our dependencies come from the suite's own environment, appended after the new venv's
    # site-packages by a .pth line, so nothing is downloaded and what we install here wins.
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    (fresh_site / "zz_suite_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    for package in (wheel, *neighbours):  # ours first: the others must not overwrite it
        subprocess.run([*pip, str(package)], check=True, capture_output=True, timeout=120)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "HERMES_SUP_WORKSPACE") and not key.endswith(("_API_KEY", "_TOKEN"))}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(cli), *args], cwd=outside, env=env, capture_output=True, text=True, timeout=120)
        assert not check or done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    # Each import name is its owner's: `agents` is openai-agents', `supervisor` supervisord's.
    owners = subprocess.run([str(python), "-P", "-c",
                             "import importlib.util as u; print(u.find_spec('agents').origin); "
                             "print(u.find_spec('supervisor').origin); print(u.find_spec('hermes_sup.kanban').origin)"],
                            cwd=outside, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert owners[0].endswith("site-packages/agents/__init__.py") and str(venv) in owners[0]
    assert "supervisord" in " ".join(p.name for p in Path(owners[1]).parent.iterdir())
    assert str(venv) in owners[2]

    team = outside / "team"
    run("init", "--example", str(team))
    assert sorted(p.name for p in (team / "kanban" / "inbox").iterdir()) == ["onboarding-guide.json",
                                                                                "weekly-report.json"]
    skills = json.loads(run("-w", str(team), "skills", "list", "--json").stdout)
    assert {"data_tools", "summarize", "web_fetch", "code_review"} <= {s["name"] for s in skills["skills"]}

    # Removing supervisord must leave us whole.
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", "supervisor"], check=True,
                   capture_output=True, timeout=120)
    run("-w", str(team), "up", "--detach")
    try:
        def done_ids() -> set[str]:
            tasks = json.loads(run("-w", str(team), "task", "list", "--json").stdout)["tasks"]
            return {t["id"] for t in tasks if t["status"] == "done"}

        expected = {"weekly-report", "weekly-north", "weekly-south", "weekly-review"}
        wait_until(lambda: expected <= done_ids(), timeout=90)
        review = json.loads(run("-w", str(team), "task", "show", "weekly-report", "--json").stdout)
        assert "reviewed: both regions are summed up" in json.dumps(review)  # the reviewer's comment
    finally:
        run("-w", str(team), "down", "--timeout", "10", check=False)
    status = json.loads(run("-w", str(team), "status", "--json").stdout)
    assert status["running"] is False


def test_no_module_imports_the_folders_by_their_repository_names() -> None:
    """In the repository the folders are importable as top-level names too (tests/ puts the checkout
    on sys.path); installed they are not, and `agents`/`supervisor` are other projects' names. Hidden
    folders are not ours: the benches install supervisord (its package is `supervisor`) into
    bench/.venv-supervisord."""
    pattern = re.compile(r"^\s*(from|import)\s+(agents|kanban|supervisor)\b", re.MULTILINE)
    offenders = [f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
                 for folder in ("agents", "kanban", "supervisor", "skills", "tests", "bench")
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
                 for match in pattern.finditer(path.read_text())]
    assert offenders == []
