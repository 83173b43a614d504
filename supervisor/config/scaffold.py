"""A new workspace: hermes.yaml (the example team or one of the bundled examples), the board's folders, and what
keeps keys and runs out of git."""

from __future__ import annotations

import os
from pathlib import Path

from .schemadoc import MODELINE, SCHEMA_FILE, json_text
from .workspace import CONFIG_NAME

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BOARD_FOLDERS = ("inbox", "todo", "doing", "blocked", "done", "failed", "cancelled", "rejected")

EXAMPLE_CONFIG = MODELINE + """
# A hermes-sup team. `hermes-sup up` in this folder runs it.
# With no API key and no local model server, the `auto` provider falls back to `offline`:
# tasks that carry `steps` still run, the others wait in todo until a provider is available.
providers:
  cloud: {kind: anthropic, model: claude-sonnet-4-5, api_key_env: ANTHROPIC_API_KEY}
  local: {kind: openai, base_url: "http://127.0.0.1:11434/v1", model: llama3.1}
tiers:
  cheap: [auto]
  standard: [auto]
  premium: [auto]
defaults:
  restart: {policy: on-failure, backoff: {initial: 0.5, max: 30}, max_restarts: 5, window: 60}
  stop_timeout: 10
  heartbeat_timeout: 60
  orphan_grace: 30
  max_rss_mb: 1024
agents:
  - name: worker
    roles: [work]
    tier: cheap
    count: 2
"""


EXAMPLE_NAMES = ("team", "research")


def scaffold(root: Path, example: bool | str = False) -> list[str]:
    """Create a workspace in `root`; keeps whatever is already there. Returns what it created.

    With `example` (True or "team"), hermes.yaml is the bundled planner/worker/reviewer team and its
    example tasks are dropped into kanban/inbox/, so the first `up` has work to show; with "research",
    the research team, its papers (two of them made into PDFs here) and report/ folder.
    """
    created = []
    root.mkdir(parents=True, exist_ok=True)
    source = EXAMPLES / "research" if example == "research" else EXAMPLES
    config = root / CONFIG_NAME
    if not config.exists():
        text = (source / CONFIG_NAME).read_text() if example else EXAMPLE_CONFIG
        # The first line points YAML-aware editors at the JSON Schema written beside it.
        config.write_text(text if text.startswith(MODELINE) else f"{MODELINE}\n{text}")
        created.append(CONFIG_NAME)
    if not (root / SCHEMA_FILE).exists():
        (root / SCHEMA_FILE).write_text(json_text())
        created.append(SCHEMA_FILE)
    if example == "research":
        created += _papers(root, source / "papers")
    for folder in [*(f"kanban/{name}" for name in BOARD_FOLDERS), "skills", "runs"]:
        path = root / folder
        if not path.is_dir():
            path.mkdir(parents=True)
            created.append(folder + "/")
    if example:
        for task in sorted(source.glob("*.json")):
            target = root / "kanban" / "inbox" / task.name
            if not target.exists():
                target.write_bytes(task.read_bytes())
                created.append(f"kanban/inbox/{task.name}")
    return created


def _papers(root: Path, source: Path) -> list[str]:
    """The research example's papers/ (a NAME.pdf.txt becomes the PDF NAME.pdf) and its report/."""
    from .pdfmake import pdf

    created = []
    for folder in ("papers", "report"):
        if not (root / folder).is_dir():
            (root / folder).mkdir()
            created.append(folder + "/")
    for paper in sorted(source.iterdir()):
        if paper.name.endswith(".pdf.txt"):
            target, data = root / "papers" / paper.name.removesuffix(".txt"), pdf(paper.read_text(), paper.stem)
        else:
            target, data = root / "papers" / paper.name, paper.read_bytes()
        if not target.exists():
            target.write_bytes(data)
            created.append(f"papers/{target.name}")
    return created


# -- who may read what ------------------------------------------------------------------------------
# The supervisor's and the agents' state (runs/): transcripts, tool and LLM-call logs, memory, agent
# logs and the control socket are the user's alone. Everything else (hermes.yaml, the board, skills)
# is readable by others as far as the umask allows, and never writable by them: under umask 000,
# anyone could otherwise rewrite hermes.yaml, whose agents' `command` runs as this user.


GITIGNORE = "# API keys, and what the agents saw and did: never committed\n.env\nruns/\n"


def keep_out_of_git(root: Path) -> list[str]:
    """Write a .gitignore that keeps .env and runs/ out of git, unless the workspace has one: a
    workspace kept in git must not publish its keys or transcripts. Returns what it created."""
    try:
        fd = os.open(root / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return []
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(GITIGNORE)
    return [".gitignore"]
