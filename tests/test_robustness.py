"""The supervisor against its own environment: hostile local users and clients, a board lock held
elsewhere, its own process stopped, a full disk, no descriptors left, a broken reload. Each test
runs a real supervisor (`hermes-sup up`) with real agent processes."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hermes_sup.kanban import Board

from .conftest import CLI, gone, stop_process, wait_until
from .test_supervisor import FAKE, ROOT, agent, hermes, make_ws, state

NOBODY = 65534
BEAT = f"command: [{sys.executable}, {FAKE}, beat]"


class Up:
    """A running `hermes-sup up` and its log."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    """Start `hermes-sup up` (optionally with a umask or a descriptor limit); stop it after."""
    started: list[Up] = []

    def start(ws: Path, *, umask: int | None = None, nofile: int | None = None, log: Path | None = None) -> Up:
        def prepare() -> None:
            if umask is not None:
                os.umask(umask)
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        log = log or tmp_path / "up.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    preexec_fn=prepare)
        up = Up(proc, log)
        started.append(up)
        wait_until(lambda: state(ws).get("pid") == proc.pid or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, up.text()
        return up

    yield start
    for up in started:
        if up.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(up.proc.pid, signal.SIGCONT)
            stop_process(up.proc)


def control_path(ws: Path) -> Path:
    return ws / "runs" / "sockets" / "control.sock"


def ask(ws: Path, payload: bytes, timeout: float = 10.0) -> dict:
    """Send raw bytes on the control socket (closing our side) and read the one-line answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(control_path(ws)))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        return json.loads(sock.makefile("rb").readline())


