"""The web dashboard: how soon a board transition is visible in the page, what the server costs idle, and its memory.

Run by hand: `python bench/dashboard_bench.py [--transitions 200] [--idle 30] [--clients 5] [--postgres]`,
or `python bench/dashboard_bench.py --rss [--tasks 3000] [--clients 20] [--seconds 60] [--every 0.2]
[--column-limit N]`.
It needs the system's Chromium (/usr/bin/chromium, or HERMES_SUP_CHROMIUM) and playwright (the test
extras); `--postgres` puts the board in a throw-away PostgreSQL server of its own (tests/pgserver.py).

1. Event -> visible: `hermes-sup dashboard` serves a fresh workspace; a headless Chromium shows the
   page. The bench makes one transition at a time through the board's verbs (add a task: a card
   appears in todo; cancel it: the card moves to cancelled), and a MutationObserver in the page
   stamps the moment the card is in its new column. Latency = that stamp minus the moment just before
   the verb was called (both clocks are this machine's wall clock, in ms with fractions). Each
   transition waits a random 0 to 0.25 s first, so none is in step with a polled board's looks.
2. Idle: --clients event-stream clients stay connected and nothing changes for --idle seconds: the
   server's CPU (percent of one core) and RSS.

`--rss` measures memory instead (file board; no browser): a board of --tasks tasks (94% done, 4%
cancelled, 2% in todo), tasks changing all along (a cancel or a retry every --every seconds, the
board's size kept), the server's RSS sampled every 0.5 s for --seconds with no client, then with
--clients event-stream clients (each reading everything it is sent, as a browser does, its pictures
counted), then with as many that read nothing (stalled: the server may hold what it could not send
them). Medians and maxima of the samples, and the server's CPU in each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.supervisor.config.workspace import find_workspace, open_workspace_board  # noqa: E402

DSN_ENV = "HERMES_SUP_BENCH_DASHBOARD_DSN"

CHROMIUM = os.environ.get("HERMES_SUP_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
CLI = [sys.executable, "-m", "hermes_sup.supervisor"]

# Stamps, in the page, when each card reaches each column (performance.timeOrigin + now(): wall clock
# with sub-millisecond fractions).
OBSERVER = """
window.__seen = {};
new MutationObserver(() => {
  const now = performance.timeOrigin + performance.now();
  for (const card of document.querySelectorAll('#board .card[data-id]')) {
    const key = card.closest('.column').dataset.status + ' ' + card.dataset.id;
    if (!(key in window.__seen)) window.__seen[key] = now;
  }
}).observe(document.getElementById('board'), {childList: true, subtree: true});
"""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def serve(ws: Path, *options: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([*CLI, "-w", str(ws), "dashboard", "--port", "0", *options], stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the dashboard did not start: {line}{proc.stderr.read()}")
    return proc, int(found.group(1))


def latency(ws: Path, port: int, transitions: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    results: list[float] = []
    with sync_playwright() as playwright, open_workspace_board(find_workspace(ws)) as board:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#live[data-state='live']")
        page.wait_for_selector("#board .column[data-status='todo']")
        page.evaluate(OBSERVER)
        for number in range(transitions):
            # At a random phase: a board that is polled (PostgreSQL) would otherwise be changed just
            # after each look, and every transition would wait a whole interval.
            time.sleep(random.uniform(0, 0.25))
            task_id, adding = f"bench-{number // 2}", number % 2 == 0
            started = time.time() * 1000
            if adding:
                board.add({"id": task_id, "title": f"bench {number // 2}", "role": "nobody"}, by="bench")
            else:
                board.cancel(task_id, by="bench")
            key = f"{'todo' if adding else 'cancelled'} {task_id}"
            page.wait_for_function(f"() => {json.dumps(key)} in window.__seen", timeout=30_000)
            results.append(page.evaluate(f"window.__seen[{json.dumps(key)}]") - started)
        browser.close()
    return results


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by a process and its children (PostgreSQL's postmaster and backends)."""
    total = 0.0
    try:
        parent = psutil.Process(pid)
        for process in [parent, *parent.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue  # a backend gone meanwhile
            total += times.user + times.system
    except psutil.Error:
        pass
    return total


def idle(proc: subprocess.Popen[str], port: int, clients: int, seconds: float,
         database: int | None = None) -> tuple[float, float, float | None]:
    socks = []
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        sock.recv(1 << 20)  # the headers and the first picture (enough to know it is connected)
        socks.append(sock)
    time.sleep(1.0)  # let the connections settle before measuring
    server = psutil.Process(proc.pid)
    before = server.cpu_times()
    database_before = tree_cpu(database) if database else 0.0
    time.sleep(seconds)
    after = server.cpu_times()
    database_used = 100 * (tree_cpu(database) - database_before) / seconds if database else None
    rss = server.memory_info().rss / (1 << 20)
    for sock in socks:
        sock.close()
    used = (after.user - before.user) + (after.system - before.system)
    return 100 * used / seconds, rss, database_used


def populate(ws: Path, tasks: int) -> list[str]:
    """A board of `tasks` tasks through the board's verbs: 94% done, 4% cancelled, 2% in todo (of which
    the last 20 are the ones the bench keeps changing). Returns those 20."""
    with open_workspace_board(find_workspace(ws)) as board:
        moving = []
        for number in range(tasks):
            task_id = f"t{number:05}"
            board.add({"id": task_id, "title": f"task {number} " + "x" * 40, "role": "nobody",
                       "body": "an instruction " * 20}, by="bench")
            share = number / tasks
            if share < 0.94:
                board.move(task_id, "done", by="bench")
            elif share < 0.98:
                board.cancel(task_id, by="bench")
            else:
                moving.append(task_id)
    return moving[-20:]


def change(ws: Path, moving: list[str], every: float, halt: threading.Event) -> None:
    """Cancel the moving tasks one at a time, then retry them, round and round until `halt`."""
    with open_workspace_board(find_workspace(ws)) as board:
        number = 0
        while not halt.wait(every):
            task_id = moving[number % len(moving)]
            if (number // len(moving)) % 2 == 0:
                board.cancel(task_id, by="bench")
            else:
                board.retry(task_id, by="bench")
            number += 1


def drain(socks: list[socket.socket], pictures: list[int], halt: threading.Event) -> None:
    """Read every client's stream as fast as it comes (a browser keeping up), counting the pictures."""
    import selectors

    mark = b"event: snapshot"
    tails = [b""] * len(socks)  # a mark may be split between two reads
    selector = selectors.DefaultSelector()
    for index, sock in enumerate(socks):
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, index)
    while not halt.is_set():
        for key, _mask in selector.select(0.2):
            try:
                data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            seen = tails[key.data] + data
            pictures[key.data] += seen.count(mark)
            tails[key.data] = seen[-(len(mark) - 1):]
    selector.close()


def open_streams(port: int, clients: int) -> list[socket.socket]:
    socks = []
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        socks.append(sock)
    return socks


def sample(pid: int, seconds: float) -> tuple[list[float], float]:
    """The process's RSS (MB) every 0.5 s for `seconds`, and its CPU meanwhile (% of one core)."""
    server = psutil.Process(pid)
    before = server.cpu_times()
    samples = []
    started = time.monotonic()
    while time.monotonic() < started + seconds:
        samples.append(server.memory_info().rss / (1 << 20))
        time.sleep(0.5)
    after = server.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return samples, 100 * used / (time.monotonic() - started)


def rss_run(tasks: int, clients: int, seconds: float, every: float, column_limit: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="dashboard-bench-") as folder:
        ws = Path(folder) / "ws"
        subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True)
        started = time.monotonic()
        moving = populate(ws, tasks)
        print(f"board: files, {tasks} tasks (made in {time.monotonic() - started:.0f} s); a change every {every:g} s")
        proc, port = serve(ws, *(["--column-limit", str(column_limit)] if column_limit else []))
        halt = threading.Event()
        changer = threading.Thread(target=change, args=(ws, moving, every, halt), daemon=True)
        changer.start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/snapshot", timeout=60) as answer:
                size = len(answer.read())
            print(f"one picture: {size / 1024:.0f} KiB of JSON")
            phases = [("no client", *sample(proc.pid, seconds), None)]
            socks = open_streams(port, clients)
            pictures = [0] * clients
            reading = threading.Event()
            reader = threading.Thread(target=drain, args=(socks, pictures, reading), daemon=True)
            reader.start()
            phases.append((f"{clients} clients reading", *sample(proc.pid, seconds), pictures))
            reading.set()
            reader.join()
            for sock in socks:
                sock.close()
            stalled = open_streams(port, clients)  # they never read a byte
            phases.append((f"{clients} clients stalled", *sample(proc.pid, seconds), None))
            for sock in stalled:
                sock.close()
        finally:
            halt.set()
            changer.join(timeout=30)
            proc.terminate()
            proc.wait(timeout=30)
    for name, samples, cpu, got in phases:
        extra = f"; each client got {statistics.median(got):g} pictures (median)" if got is not None else ""
        print(f"{name}, {seconds:g} s: RSS median {statistics.median(samples):.1f} MB, max {max(samples):.1f} MB; "
              f"server CPU {cpu:.0f}% of one core{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=200)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--clients", type=int, help="event-stream clients (5 idle; 20 with --rss)")
    parser.add_argument("--postgres", action="store_true", help="the board in PostgreSQL (a server of its own)")
    parser.add_argument("--rss", action="store_true", help="measure the server's memory instead (see above)")
    parser.add_argument("--tasks", type=int, default=3000, help="with --rss: the board's size")
    parser.add_argument("--seconds", type=float, default=60.0, help="with --rss: each phase's length")
    parser.add_argument("--every", type=float, default=0.2, help="with --rss: seconds between changes")
    parser.add_argument("--column-limit", type=int, help="with --rss: the dashboard's cards per column")
    options = parser.parse_args()
    if options.rss:
        rss_run(options.tasks, options.clients or 20, options.seconds, options.every, options.column_limit)
        return
    server = None
    if options.postgres:
        from tests.pgserver import start_server

        server = start_server()
        os.environ[DSN_ENV] = server.dsn  # the dashboard's process and this one's board read it
    try:
        with tempfile.TemporaryDirectory(prefix="dashboard-bench-") as folder:
            ws = Path(folder) / "ws"
            subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True)
            if options.postgres:
                with open(ws / "hermes.yaml", "a") as config:
                    config.write(f"\nboard: {{backend: postgres, dsn_env: {DSN_ENV}}}\n")
            proc, port = serve(ws)
            try:
                values = latency(ws, port, options.transitions)
                postmaster = int((server.data / "postmaster.pid").read_text().split()[0]) if server else None
                cpu, rss, database_cpu = idle(proc, port, options.clients or 5, options.idle, postmaster)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        if server is not None:
            server.stop()
    print("board: " + ("PostgreSQL" if options.postgres else "files"))
    print(f"event -> visible in the page, {len(values)} transitions: p50 {percentile(values, 0.5):.1f} ms, "
          f"p99 {percentile(values, 0.99):.1f} ms, mean {statistics.mean(values):.1f} ms, max {max(values):.1f} ms")
    print(f"idle with {options.clients or 5} clients connected for {options.idle:g} s: "
          f"server CPU {cpu:.2f}% of one core, "
          f"RSS {rss:.1f} MB" + (f"; PostgreSQL's processes {database_cpu:.2f}%" if database_cpu is not None else ""))


if __name__ == "__main__":
    main()
