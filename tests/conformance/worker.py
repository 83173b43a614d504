"""Board work in a process of its own, for the conformance suite's multi-process tests:
`python worker.py MODE KIND BOARD_DIR ...`, the board opened with backends.make_store(KIND, BOARD_DIR).

Modes: `claimer` claims and completes until nothing is left; `commenter` comments on one task;
`lifecycle` runs one task through
every kind of transition (a fault point may SIGKILL it at any step); `lifecycles` forks one
`lifecycle` per line it reads; `reader` follows the event log by cursor, resuming after the last
event it wrote down.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conformance.backends import BACKENDS, make_store

LIFE = "life"  # the task the lifecycle drives; the test drops it as inbox/life.json
SPARE = "spare"  # a lower-priority task the lifecycle claims last and cancels


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.005)


def claimer(kind: str, board_dir: str, out: str, agent: str, go: str) -> None:
    """Claim and complete until todo stays empty; write down every claim (id, token)."""
    store = make_store(kind, Path(board_dir))
    wait_for(Path(go))
    with open(out, "w") as log:
        while True:
            doc = store.claim(agent)
            if doc is None:
                if store.counts()["todo"] == 0:
                    break
                continue  # every todo task reserved by another claimer right now
            token = doc["claim"]["token"]
            log.write(json.dumps({"id": doc["id"], "token": token}) + "\n")
            log.flush()
            store.complete(doc["id"], token, {"by": agent})
    store.close()


def commenter(kind: str, board_dir: str, task_id: str, name: str, count: str, go: str) -> None:
    """Comment `count` times on one task, as fast as it can, once `go` exists."""
    store = make_store(kind, Path(board_dir))
    wait_for(Path(go))
    for index in range(int(count)):
        store.comment(task_id, f"{name}-{index}", by=name)
    store.close()


def lifecycle(kind: str, board_dir: str) -> None:
    """ingest -> claim -> fail -> claim -> release -> claim -> block on a question -> answer ->
    claim -> renew -> complete, then claim the spare and have it cancelled: every kind of
    transition a task makes (by its holder, by a person, from doing and from elsewhere), each a
    place to be killed."""
    store = make_store(kind, Path(board_dir))
    assert store.ingest().ingested == [LIFE]
    doc = store.claim("w")
    store.fail(LIFE, doc["claim"]["token"], "first attempt failed")
    doc = store.claim("w")
    store.release(LIFE, doc["claim"]["token"], "restarting")
    doc = store.claim("w")
    store.block(LIFE, doc["claim"]["token"], "needs a person", question="which one?")
    store.answer(LIFE, "the first", by="lead")
    doc = store.claim("w")
    store.renew(LIFE, doc["claim"]["token"])
    store.complete(LIFE, doc["claim"]["token"], "ok")
    doc = store.claim("w")
    assert doc["id"] == SPARE
    store.cancel(SPARE, by="lead")
    store.close()


def lifecycles(kind: str) -> None:
    """For each line read (JSON: [BOARD_DIR, FAULT]), a forked child runs `lifecycle` on BOARD_DIR with
    $HERMES_SUP_FAULT set to FAULT; the answer is a line "PID CODE" (CODE as Popen's returncode:
    -9 for a SIGKILL). The board's code is imported once, here: a fresh interpreter for each of the
    sweep's kill points cost it 0.4 s of CPU, most of the test. A child dies with this process."""
    import atexit
    import ctypes
    import signal
    import traceback

    from hermes_sup.kanban.faults import FAULT_ENV

    BACKENDS[kind].build  # noqa: B018 - the backend's modules, imported before any fork
    if kind == "postgres":
        import hermes_sup.kanban.pg.store  # noqa: F401
    for line in sys.stdin:
        board_dir, point = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
                os.environ[FAULT_ENV] = point
                lifecycle(kind, board_dir)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                atexit._run_exitfuncs()  # as a process's normal end does: its owner file goes (markers.py)
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(pid, os.waitstatus_to_exitcode(status), flush=True)


def reader(kind: str, board_dir: str, out: str) -> None:
    """Follow the event log by cursor into `out` (one JSON line per event, with the cursor after it),
    resuming after the last complete line `out` holds: the reader's cursor is what it wrote down."""
    backend = BACKENDS[kind]
    store = make_store(kind, Path(board_dir))
    path = Path(out)
    cursor = 0
    if path.exists():
        data = path.read_bytes()
        keep = data[:data.rfind(b"\n") + 1]  # a line torn by our own kill is dropped, its event read again
        if keep != data:
            os.truncate(path, len(keep))
        if keep:
            cursor = json.loads(keep.splitlines()[-1])["cursor"]
    with open(path, "a") as log:
        print("reading", flush=True)
        while True:
            batch, after = backend.read_events(store, cursor)
            for at, event in batch:
                log.write(json.dumps({"cursor": at, **event}) + "\n")
                log.flush()
            if not batch:
                time.sleep(0.005)
            cursor = after


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    {"claimer": claimer, "commenter": commenter, "lifecycle": lifecycle, "lifecycles": lifecycles,
     "reader": reader}[mode](*rest)
