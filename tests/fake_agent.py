"""Misbehaving agent processes for the supervisor tests; `command: [python, tests/fake_agent.py, MODE]`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hermes_sup.agents.notify import NOTIFY_ENV, Notifier


def main(mode: str) -> None:
    name = json.loads(os.environ["HERMES_SUP_AGENT"])["name"]
    notifier = Notifier(os.environ.get(NOTIFY_ENV), name)
    if mode == "exit":
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(["sleep", "300"])
        print(f"grandchild {grandchild.pid}", flush=True)
        notifier.send(READY=1)
        while True:
            time.sleep(0.2)
            notifier.send(WATCHDOG=1)
    if mode == "held-stop":  # a slow shutdown the test ends: SIGTERM is noted, the exit waits for a file
        held_stop(notifier, Path(sys.argv[2]))
    if mode == "silent":  # ready once, then never heart-beats again
        notifier.send(READY=1)
        time.sleep(300)
    if mode == "hog":  # heart-beats, and holds 150 MB in a child (the limit counts the whole tree)
        subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(150 << 20); time.sleep(300)"])
        while True:
            notifier.send(WATCHDOG=1)
            time.sleep(0.2)
    if mode == "stamp-exit":  # notes when it started (in its working folder), then crashes
        with open("starts.txt", "a") as stamps:
            stamps.write(f"{time.time()}\n")
        sys.exit(3)
    if mode == "setsid":  # starts two processes that leave its session, one without its environment
        escaped = subprocess.Popen(["setsid", "sleep", "1000"])
        scrubbed = subprocess.Popen(["setsid", "env", "-i", "sleep", "1001"])
        print(f"escaped {escaped.pid} {scrubbed.pid}", flush=True)
        notifier.send(READY=1)
        while True:
            notifier.send(WATCHDOG=1)
            time.sleep(0.2)
    if mode == "ready-when":  # starting (no word to the supervisor) until the test makes the file
        while not Path(sys.argv[2]).exists():
            time.sleep(0.05)
        notifier.send(READY=1)
        mode = "beat"
    if mode == "beat":
        while True:
            notifier.send(WATCHDOG=1)
            time.sleep(0.2)


def held_stop(notifier: Notifier, folder: Path) -> None:
    """On SIGTERM, write `folder/stopping-<pid>` (the test knows the stop reached it), and go on
    heart-beating until the test writes `folder/release-<pid>`: it is stopping for exactly as long
    as the test needs, whatever the machine's load, then exits 0."""
    pid = os.getpid()
    termed = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: termed.set())
    notifier.send(READY=1)
    while not (termed.is_set() and (folder / f"release-{pid}").exists()):
        if termed.is_set():
            (folder / f"stopping-{pid}").touch()
        notifier.send(WATCHDOG=1)
        time.sleep(0.05)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
