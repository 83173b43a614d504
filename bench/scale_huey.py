"""huey 3.5 (SqliteHuey in WAL, a synchronous commit per task) draining file-writing tasks with N worker processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.scale_wait import wait_drained

HERE = Path(__file__).resolve().parent
# Installed on first use, as supervisor_bench.py does with supervisord: huey is never a dependency of hermes-sup.
HUEY_VENV = HERE / ".venv-huey"
HUEY_REQUIREMENT = "huey>=3.5,<3.6"
START_TIMEOUT = 120.0

# The queue and its one task. The task writes what an agent's write_file step writes: a small text
# file, through a temp file renamed into place, not fsync'd (agents/files.py's write_file); the
# queue's own commits are fsync'd (synchronous=FULL), as the board's are.
TASKS_MODULE = '''\
import os
from huey import SqliteHuey

huey = SqliteHuey("scale", filename=os.environ["SCALE_HUEY_DB"], fsync=True, journal_mode="wal", results=False)
OUT = os.environ["SCALE_HUEY_OUT"]


@huey.task()
def write_file(task_id, content):
    tmp = os.path.join(OUT, "." + task_id + ".tmp")
    with open(tmp, "w") as f:
        f.write(content)
    os.rename(tmp, os.path.join(OUT, task_id + ".txt"))
'''

PRODUCER = '''\
import json, sys, time
from scale_huey_tasks import write_file
count, prefix, stamp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
started = time.time()
for n in range(count):
    write_file(f"{prefix}{n:06d}", "done\\n")
with open(stamp, "w") as f:
    json.dump({"first_enqueue": started, "enqueued": time.time()}, f)
'''


def ensure_huey() -> Path:
    """The bench-only virtualenv's python, with huey installed from the package registry."""
    python = HUEY_VENV / "bin" / "python"
    if not (HUEY_VENV / "bin" / "huey_consumer").exists():
        subprocess.run([sys.executable, "-m", "venv", str(HUEY_VENV)], check=True)
        subprocess.run([str(HUEY_VENV / "bin" / "pip"), "install", "--quiet", HUEY_REQUIREMENT], check=True)
    return python


def huey_version() -> str:
    done = subprocess.run([str(ensure_huey()), "-c", "import huey; print(huey.__version__)"], capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


class HueyDrain:
    """One huey consumer with `workers` processes, on a queue of its own in `folder`."""

    def __init__(self, folder: Path, workers: int) -> None:
        self.python = ensure_huey()
        self.folder = folder
        self.workers = workers
        self.out = folder / "out"
        self.out.mkdir(parents=True)
        (folder / "scale_huey_tasks.py").write_text(TASKS_MODULE)
        (folder / "producer.py").write_text(PRODUCER)
        self.env = {**os.environ, "SCALE_HUEY_DB": str(folder / "huey.db"), "SCALE_HUEY_OUT": str(self.out),
                    "PYTHONPATH": str(folder)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Polling at most every 0.1 s when the queue is empty (huey's default backs off to 10 s), so
        # an idle worker meets the first drop about as soon as an agent woken by the board does.
        consumer = HUEY_VENV / "bin" / "huey_consumer"
        self.proc = subprocess.Popen(
            [str(self.python), str(consumer), "scale_huey_tasks.huey", "-k", "process", "-w", str(self.workers),
             "-d", "0.01", "-m", "0.1", "-n", "-C", "-q", "-l", str(self.folder / "consumer.log")],
            cwd=self.folder, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while len(self._workers()) < self.workers:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"huey's consumer did not start {self.workers} workers "
                                   f"(see {self.folder / 'consumer.log'})")
            time.sleep(0.05)
        time.sleep(0.5)  # every worker past its imports and in its first poll

    def _workers(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children() if self.proc else []
        except psutil.Error:
            return []

    def drain(self, count: int, prefix: str, poll: float) -> dict[str, float]:
        """Enqueue `count` tasks and time them from the first enqueue to the last file written."""
        stamp = self.folder / f"{prefix}stamp.json"
        producer = subprocess.Popen([str(self.python), str(self.folder / "producer.py"), str(count), prefix,
                                     str(stamp)], cwd=self.folder, env=self.env)
        def producing() -> None:
            if producer.poll() not in (None, 0):
                raise RuntimeError(f"huey's producer exited {producer.returncode}")

        try:
            wait_drained(lambda: _done(self.out, prefix), count, poll, f"huey, {self.workers} worker(s)", producing)
            producer.wait(timeout=START_TIMEOUT)
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        first = json.loads(stamp.read_text())["first_enqueue"]
        last = max(entry.stat().st_mtime for entry in os.scandir(self.out) if entry.name.startswith(prefix))
        seconds = max(last - first, 1e-6)
        return {"seconds": seconds, "per_second": count / seconds}

    def stop(self) -> None:
        """SIGTERM to the consumer's whole group (its workers with it), SIGKILL if it lingers."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # a worker left behind by its parent
        self.proc = None


def _done(out: Path, prefix: str) -> int:
    """How many of this drain's files are written: one listing, no stat of each."""
    return sum(1 for entry in os.scandir(out) if entry.name.startswith(prefix))


def huey_rate(folder: Path, workers: int, count: int, poll: float) -> dict[str, float]:
    """One drain of `count` tasks by a fresh consumer of `workers` processes."""
    drain = HueyDrain(folder, workers)
    try:
        drain.start()
        return drain.drain(count, "h-", poll)
    finally:
        drain.stop()
