"""Where a `terminal` command runs: confined by bubblewrap, else by Landlock, else not at all only when
hermes.yaml says `sandbox: none` for the agent (CONTRACT.md section 12).

Confined, a command writes only in its task's folder and the `rw` grants; it reads the system and its
grants, never the workspace (`.env`, the other tasks' and agents' folders, the board, the supervisor's
sockets), the home folders, or other processes' temporary files; without the `network` capability it
has no network. Under bubblewrap it runs in namespaces of its own (mounts, pids, network, ipc), so what
it starts, `setsid` and double forks included, dies with it; under Landlock a launcher
(agents/confine.py) gives up those rights and, as a child subreaper, kills what the command left behind
(with seccomp taking every socket, named unix ones too, from a command without `network`; chmod
stays, and with `network` named unix sockets do: `doctor` says so).
The plan is data (`Confinement`), the argument lists pure functions of it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("auto", "bubblewrap", "landlock", "none")
# Folders of the machine that may hold someone's files or sockets: never shown to a command, but for
# what is granted and the interpreter that runs it.
PRIVATE = ("/home", "/root", "/tmp", "/var/tmp", "/run", "/var/run", "/mnt", "/media", "/srv", "/dev/shm",
           "/dev/mqueue")
TMP_BYTES = 512 << 20  # of the command's own /tmp (memory: a tmpfs)


class SandboxRefused(RuntimeError):
    """No confinement the agent's `sandbox` allows can be had here; the words say why."""


@dataclass(frozen=True)
class Confinement:
    """What one command may use: all paths absolute and resolved."""
    cwd: Path
    writable: tuple[Path, ...]                 # the task's folder and the rw grants
    readable: tuple[Path, ...] = ()            # the ro grants
    hidden: tuple[Path, ...] = ()              # PRIVATE, $HOME and the workspace
    shown: tuple[Path, ...] = ()               # under a hidden folder, shown read-only (the interpreter)
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)


def _inside(path: Path, root: Path) -> bool:
    # By their text where both are absolute (a command's plan asks this hundreds of times, and
    # `Path.parents` made a skill call spend 20 ms here); pathlib's way for anything else.
    inner, outer = str(path), str(root)
    if all(text.startswith("/") and not text.startswith("//") for text in (inner, outer)):
        return inner == outer or inner.startswith(outer if outer.endswith("/") else outer + "/")
    return path == root or root in path.parents


def plan(cwd: Path, task_folder: Path, grants: Iterable[tuple[Path, bool]], *, workspace: Path | None,
         network: bool, env: Mapping[str, str], home: str | None = None, interpreter: Sequence[str] = (),
         private: Sequence[str] = PRIVATE, library: Sequence[Path] = (), own_writable: bool = True,
         conceal: Sequence[Path] = ()) -> Confinement:
    """The confinement of a command run in `cwd` for a task whose folder is `task_folder`, with the
    agent's grants ((path, writable) pairs) (pure). `interpreter`: folders under a hidden one a command
    may still run things from (the Python running the agent, its PATH), shown read-only unless they
    hold something hidden on purpose (the workspace, a home folder itself). `library`: folders that
    hold our own code alone (agents/skillproc.py's copy), shown read-only wherever they are.
    `own_writable` False: the task's folder is read-only too (a skill's tool without fs.write).
    `conceal`: folders hidden too wherever they are (grants this command is not given, where the
    workspace's runs/ and kanban/ really are), unless one is given."""
    hidden = [Path(p) for p in private]
    if home and os.path.isabs(home) and Path(home) != Path("/"):
        hidden.append(Path(home))
    if workspace is not None:
        hidden.append(workspace)
    grants = list(grants)
    given = {path for path, _ in grants} | {task_folder}
    hidden += [Path(p) for p in conceal if Path(p) not in given and os.path.isabs(p)]
    own = [task_folder]
    writable = (own if own_writable else []) + [path for path, rw in grants if rw]
    readable = ([] if own_writable else own) + [path for path, rw in grants if not rw]
    kept = [Path(p) for p in private] + ([Path(home)] if home else [])
    candidates = {Path(p) for p in interpreter if os.path.isabs(p)}
    shown = sorted({p for p in candidates
                    if any(_inside(p, h) for h in hidden)
                    and not any(_inside(h, p) for h in hidden)
                    and p not in kept
                    and not (workspace is not None and _inside(p, workspace) and not _venv(p, workspace))}
                   | {Path(p) for p in library})
    return Confinement(cwd=cwd, writable=tuple(writable), readable=tuple(readable), hidden=tuple(hidden),
                       shown=tuple(shown), network=network, env=dict(env))


def inner_env(conf: Confinement, tmp: str) -> dict[str, str]:
    """The command's environment in the sandbox (pure): its own temporary folder `tmp`, also its home
    when the real one is hidden."""
    env = dict(conf.env)
    home = env.get("HOME")
    if not home or not os.path.isabs(home) or any(_inside(Path(home), h) for h in conf.hidden):
        env["HOME"] = tmp
    env["TMPDIR"] = tmp
    return env


def _venv(path: Path, workspace: Path) -> bool:
    """Whether `path` is in a virtual environment inside the workspace (`.venv/`): the interpreter of
    an agent started from a checkout is shown; runs/, kanban/ and the rest stay hidden."""
    parts = path.relative_to(workspace).parts
    return bool(parts) and parts[0] in (".venv", "venv")