def as_nobody(action: Callable[[], int]) -> int:
    """Run `action` in a forked child that has become user nobody; its return value is the exit status."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = action()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder user nobody can reach (pytest's own are 0700 root), so only our sockets' own
    permissions and checks stand in its way."""
    path = Path(tempfile.mkdtemp(prefix="hermes-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def running(ws: Path, names: list[str]) -> bool:
    return all(agent(ws, n).get("state") == "running" for n in names)


# -- 1. the sockets belong to our user -----------------------------------------------------------

def test_under_umask_000_the_sockets_are_private_and_nobody_cannot_stop_the_team(shared_tmp, launch):
    ws = make_ws(shared_tmp, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws, umask=0)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    folder = ws / "runs" / "sockets"
    assert folder.stat().st_mode & 0o777 == 0o700
    for name in ("control.sock", "notify.sock"):
        assert (folder / name).stat().st_mode & 0o777 == 0o600, name

    def stop_the_team() -> int:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(control_path(ws)))
                sock.sendall(b'{"cmd": "down"}\n')
        except PermissionError:
            return 13
        return 0

    assert as_nobody(stop_the_team) == 13
    assert sup.alive() and running(ws, ["beater"])


def test_under_umask_000_nothing_the_supervisor_or_its_agents_write_is_writable_by_others(shared_tmp, launch):
    ws = make_ws(shared_tmp, f"- name: beater\n  {BEAT}\n")
    shutil.rmtree(ws / "runs")  # made again by `up`, under its umask
    launch(ws, umask=0)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    runs = ws / "runs"
    for path in (runs, runs / "beater", runs / "beater" / "agent.log", runs / "supervisor.json"):
        assert path.stat().st_mode & 0o022 == 0, f"{path} is writable by group or others"
    # nor can another user move the socket folder aside and put one of theirs in its place
    moved = as_nobody(lambda: 0 if os.rename(runs / "sockets", runs / "mine") is None else 1)
    assert moved != 0 and (runs / "sockets" / "control.sock").exists()


def test_a_client_of_another_user_is_refused_by_its_uid(shared_tmp, launch):
    ws = make_ws(shared_tmp, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    # As if the folders were open (a mistake by hand): the peer's uid still keeps nobody out.
    os.chmod(ws / "runs", 0o755)
    os.chmod(control_path(ws).parent, 0o755)
    os.chmod(control_path(ws), 0o666)

    def stop_the_team() -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(control_path(ws)))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before we spoke
                sock.sendall(b'{"cmd": "down"}\n')
            reply = json.loads(sock.makefile("rb").readline() or b"{}")
        return 7 if reply.get("message", "").startswith("refused") else 0

    assert as_nobody(stop_the_team) == 7
    assert ask(ws, b'{"cmd": "status"}\n')["ok"] is True
    assert sup.alive() and running(ws, ["beater"]) and not state(ws)["shutting_down"]
    assert sup.text().count("refused a control connection from uid 65534") == 1


def test_heartbeats_forged_by_another_process_do_not_keep_a_hung_agent_alive(shared_tmp, launch):
    ws = make_ws(shared_tmp, f"- name: mute\n  command: [{sys.executable}, {FAKE}, silent]\n  heartbeat_timeout: 2\n")
    sup = launch(ws)
    pid = wait_until(lambda: agent(ws, "mute").get("state") == "running" and agent(ws, "mute")["pid"], timeout=30)
    notify = ws / "runs" / "sockets" / "notify.sock"
    os.chmod(ws / "runs", 0o755)  # as if the folders were open: the sender's uid must still keep nobody out
    os.chmod(notify.parent, 0o755)
    os.chmod(notify, 0o666)
    forged = f"NAME=mute\nPID={pid}\nWATCHDOG=1".encode()
    forgers = []
    for uid in (None, NOBODY):  # another process of ours (a command the agent ran), another user
        child = os.fork()
        if child == 0:
            try:
                if uid is not None:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(uid)
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                    for _ in range(400):
                        with contextlib.suppress(OSError):
                            sock.sendto(forged, str(notify))
                        time.sleep(0.05)
            finally:
                os._exit(0)
        forgers.append(child)
    try:
        wait_until(lambda: agent(ws, "mute").get("restarts", 0) >= 1, timeout=15)
        assert "(hang)" in agent(ws, "mute")["last_exit"]
        # The other user's datagrams were turned away by their uid (said once), not only by their pid.
        wait_until(lambda: "ignored a notify message from uid 65534" in sup.text(), timeout=10)
        assert sup.text().count("ignored a notify message from uid") == 1
    finally:
        for child in forgers:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def test_an_agent_that_may_not_reach_the_socket_counts_as_having_no_supervisor(shared_tmp):
    from hermes_sup.agents.notify import Notifier

    folder = shared_tmp / "private"
    folder.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(folder / "notify.sock"))
        assert as_nobody(lambda: 0 if Notifier(str(folder / "notify.sock"), "a").send(WATCHDOG=1) is False else 1) == 0


# -- 2. one client cannot stall or kill the loop -------------------------------------------------

def test_garbage_on_the_control_socket_is_answered_and_the_supervisor_lives(tmp_path, launch):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    for payload in (b"\xff\xfe{not json\n", b"[" * 200_000 + b"\n", b"[1, 2]\n", b'"down"\n',
                    b'{"cmd": "restart", "agent": ["beater"]}\n', b'{"cmd": "down", "timeout": NaN}\n',
                    b'{"cmd": "down", "timeout": -1}\n', b'{"cmd": "down", "timeout": true}\n', b""):
        reply = ask(ws, payload)
        assert reply["ok"] is False, (payload[:40], reply)
        assert sup.alive(), sup.text()
    assert not state(ws)["shutting_down"] and running(ws, ["beater"])
    assert json.loads(hermes(ws, "status", "--json").stdout)["running"] is True


