"""Worker processes for the multi-process tests; run as `python tests/workers.py MODE ...`.

Each mode does real board work in its own process so the tests can race, kill and inspect it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hermes_sup.kanban import Board, ClaimLost


def contend(root: str, out: str, agent: str) -> None:
    """Claim and complete until the board is empty; record every claim (id, token) to `out`."""
    board = Board(root)
    with open(out, "w") as log:
        empty_since = None
        while True:
            doc = board.claim(agent)
            if doc is None:
                # The board may still have tasks in doing/ held by others; stop once todo/ stays empty.
                if board.counts()["todo"] == 0:
                    if empty_since is None:
                        empty_since = time.monotonic()
                    elif time.monotonic() - empty_since > 0.2:
                        break
                continue
            empty_since = None
            token = doc["claim"]["token"]
            log.write(json.dumps({"id": doc["id"], "token": token, "t": time.monotonic()}) + "\n")
            log.flush()
            board.complete(doc["id"], token, {"by": agent})


def hold(root: str, agent: str) -> None:
    """Claim one task, say so on stdout, and hold it until killed."""
    board = Board(root)
    doc = board.wait_for_work(agent, timeout=30)
    print(json.dumps(doc["claim"] if doc else None), flush=True)
    time.sleep(3600)


def churn(root: str, agent: str) -> None:
    """Claim, complete, fail and release in a loop until killed (killed at random moments)."""
    board = Board(root)
    n = 0
    while True:
        doc = board.claim(agent)
        if doc is None:
            time.sleep(0.001)
            continue
        n += 1
        token = doc["claim"]["token"]
        try:
            if n % 3 == 0:
                board.fail(doc["id"], token, "churn")
            elif n % 3 == 1:
                board.release(doc["id"], token)
            else:
                board.renew(doc["id"], token)
                board.release(doc["id"], token)
        except ClaimLost:
            pass


def wait(root: str, agent: str, timeout: str) -> None:
    """Block in wait_for_work; print the claimed task's id and when it was claimed."""
    board = Board(root)
    # Announce only once the watcher runs: a drop made before then would be found by a rescan
    # seconds later, not by the event the test measures.
    board.start_watching()
    print("waiting", flush=True)
    doc = board.wait_for_work(agent, timeout=float(timeout))
    print(json.dumps({"id": doc["id"] if doc else None, "at": time.time(),
                      "mode": board.watcher.mode}), flush=True)
    board.close()


def step(root: str, action: str, *args: str) -> None:
    """One board call, for the fault-injection tests (HERMES_SUP_FAULT kills us part-way)."""
    board = Board(root)
    if action == "claim":
        print(json.dumps(board.claim(args[0])), flush=True)
    elif action == "complete":
        board.complete(args[0], int(args[1]), "ok")
    elif action == "ingest":
        print(json.dumps(board.ingest().as_dict()), flush=True)
    elif action == "add":
        print(json.dumps(board.add({"title": args[0]})), flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    {"contend": contend, "hold": hold, "churn": churn, "wait": wait, "step": step}[mode](*rest)
