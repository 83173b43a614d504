"""The Landlock launcher of a confined command: `python -P -m hermes_sup.agents.confine SPEC -- ARGV`.

Where bubblewrap is missing (agents/sandbox.py), the command this process starts gives up, for itself
and all it starts, every read but of the system, the grants and the interpreter's folders, every write
but in the task's folder and the `rw` grants, and without `network` every socket; it runs with a
temporary folder of its own, which this process (left unrestricted, out of the command's reach)
removes after. It is a child subreaper: what the command leaves running, `setsid`
and double forks included, becomes its child and is killed when the command ends, or when this process
is told to stop (SIGTERM, SIGHUP, SIGINT; SIGKILL too when its parent, the agent, dies). It never runs
the command unconfined: exit status 126 and the reason when Landlock cannot be had.
SPEC is JSON: {writable, readable, shown, hidden: [path, ...], network: bool}.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from . import landlock, seccomp

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_NO_CAP_AMBIENT_RAISE and each one's lock.
_NOROOT_ALL = 0b11 | 0b1100 | (0b11 << 6)
CANNOT_CONFINE = 126


def _children() -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children") as f:
                found += [int(pid) for pid in f.read().split()]
    return found


def kill_all() -> None:
    """Kill every process below this one, those handed to it as orphans too, and reap them."""
    while True:
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _entries(folder: str) -> list[str]:
    """A folder's entries but its symlinks: a rule beneath /var/run would be one beneath /run."""
    return [name for name in os.listdir(folder) if not os.path.islink(os.path.join(folder, name))]


def rules(spec: dict, hidden: list[str]) -> list[tuple[str, int]]:
    """The Landlock rules of SPEC with `hidden` unreadable (reads the folders on the way to one)."""
    reads = landlock.readable_roots(hidden, _entries) + spec["shown"] + spec["readable"]
    full = landlock.READ | landlock.WRITE | landlock.REFER | landlock.TRUNCATE
    return ([(path, landlock.READ) for path in reads] + [(path, full) for path in spec["writable"]]
            + [(os.devnull, landlock.WRITE_FILE | landlock.TRUNCATE)])


def remove(folder: str) -> None:
    """`folder` and all the command left in it, however deep (Python 3.11's rmtree recurses, and a
    command may leave a tree thousands of folders deep)."""
    try:
        shutil.rmtree(folder, ignore_errors=True)
    except RecursionError:
        with contextlib.suppress(OSError):
            subprocess.run(["rm", "-rf", "--one-file-system", "--", folder], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)


def drop_capabilities() -> None:
    """Run by root, the command keeps no capability (raw sockets, mounts, modules...): the bounding set
    emptied and root's gain of capabilities at exec switched off, for good."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_SET_SECUREBITS, _NOROOT_ALL, 0, 0, 0)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m hermes_sup.agents.confine SPEC -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    spec, command = json.loads(argv[1]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The command's own temporary folder, in the machine's (hidden from every other command, and never
    # a leftover in a task's folder that the command may not write).
    tmp = tempfile.mkdtemp(prefix="hermes-sup-cmd-", dir="/tmp" if os.path.isdir("/tmp") else None)
    spec["writable"] = [*spec["writable"], tmp]
    try:
        # Both layers' rules are read now, here: once restricted, a process cannot list / any more.
        # This launcher stays unrestricted, so that it can remove the temporary folder after; the
        # command cannot reach it (Landlock allows no ptrace of a less confined process, and the inner
        # layer's scope no signal to it).
        outer, inner = rules(spec, spec["hidden"]), rules(spec, [*spec["hidden"], "/proc"])

        def stop(signum: int, _frame: object) -> None:
            kill_all()
            remove(tmp)
            os._exit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, stop)
        env = dict(os.environ, TMPDIR=tmp)
        home = env.get("HOME", "")
        if not home or any(home == h or home.startswith(h.rstrip("/") + "/") for h in spec["hidden"]):
            env["HOME"] = tmp
        child = os.fork()
        if child == 0:
            try:
                for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                    signal.signal(signum, signal.SIG_DFL)
                how = landlock.restrict(outer, reads=True, network=bool(spec["network"]))
                if how == "landlock" and not spec["network"]:
                    how = "landlock" if seccomp.no_network() == "seccomp" else seccomp.no_network()
                if how != "landlock":
                    print(f"refused: the command cannot be confined ({how})", file=sys.stderr)
                    os._exit(CANNOT_CONFINE)
                # A layer of the command's own: it cannot signal this launcher (which kills what it
                # leaves), nor read /proc, which without a pid namespace shows the agent's keys.
                if landlock.restrict(inner, reads=True, writes=False, network=True) != "landlock":
                    os._exit(CANNOT_CONFINE)
                drop_capabilities()
                os.execvpe(command[0], command, env)
            except OSError as exc:
                print(f"{command[0]}: {exc.strerror}", file=sys.stderr)
            os._exit(127)
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        kill_all()
        return 128 - status if status < 0 else status
    finally:
        remove(tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