def test_a_trickling_client_and_an_endless_line_do_not_delay_a_restart(tmp_path, launch):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    first = agent(ws, "beater")["pid"]
    trickler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    endless = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    done = threading.Event()

    def trickle() -> None:  # a byte now and then, never a whole line
        with contextlib.suppress(OSError):
            while not done.wait(0.2):
                trickler.send(b" ")

    dribbler = threading.Thread(target=trickle)
    try:
        trickler.connect(str(control_path(ws)))
        trickler.sendall(b'{"cmd": ')
        dribbler.start()
        endless.connect(str(control_path(ws)))
        endless.setblocking(False)
        sent = 0
        with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
            while sent < 4 << 20:  # no newline, ever
                sent += endless.send(b"x" * 65536)
        os.kill(first, signal.SIGKILL)
        # Promptly, whatever the clients do (before, the loop sat in the trickler's readline for good).
        wait_until(lambda: agent(ws, "beater").get("restarts") == 1, timeout=5)
        wait_until(lambda: running(ws, ["beater"]), timeout=30)
        # The endless line got its refusal; the trickler is dropped at its deadline.
        endless.setblocking(True)
        endless.settimeout(10)
        assert b"longer than" in endless.makefile("rb").readline()
        trickler.settimeout(10)
        assert trickler.recv(100) == b"", "closed after its deadline"
    finally:
        done.set()
        if dribbler.is_alive():
            dribbler.join(timeout=10)
        trickler.close()
        endless.close()
    assert sup.alive() and ask(ws, b'{"cmd": "status"}\n')["ok"]


