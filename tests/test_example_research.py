"""`hermes-sup init --example research`, run as the README's walkthrough runs it: offline, the digest's
steps read two PDFs and two Markdown papers from a read-only folder into report/, and a review gathers
every finding; the LLM task waits for a provider; the papers are never written."""

from __future__ import annotations

import hashlib
import json
import subprocess

from hermes_sup.kanban import Board, TaskNotFound

from .conftest import CLI, ROOT, wait_until

FINDINGS = ("12% above the model's forecast", "1.1 degrees C", "0.3 tonnes of carbon", "91% of the lithium")


def test_the_research_example_reads_its_papers_into_a_report_offline(tmp_path, up):
    ws = tmp_path / "research"
    made = subprocess.run([*CLI, "init", "--example", "research", str(ws), "--json"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    created = json.loads(made.stdout)["created"]
    assert {"papers/tidal-energy.pdf", "papers/urban-heat.pdf", "papers/soil-carbon.md", "report/",
            "kanban/inbox/research-digest.json", "kanban/inbox/research-report.json"} <= set(created)
    assert (ws / "papers" / "tidal-energy.pdf").read_bytes().startswith(b"%PDF-")
    papers = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ws / "papers").iterdir()}
    up(ws)
    board = Board(ws / "kanban")
    def finished(task_id: str):
        try:
            doc = board.get(task_id)
        except TaskNotFound:  # the planner has not made it yet
            return None
        return doc if doc["status"] in ("done", "failed", "blocked") else None

    review = wait_until(lambda: finished("review-digest"), timeout=120)
    assert review["status"] == "done", review.get("error")
    gathered = json.dumps(review["result"])
    assert all(finding in gathered for finding in FINDINGS), gathered
    assert gathered.count("Finding:") == 8, "two findings of each of the four papers"
    for short in ("tidal", "heat", "soil", "battery"):
        assert "Finding:" in (ws / "report" / f"{short}.txt").read_text()
    assert "[page 1]" in (ws / "report" / "tidal.txt").read_text(), "read from the PDF"
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (ws / "papers").iterdir()} == papers
    assert board.get("research-report")["status"] == "todo", "the model's task waits for a provider"


def test_init_example_still_takes_a_folder_after_it(tmp_path):
    done = subprocess.run([*CLI, "init", "--example", str(tmp_path / "team")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "planner" in (tmp_path / "team" / "hermes.yaml").read_text()
    assert (tmp_path / "team" / "kanban" / "inbox" / "weekly-report.json").exists()
    wrong = subprocess.run([*CLI, "init", str(tmp_path / "x"), "--example", "nonesuch"], cwd=ROOT, capture_output=True,
                           text=True)
    assert wrong.returncode == 2 and "no example named 'nonesuch'" in wrong.stderr


def test_a_made_pdf_gives_its_text_back_as_written():
    import runpy

    from hermes_sup.agents import builtins  # noqa: F401 - registered before: not into the collection below
    from hermes_sup.agents.tools import collecting
    from hermes_sup.supervisor.pdfmake import pdf

    with collecting():  # the skill's tool is registered there, not among the built-ins
        pdf_pages = runpy.run_path(str(ROOT / "skills" / "extract_text.py"))["pdf_pages"]
    text = "a (bracketed) word, a back\\slash, 12% and 1.1 degrees"
    pages, count = pdf_pages(pdf(text + "\n" + "\n".join(f"line {i}" for i in range(60))))
    assert count == 2 and pages[0].splitlines()[0] == text