def bwrap_argv(conf: Confinement, argv: Sequence[str], bwrap: str = "bwrap") -> list[str]:
    """bubblewrap's command line for `argv` under `conf` (pure). The system read-only, then every
    mount outer before inner (at one depth, hiding before showing): each hidden folder an empty tmpfs
    (read-only again but /tmp, the command's own), what is shown, the read-only grants and the
    writable folders. So an `ro` grant inside an `rw` one stays read-only, and a hidden folder inside
    a shown one is hidden still."""
    # No capability inside: run by root, a command owns its namespaces and could unmount what hides.
    args = [bwrap, "--unshare-all", *([] if not conf.network else ["--share-net"]), "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # /dev is a fresh one (its /dev/shm the command's own): only what lies elsewhere is hidden here.
    hidden = {p for p in conf.hidden if not _inside(p, Path("/dev"))}
    order = {"--tmpfs": 0, "--ro-bind": 1, "--bind": 2}
    mounts = [(p, "--tmpfs") for p in hidden] + [(p, "--ro-bind") for p in (*conf.shown, *conf.readable)] \
        + [(p, "--bind") for p in conf.writable]
    for path, how in sorted(mounts, key=lambda m: (len(m[0].parts), order[m[1]], str(m[0]))):
        if how == "--tmpfs":
            args += [*(["--size", str(TMP_BYTES)] if str(path) == "/tmp" else []), "--tmpfs", str(path)]
        else:
            args += [how, str(path), str(path)]
    for folder in sorted(hidden, key=lambda p: (len(p.parts), str(p))):
        if str(folder) != "/tmp":
            args += ["--remount-ro", str(folder)]
    return [*args, "--chdir", str(conf.cwd), "--", *argv]


def launcher_argv(conf: Confinement, argv: Sequence[str]) -> list[str]:
    """The Landlock launcher's command line for `argv` under `conf` (pure)."""
    spec = {"writable": [str(p) for p in conf.writable], "readable": [str(p) for p in conf.readable],
            "shown": [str(p) for p in conf.shown], "hidden": [str(p) for p in conf.hidden],
            "network": conf.network}
    return [sys.executable, "-P", "-m", "hermes_sup.agents.confine", json.dumps(spec), "--", *argv]


@functools.lru_cache(maxsize=1)
def bubblewrap() -> tuple[str | None, str]:
    """(the bwrap program, "") when bubblewrap can confine a command here, else (None, why not)."""
    program = shutil.which("bwrap")
    if program is None:
        return None, "bubblewrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    probe = [program, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "--tmpfs", "/tmp", "--", "/bin/true"]
    try:
        done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bubblewrap cannot run: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return None, f"bubblewrap cannot make namespaces here: {why[0][:200]}"
    return program, ""


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    from .landlock import abi

    return abi()


def choose(mode: str, bwrap: tuple[str | None, str], abi: int) -> tuple[str, str]:
    """(how commands run: bubblewrap, landlock or none; what that leaves out or why none) for an
    agent's `sandbox` mode on a machine with `bwrap` (program, why not) and Landlock ABI `abi` (pure).
    SandboxRefused when the mode asks for what the machine lacks."""
    program, why_not = bwrap
    if mode == "none":
        return "none", "commands run with the agent's full rights (sandbox: none)"
    if mode in ("auto", "bubblewrap") and program:
        return "bubblewrap", ""
    landlock_why = "the kernel has no Landlock" if abi < 1 else ""
    if mode in ("auto", "landlock") and abi >= 1:
        gaps = ["with the network capability named unix sockets are reachable too (the supervisor's, a "
                "docker.sock), and modes, owners and times of files (chmod, chown, touch) can be changed wherever "
                "the user may"]
        if abi < 6:
            gaps.append("a command can signal its launcher and so leave processes behind (Landlock ABI < 6)")
        return "landlock", f"Landlock ABI {abi}" + (f" ({why_not})" if mode == "auto" and why_not else "") \
            + "; " + "; ".join(gaps)
    reasons = [r for r in ((why_not if mode != "landlock" else ""), (landlock_why if mode != "bubblewrap" else ""))
               if r]
    raise SandboxRefused(f"refused: no sandbox for commands on this machine ({'; '.join(reasons)}); install "
                         "bubblewrap, or let this agent run commands unconfined with sandbox: none in hermes.yaml")


def how(mode: str) -> tuple[str, str]:
    """choose() on this machine."""
    return choose(mode, bubblewrap() if mode in ("auto", "bubblewrap") else (None, ""),
                  landlock_abi() if mode in ("auto", "landlock") else 0)


def wrap(mode: str, conf: Confinement, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(the command line, its environment) that runs `argv` confined as `mode` allows here;
    SandboxRefused when it cannot be."""
    kind, _ = how(mode)
    if kind == "bubblewrap":
        program = bubblewrap()[0]
        assert program is not None
        return bwrap_argv(conf, argv, program), inner_env(conf, "/tmp")
    if kind == "landlock":  # the launcher makes the command's own temporary folder and sets both
        return launcher_argv(conf, argv), dict(conf.env)
    return list(argv), dict(conf.env)


def private_here() -> tuple[str, ...]:
    """The PRIVATE folders this machine has, where they really are (/var/run -> /run is /run; a
    /home that is a link to /var/home is /var/home)."""
    return tuple(sorted({os.path.realpath(p) for p in PRIVATE if os.path.isdir(p)}))