# -- 3. the board lock held elsewhere ------------------------------------------------------------

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(300)
"""


def test_a_board_lock_held_by_another_process_does_not_stop_the_supervision(tmp_path, launch):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    board = Board(ws / "kanban")
    task = board.add({"title": "held by the agent"})
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    first = agent(ws, "beater")["pid"]
    claimed = board.claim("beater", pid=first)
    assert claimed is not None and claimed["id"] == task["id"]
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(ws / "kanban" / ".lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.kill(holder.pid, signal.SIGSTOP)  # a `board` command paused with Ctrl-Z
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: agent(ws, "beater").get("restarts") == 1 and running(ws, ["beater"]), timeout=15)
        assert board.get(task["id"])["status"] == "doing", "the claim waits for the lock"
        second = agent(ws, "beater")["pid"]
        os.kill(second, signal.SIGKILL)  # and again: every exit is handled while the lock is held
        wait_until(lambda: agent(ws, "beater").get("restarts") == 2 and running(ws, ["beater"]), timeout=15)
        wait_until(lambda: "board: cannot recover claims now" in sup.text(), timeout=15)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    wait_until(lambda: board.get(task["id"])["status"] == "todo", timeout=20)
    assert sup.alive()
    assert sup.text().count("board: cannot recover claims now") == 1
    wait_until(lambda: "board: recovering claims works again" in sup.text(), timeout=10)


# -- 4. the supervisor's own clock ---------------------------------------------------------------

def test_a_stopped_supervisor_does_not_kill_its_healthy_agents_when_continued(tmp_path, launch):
    names = [f"quick-{i}" for i in range(1, 5)]
    ws = make_ws(tmp_path, f"- name: quick\n  count: 4\n  {BEAT}\n  heartbeat_timeout: 3\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, names), timeout=30)
    pids = {n: agent(ws, n)["pid"] for n in names}
    os.kill(sup.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(7)  # the supervisor is what stands still here; nothing to poll for
    finally:
        os.kill(sup.proc.pid, signal.SIGCONT)
    wait_until(lambda: "did not run for" in sup.text(), timeout=10)
    deadline = time.monotonic() + 6  # two heartbeat timeouts, watched throughout
    while time.monotonic() < deadline:
        assert {n: agent(ws, n).get("pid") for n in names} == pids, sup.text()
        time.sleep(0.1)
    assert all(agent(ws, n)["restarts"] == 0 for n in names)
    # A real hang is still a hang after a gap: the clock was credited, not switched off.
    os.kill(pids["quick-1"], signal.SIGSTOP)
    wait_until(lambda: agent(ws, "quick-1").get("restarts") == 1, timeout=15)
    assert "(hang)" in agent(ws, "quick-1")["last_exit"]


# -- 5. a full disk ------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    """Write to `path` until the filesystem has no space left."""
    with open(path, "wb") as out:
        try:
            while True:
                out.write(b"\0" * (1 << 16))
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def disk_usage(root: Path) -> str:
    """Free bytes under `root` and each file's size, for a failure's message."""
    free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    sizes = {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    return f"{free} bytes free; {sizes}"


def test_a_full_disk_degrades_the_supervisor_and_it_resumes_by_itself(tmp_path, small_disk, launch):
    ws = make_ws(small_disk, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    first = agent(ws, "beater")["pid"]
    fill(small_disk / "filler")
    os.kill(first, signal.SIGKILL)
    live = lambda: ask(ws, b'{"cmd": "status"}\n')["state"]["agents"]["beater"]  # noqa: E731 - from memory
    wait_until(lambda: live()["restarts"] == 1 and live()["state"] == "running", timeout=15)
    try:
        wait_until(lambda: "cannot write supervisor.json" in sup.text(), timeout=30)
    except AssertionError:  # seen once (10 s then), in a suite beside another on 2 cores: what was there
        pytest.fail(f"no failed write said; the disk: {disk_usage(small_disk)}\n{sup.text()}")
    assert agent(ws, "beater")["pid"] == first, "the state file could not be written"
    second = live()["pid"]
    os.kill(second, signal.SIGKILL)  # still supervised, and said only once
    wait_until(lambda: live()["restarts"] == 2 and live()["state"] == "running", timeout=15)
    assert sup.alive() and sup.text().count("cannot write supervisor.json") == 1
    (small_disk / "filler").unlink()
    wait_until(lambda: agent(ws, "beater").get("restarts") == 2, timeout=15)
    # Said right after the write that worked: the line may reach the log a moment after the file.
    wait_until(lambda: "writing supervisor.json works again" in sup.text(), timeout=10)
    assert not [p.name for p in (ws / "runs").iterdir() if p.name.endswith(".tmp")], "no temp file left behind"


def read_chars(pid: int) -> int:
    """How many bytes `pid` has read so far (0 once it is gone)."""
    try:
        return psutil.Process(pid).io_counters().read_chars
    except psutil.Error:
        return 0


def test_a_full_disk_under_the_supervisors_own_log_does_not_stop_the_supervision(small_disk, launch):
    ws = make_ws(small_disk, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws, log=small_disk / "up.log")
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    good = (ws / "hermes.yaml").read_text()
    # Written while there is room: a reload of it is refused with a message of over 10 kB, more than
    # the room left in the log's last page, so that logging it needs space the disk no longer has.
    (ws / "hermes.yaml").write_text(good + f"  - name: other\n    command: [/{'a' * 5000}]\n")
    fill(small_disk / "filler")
    before = read_chars(sup.proc.pid)
    os.kill(sup.proc.pid, signal.SIGHUP)
    # Read (the config is 5 kB), so refused and logged, before the disk gets its space back.
    wait_until(lambda: not sup.alive() or read_chars(sup.proc.pid) - before > 5000, timeout=15)
    first = agent(ws, "beater")["pid"]
    os.kill(first, signal.SIGKILL)
    live = lambda: ask(ws, b'{"cmd": "status"}\n')["state"]["agents"]["beater"]  # noqa: E731 - from memory
    wait_until(lambda: live()["restarts"] == 1 and live()["state"] == "running", timeout=15)
    assert sup.alive()
    (small_disk / "filler").unlink()
    (ws / "hermes.yaml").write_text(good)
    wait_until(lambda: agent(ws, "beater").get("restarts") == 1, timeout=15)
    assert sup.alive()


# -- 6. no descriptors left ----------------------------------------------------------------------

def test_running_out_of_descriptors_while_starting_agents_is_a_failed_start_not_a_crash(tmp_path, launch):
    names = [f"many-{i}" for i in range(1, 25)]
    ws = make_ws(tmp_path, f"- name: many\n  count: 24\n  {BEAT}\n",
                 defaults="restart: {backoff: {initial: 0.2, max: 1}}\n")
    # Room for the supervisor's own descriptors (its sockets, the inotify of the drops and of the log tail,
    # the fork server's pipes) and a few agents, never for 24.
    sup = launch(ws, nofile=32)
    wait_until(lambda: "Too many open files" in sup.text(), timeout=30)

    def degraded() -> bool:  # the ones that fit run, the others wait to be started again
        agents = state(ws).get("agents", {}).values()
        return any(a["state"] == "running" for a in agents) and any(
            a["state"] == "backoff" and a["last_exit"] == "could not start: Too many open files" for a in agents)

    wait_until(degraded, timeout=30)
    assert sup.alive(), sup.text()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    psutil.Process(sup.proc.pid).rlimit(psutil.RLIMIT_NOFILE, (min(1024, hard), hard))  # descriptors come back
    wait_until(lambda: running(ws, names), timeout=60)
    assert sup.alive()


# -- 7. a broken reload --------------------------------------------------------------------------

def test_a_reload_that_raises_anything_is_refused_and_the_team_keeps_running(tmp_path, launch):
    ws = make_ws(tmp_path, f"- name: beater\n  {BEAT}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)
    pid = agent(ws, "beater")["pid"]
    good = (ws / "hermes.yaml").read_text()
    (ws / "hermes.yaml").write_text("agents: " + "[" * 2000 + "]" * 2000 + "\n")  # deeper than the parser
    refused = hermes(ws, "reload")
    assert refused.returncode == 2 and "unchanged" in refused.stderr, refused.stdout + refused.stderr
    os.kill(sup.proc.pid, signal.SIGHUP)  # the same by signal
    wait_until(lambda: sup.text().count("reload refused") >= 1, timeout=10)
    assert sup.alive() and agent(ws, "beater")["pid"] == pid
    # A command path longer than PATH_MAX: the check that it is runnable raises OSError (ENAMETOOLONG),
    # not a ConfigError; whatever the checks raise must be refused the same way.
    (ws / "hermes.yaml").write_text(good + f"  - name: other\n    command: [/{'a' * 5000}]\n")
    refused = hermes(ws, "reload")
    assert refused.returncode == 2 and "reload refused, the team is unchanged" in refused.stderr, refused.stderr
    assert sup.alive() and agent(ws, "beater")["pid"] == pid and "other" not in state(ws)["agents"]
    (ws / "hermes.yaml").write_text(good.replace("heartbeat_timeout: 30", "heartbeat_timeout: 20"))
    assert hermes(ws, "reload").returncode == 0
    wait_until(lambda: running(ws, ["beater"]) and agent(ws, "beater")["pid"] != pid, timeout=30)


# -- what an agent can leave in its own folder ----------------------------------------------------

def test_an_agent_log_replaced_by_a_fifo_or_a_symlink_does_not_block_or_redirect_the_restart(tmp_path, launch):
    # `link` is a real agent: it prints a line as it starts, which a followed symlink would carry away.
    ws = make_ws(tmp_path, f"- name: fifo\n  {BEAT}\n- name: link\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["fifo", "link"]), timeout=30)
    elsewhere = tmp_path / "not-a-log"
    elsewhere.write_text("untouched\n")
    for name in ("fifo", "link"):
        log = ws / "runs" / name / "agent.log"
        log.unlink()
        os.mkfifo(log) if name == "fifo" else log.symlink_to(elsewhere)
    pids = {name: agent(ws, name)["pid"] for name in ("fifo", "link")}
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(agent(ws, n).get("restarts") == 1 and agent(ws, n).get("state") == "running"
                           for n in pids), timeout=15)
    wait_until(lambda: "link: ready" in (ws / "runs" / "link" / "agent.log").read_text(), timeout=15)
    assert sup.alive() and elsewhere.read_text() == "untouched\n"
    for name in pids:
        log = ws / "runs" / name / "agent.log"
        assert log.is_file() and not log.is_symlink()
        assert [p for p in log.parent.iterdir() if p.name.startswith("agent.log.suspect-")], "set aside, not lost"


def _pidfd_of(sup_pid: int, pid: int) -> int:
    """The descriptor number of the supervisor's pidfd for `pid`."""
    for entry in os.listdir(f"/proc/{sup_pid}/fdinfo"):
        with contextlib.suppress(OSError):
            if f"Pid:\t{pid}\n" in Path(f"/proc/{sup_pid}/fdinfo/{entry}").read_text():
                return int(entry)
    raise AssertionError(f"the supervisor holds no pidfd for {pid}")


def _lowest_free_fd(pid: int) -> int:
    used = {int(entry) for entry in os.listdir(f"/proc/{pid}/fd")}
    return min(set(range(len(used) + 1)) - used)


def _starve(pid: int, keep_out: int) -> None:
    """Lower `pid`'s descriptor limit so that it can open nothing, even once descriptor `keep_out`
    is closed: the limit at or below both the lowest free descriptor and `keep_out`. Checked after
    setting, as a file the process had open for a moment may have hidden a free descriptor."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for _ in range(50):
        limit = min(_lowest_free_fd(pid), keep_out)
        psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE, (limit, hard))
        if _lowest_free_fd(pid) >= limit:
            return
    raise AssertionError("could not starve the supervisor of descriptors")


def test_an_agent_exiting_with_no_descriptors_left_neither_kills_the_supervisor_nor_spares_its_leftovers(
        tmp_path, launch):
    escaper = f"- name: escaper\n  command: [{sys.executable}, {FAKE}, setsid]\n"
    ws = make_ws(tmp_path, f"{escaper}- name: beater\n  {BEAT}\n",
                 defaults="restart: {backoff: {initial: 0.2, max: 1}}\n")
    sup = launch(ws)
    wait_until(lambda: running(ws, ["escaper", "beater"]), timeout=30)
    log = ws / "runs" / "escaper" / "agent.log"
    line = wait_until(lambda: next((x for x in log.read_text().splitlines() if x.startswith("escaped ")), None),
                      timeout=30)
    escaped = int(line.split()[1])  # left the agent's session, still carries its marker
    first = agent(ws, "escaper")["pid"]
    # Not one descriptor to spare, not even once the exited agent's own pidfd is closed: every scan of
    # /proc the exit brings fails with EMFILE.
    _starve(sup.proc.pid, _pidfd_of(sup.proc.pid, first))
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: sup.text().count("could not start: Too many open files") >= 3 or not sup.alive(), timeout=30)
    assert sup.alive(), sup.text()
    assert sup.text().count("cannot read /proc") == 1, sup.text()  # said once, however often retried
    assert not gone(escaped), "nothing could be read: the leftover is still there, awaiting a retry"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    psutil.Process(sup.proc.pid).rlimit(psutil.RLIMIT_NOFILE, (min(1024, hard), hard))  # descriptors come back
    wait_until(lambda: gone(escaped), timeout=30)
    wait_until(lambda: "reading /proc works again" in sup.text(), timeout=30)
    wait_until(lambda: running(ws, ["escaper", "beater"]) and agent(ws, "escaper")["pid"] != first, timeout=30)
    assert sup.alive()


# -- 8. a deep workspace -------------------------------------------------------------------------

def test_a_workspace_deeper_than_a_unix_socket_path_runs_and_answers_its_commands(tmp_path, launch):
    deep = tmp_path / ("deep-" * 16)
    deep.mkdir()
    ws = make_ws(deep, f"- name: beater\n  {BEAT}\n")
    assert len(os.fsencode(control_path(ws))) > 108, "deeper than sun_path holds"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)

    sup = launch(ws)
    wait_until(lambda: running(ws, ["beater"]), timeout=30)  # its heartbeats reach the notify socket
    first = agent(ws, "beater")["pid"]
    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["running"] and document["supervisor_pid"] == sup.proc.pid  # asked over the control socket
    restarted = cli("restart", "beater")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    wait_until(lambda: running(ws, ["beater"]) and agent(ws, "beater")["pid"] != first, timeout=30)
    stopped = cli("down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert sup.proc.wait(timeout=60) == 0, sup.text()
