"""`hermes-sup doctor`: the checks a person runs when something is off. Each check is a dict
{name, level (ok, info, warn, error), detail}; nothing here changes the workspace except moving
damaged task files aside, as every board command does."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...agents import sandbox
from ...agents.breaker import saved_states
from ...agents.budget import logged_count
from ...agents.keys import AUTO_KEYS, ENV_FILE, KeyFile, key_names
from ...agents.loop import TOOL_USE_FILE
from ...agents.providers import BREAKERS_FILE, ProviderConfig
from ...agents.routing import (
    BUSY_MODEL,
    PROBE_DEADLINE,
    REACH_TIMEOUT,
    busy_hint,
    provider_configs,
    reach,
    resolve_auto,
)
from ...agents.sizing import UNKNOWN_CONTEXT_MAX_TOKENS, probe_context
from ...kanban import BoardError
from ...kanban.fsinfo import disk_free, inotify_limits
from ...kanban.fsio import read_bytes_nofollow
from ...kanban.parse import load_json
from ..cgroups import cgroup2_options, detect, join_note
from ..spec import build_specs
from .workspace import ConfigError, Workspace, load_config, open_workspace_board

Check = dict[str, Any]
BOARD_CONFIG = "board config"  # the check whose error makes doctor exit 2, as `up` does


def _check(name: str, level: str, detail: str) -> Check:
    return {"name": name, "level": level, "detail": detail}


def env_file_exposure(path: Path) -> str | None:
    """What is wrong with who may read the workspace's key file, or None (also when there is none)."""
    try:
        info = path.stat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user: whoever owns it chooses the team's keys"
    if mode & 0o077:
        return f"{path} holds API keys and other users may {'write' if mode & 0o022 else 'read'} it " \
               f"(mode {mode:04o}); run: chmod 600 {path}"
    return None


MAX_BREAKERS_BYTES = 1 << 20


def _saved_documents(runs: Path, name: str) -> dict[str, Any]:
    """Each agent's saved document `name` in runs/<agent>/, parsed; None where it cannot be read."""
    saved: dict[str, Any] = {}
    try:
        folders = sorted(path for path in runs.iterdir() if path.is_dir() and not path.is_symlink())
    except OSError:
        return {}
    for folder in folders:
        path = folder / name
        try:
            data = read_bytes_nofollow(path, MAX_BREAKERS_BYTES)
            saved[folder.name] = load_json(data.decode("utf-8")) if len(data) <= MAX_BREAKERS_BYTES else None
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            saved[folder.name] = None
    return saved


def breaker_states(runs: Path, now: float) -> list[tuple[str, str, str, str]]:
    """(agent, provider, level, words) of each agent's provider breakers as it last saved them
    (runs/<agent>/providers.json): what doctor and the dashboard show."""
    return saved_states(_saved_documents(runs, BREAKERS_FILE), now)


def breaker_checks(runs: Path) -> list[Check]:
    return [_check(f"breaker {provider}", level, f"{agent}: {words}")
            for agent, provider, level, words in breaker_states(runs, time.time())]


def tool_use_checks_from(saved: dict[str, Any]) -> list[Check]:
    """A warn line per agent and provider that was offered tools and never called one, once the agent
    itself judged so (pure; `saved`: agent -> the document runs/<agent>/tool_use.json holds)."""
    checks = []
    for agent, document in sorted(saved.items()):
        providers = document.get("providers") if isinstance(document, dict) else None
        if not isinstance(providers, dict):
            checks.append(_check("tools", "warn", f"{agent}: its {TOOL_USE_FILE} cannot be read"))
            continue
        for provider, use in sorted(providers.items(), key=lambda item: str(item[0])):
            if not isinstance(use, dict) or logged_count(use.get("called")) or use.get("warned") is not True:
                continue
            checks.append(_check(f"tools {str(provider)[:80]}", "warn", (
                f"{agent}: provider {str(provider)[:80]}: never returned a tool call in "
                f"{logged_count(use.get('offered'))} "
                "calls with tools offered: its chat template may not support tools; "
                "see docs/explanation/llm-providers.md")))
    return checks


def tool_use_checks(runs: Path) -> list[Check]:
    """Providers that drop the tools they are offered, as each agent last saved it."""
    return tool_use_checks_from(_saved_documents(runs, TOOL_USE_FILE))


def context_check(name: str, provider: ProviderConfig, size: int | None) -> Check:
    """What a local server says of its context window, and what follows when it says nothing (pure)."""
    if size:
        return _check(f"context {name}", "ok", f"{size:,} tokens, as the server reports it")
    follows = ([f"each answer is capped at {UNKNOWN_CONTEXT_MAX_TOKENS:,} tokens"] if provider.sized else []) + (
        [f"the conversation is kept within {provider.context_window:,} tokens, which may be more than the model "
         "holds"] if provider.window_probed else [])
    return _check(f"context {name}", "info", f"the server does not say its context size, so {' and '.join(follows)}: "
                  f"set context_window (the context the server runs the model with: llama-server -c, Ollama "
                  f"num_ctx) under providers: {name}: in hermes.yaml, and max_tokens for longer answers")


def sandbox_checks(specs: list[Any]) -> list[Check]:
    """How each agent that runs code of others here (a terminal with `shell`, skills' tools, an agent
    CLI with `runtime: command`) has it confined (agents/sandbox.py)."""
    by_mode: dict[str, list[str]] = {}
    for spec in specs:
        tools = json.loads(spec.tools)
        if "shell" in spec.capabilities or "skills" in spec.capabilities or spec.skills or tools.get("runtime"):
            by_mode.setdefault(str(tools.get("sandbox") or "auto"), []).append(spec.name)
    checks = []
    for mode, names in sorted(by_mode.items()):
        who = f"sandbox: {mode} ({', '.join(names)})"
        try:
            kind, gaps = sandbox.how(mode)
        except sandbox.SandboxRefused as exc:
            checks.append(_check(who, "error", f"every command, skill call and agent CLI of theirs is refused: {exc}"))
            continue
        if kind == "bubblewrap":
            checks.append(_check(who, "ok", "commands, skills' tools and agent CLIs confined by bubblewrap: writes in "
                                            "the task's folder and the rw grants, no workspace, no network without "
                                            "the network capability"))
        else:
            how = "confined by Landlock" if kind == "landlock" else "unconfined"
            checks.append(_check(who, "warn", f"commands {how}: {gaps}"))
    return checks


def mcp_checks(config: dict[str, Any], workspace: Path) -> list[Check]:
    """Each MCP server of hermes.yaml started (a stdio one confined, in a folder of its own that is
    removed after) and asked for its tools, as an agent would; or why it could not be."""
    import tempfile

    from ...agents.mcpservers import Hub, named_files, server_folder
    from ...agents.terminal import clean_env, command_for, withheld

    servers = {name: spec for name, spec in (config.get("mcp_servers") or {}).items() if name != "__line__"}
    if not servers:
        return []
    users = {name: [a["name"] for a in config.get("agents") or [] if name in (a.get("mcp_servers", (
        config.get("defaults") or {}).get("mcp_servers")) or [])] for name in servers}
    checks = []
    with tempfile.TemporaryDirectory(prefix="hermes-doctor-mcp-") as scratch:
        def command(name: str, spec: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
            folder = server_folder(Path(scratch), name)
            env = clean_env(os.environ, withheld(config))  # never the board's DSN nor a provider's key
            env.update({k: str(v) for k, v in (spec.get("env") or {}).items() if k != "__line__"})
            env.update({k: os.environ.get(v, "") for k, v in (spec.get("env_from") or {}).items() if k != "__line__"})
            argv = [str(spec["command"]), *(str(a) for a in spec.get("args") or ())]
            return command_for({"sandbox": "auto"}, ("shell",), workspace, folder, folder, env, argv,
                               shown=named_files(argv))

        hub = Hub({name: spec for name, spec in servers.items() if spec.get("enabled", True)}, command).start()
        try:
            hub.wait_ready(30)
            for name in sorted(servers):
                who = f"granted to {', '.join(users[name]) if users[name] else 'no agent'}"
                server = hub.servers.get(name)
                if server is None:
                    checks.append(_check(f"mcp {name}", "info", f"disabled (enabled: false); {who}"))
                elif server.session is None:
                    why = server.error or "no answer"
                    checks.append(_check(f"mcp {name}", "error", f"does not start: {why}; {who}"))
                else:
                    names = ", ".join(t.name for t in server.tools) or "none"
                    checks.append(_check(f"mcp {name}", "ok", f"{len(server.tools)} tool(s): {names}; {who}"))
        finally:
            hub.close()
    return checks


AGENT_MB = 70  # an agent's resident memory, about (the dashboard's agent table): a Python with its imports
FDS_PER_AGENT = 4  # the supervisor's descriptors per agent: its pidfd, its log while starting, its cgroup
# (the board watch it holds for an agent, supervisor/held.py, is not counted: none is held past half the limit)


def machine_checks(agents: int, inotify: dict[str, int | None], *, folders: int,
                   machine: dict[str, int | None]) -> list[Check]:
    """The machine's limits judged against a team of `agents` (pure): each agent watches the board
    (an inotify instance, a watch per folder of it), the supervisor holds descriptors per agent and
    reads every agent's heartbeats from one datagram queue, and each agent is a process of about
    AGENT_MB. Each limit too low is named with what raises it; `machine`: nofile (the soft limit),
    dgram_qlen, available_mb."""
    if agents <= 0:
        return []
    checks = []
    needs = [
        ("inotify instances", inotify.get("max_user_instances"), agents + 2,
         "sysctl -w fs.inotify.max_user_instances={need} (agents past it poll the board instead: slower)"),
        ("inotify watches", inotify.get("max_user_watches"), agents * (folders + 1) + 100,
         "sysctl -w fs.inotify.max_user_watches={need}"),
        ("open files", machine.get("nofile"), 64 + FDS_PER_AGENT * agents,
         "ulimit -n {need} (or LimitNOFILE= in a systemd unit) before hermes-sup up"),
        ("heartbeat queue", machine.get("dgram_qlen"), min(agents, 512),
         "sysctl -w net.unix.max_dgram_qlen={need} (a heartbeat that finds it full is dropped, and a busy "
         "supervisor may take a live agent for hung)"),
        ("memory", machine.get("available_mb"), agents * AGENT_MB,
         "fewer agents, or more memory: each agent is a process of about " + f"{AGENT_MB} MB"),
    ]
    for name, have, need, how in needs:
        if have is None:
            continue
        if have < need:
            checks.append(_check(f"limits: {name}", "warn", f"{have:,} for {agents} agents, which need about "
                                                            f"{need:,}: {how.format(need=need)}"))
        else:
            checks.append(_check(f"limits: {name}", "ok", f"{have:,} (about {need:,} for {agents} agents)"))
    return checks


def machine_limits() -> dict[str, int | None]:
    """This machine's limits that machine_checks judges (None: not known here)."""
    import resource

    found: dict[str, int | None] = {"nofile": None, "dgram_qlen": None, "available_mb": None}
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    found["nofile"] = None if soft == resource.RLIM_INFINITY else int(soft)
    with contextlib.suppress(OSError, ValueError):
        found["dgram_qlen"] = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip())
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable:"))
        found["available_mb"] = int(line.split()[1]) // 1024
    return found


def _folders(root: Path, bound: int = 1000) -> int:
    """The folders of the board (each a watch of every agent's), counted up to `bound`."""
    count = 0
    for _dirpath, dirnames, _files in os.walk(root):
        count += len(dirnames)
        if count >= bound:
            break
    return count + 1


@dataclass
class Seen:
    """What the checks share, filled in as they run: the config once read, the environment the agents
    will see, and the board once open. `stop` ends the run (a board that cannot be opened)."""
    ws: Workspace
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    board: Any = None
    stop: bool = False


def config_checks(seen: Seen) -> list[Check]:
    try:
        seen.config = load_config(seen.ws.config_path)
        names = [spec.name for spec in build_specs(seen.config, seen.ws.root)]  # as status names them (count: N)
        return [_check("config", "ok", f"{seen.ws.config_path} ({len(names)} agent{'s' if len(names) != 1 else ''}: "
                                       f"{', '.join(names)})"),
                *sandbox_checks(build_specs(seen.config, seen.ws.root)), *mcp_checks(seen.config, seen.ws.root)]
    except ConfigError as exc:
        return [_check("config", "error", str(exc))]


def folder_checks(seen: Seen) -> list[Check]:
    checks = []
    config = seen.config
    for name, spec in sorted((config.get("folders") or {}).items()):
        users = [a["name"] for a in config.get("agents") or [] if name in (a.get("folders", (
            config.get("defaults") or {}).get("folders")) or [])]
        checks.append(_check(f"folder {name}", "ok" if users else "info",
                             f"{spec['path']} ({spec.get('mode', 'ro')}"
                             + (f", a git worktree per task from {spec.get('base') or 'HEAD'}" if spec.get("worktree")
                                else "") + f"), granted to {', '.join(users) if users else 'no agent'}"))
    return checks


def credential_checks(seen: Seen) -> list[Check]:
    # What the agents will see: this environment, filled in from the workspace's .env (see agents/keys.py).
    names = key_names(seen.config)
    seen.env = dict(os.environ)
    KeyFile(seen.ws.root / ENV_FILE, names, seen.env).refresh()
    present = [name for name in AUTO_KEYS if seen.env.get(name)]
    from_file = [name for name in sorted(names) if seen.env.get(name) and not os.environ.get(name)]
    checks = [_check(
        "credentials", "ok" if present else "info",
        (f"set: {', '.join(present)}" if present else
         f"none of {', '.join(AUTO_KEYS)} is set; the auto provider will look for a local server, then run offline")
        + (f" ({', '.join(from_file)} from {ENV_FILE})" if from_file else ""),
    )]
    exposed = env_file_exposure(seen.ws.root / ENV_FILE)
    if exposed:
        checks.append(_check("key file", "warn", exposed))
    return checks


def auto_checks(seen: Seen) -> list[Check]:
    checks = []
    said: list[str] = []  # the servers auto passed over, then what it settled on
    found = resolve_auto(seen.env, config=seen.config, notes=said)
    if found is None:
        checks.append(_check("provider auto", "warn", said[-1].replace("auto is offline", "offline", 1)
                             + "; only tasks with steps will run"))
    else:
        where = f"key in ${found.api_key_env}" if found.api_key_env else f"server at {found.base_url}"
        if found.model == BUSY_MODEL and not found.api_key_env:
            checks.append(_check("provider auto", "info", f"{found.name}: {found.kind}, {where}: busy: "
                                 f"{busy_hint(PROBE_DEADLINE)}"))
        else:
            checks.append(_check("provider auto", "ok", f"{found.name}: {found.kind}, model {found.model} ({where})"))
    for note in said[:-1]:
        checks.append(_check("auto passed over", "warn", note))
    return checks


def provider_checks(seen: Seen) -> list[Check]:
    checks = []
    for name, provider in provider_configs(seen.config).items():
        if provider.api_key_env and not seen.env.get(provider.api_key_env):
            checks.append(_check(f"provider {name}", "info",
                                 f"${provider.api_key_env} is not set; left out of its tiers"))
        elif not provider.base_url:
            checks.append(_check(f"provider {name}", "ok", f"{provider.kind}, model {provider.model} "
                                 "(the SDK's default endpoint, not probed)"))
        else:
            state, why = reach(provider)
            where = f"{provider.kind}, model {provider.model} at {provider.base_url}"
            if state == "unreachable":
                checks.append(_check(f"provider {name}", "warn", f"{where}: unreachable ({why}) within "
                                     f"{REACH_TIMEOUT:g} s; its tasks wait until it answers"))
            elif state == "busy":
                checks.append(_check(f"provider {name}", "info", f"{where}: busy: {why}"))
            elif state == "misconfigured":
                checks.append(_check(f"provider {name}", "warn", f"{where}: misconfigured: {why}"))
            else:
                checks.append(_check(f"provider {name}", "ok", f"{where}: reachable"))
                if provider.sized or provider.window_probed:
                    checks.append(context_check(name, provider, probe_context(provider.base_url, provider.model)))
    return checks


def containment_checks(seen: Seen) -> list[Check]:
    containment = detect(seen.ws.root, keep=False)  # as a supervisor started from here would find it
    checks = [_check("process containment", "ok" if containment.mode == "cgroup" else "info", containment.detail)]
    if containment.mode == "cgroup":
        with contextlib.suppress(OSError):
            note = join_note(cgroup2_options(Path("/proc/self/mountinfo").read_text()), os.uname().release)
            if note:
                checks.append(_check("cgroup joins", "info", note))
    return checks


def board_open_checks(seen: Seen) -> list[Check]:
    try:
        seen.board = open_workspace_board(seen.ws)
    except ConfigError as exc:  # a board section no installed backend opens: a config error (exit 2)
        seen.stop = True
        return [_check(BOARD_CONFIG, "error", str(exc))]
    except BoardError as exc:
        seen.stop = True
        return [_check("board", "error", str(exc))]
    return []


def board_checks(seen: Seen) -> list[Check]:
    board, checks = seen.board, []
    with board:
        for what, level, detail in board.health():
            checks.append(_check(what, level, detail))

        limits = inotify_limits()
        watches = limits.get("max_user_watches")
        level = "warn" if watches is not None and watches < 8192 else "ok"
        checks.append(_check("inotify limits", level, ", ".join(f"{key}={value}" for key, value in limits.items())))
        team = len(build_specs(seen.config, seen.ws.root)) if seen.config else 0
        checks += machine_checks(team, limits, folders=_folders(board.root), machine=machine_limits())

        ingest = board.ingest().as_dict()
        listing = board.list()
        moved = board.quarantine_damaged(listing.damaged)
        counts = board.counts()
        detail = ", ".join(f"{status} {count}" for status, count in counts.items())
        checks.append(_check("board", "ok", f"{board.root}: {detail}"))
        for item in listing.damaged:
            checks.append(_check("damaged task", "error", f"{item['path']}: {item['reason']}"))
        for path in moved:
            checks.append(_check("moved aside", "warn", f"{path} (see its .error.txt)"))
        for note in board.problems:
            checks.append(_check("board problem", "warn", note))
        rejected = [p.name for p in (board.root / "rejected").iterdir()
                    if not p.name.endswith(".error.txt") and not p.name.startswith(".")]
        if rejected:
            checks.append(_check("rejected files", "warn",
                                 f"{len(rejected)} in rejected/, each beside its .error.txt: "
                                 f"{', '.join(sorted(rejected)[:5])}{' ...' if len(rejected) > 5 else ''}"))
        for item in ingest["rejected"]:
            checks.append(_check("rejected now", "warn", f"{item['file']}: {item['reason']}"))
        bad, cursor, what = 0, 0, ""
        while True:
            batch = board.events_since(cursor)
            bad, what = bad + batch.bad, batch.bad_what or what
            if batch.cursor == cursor:
                break
            cursor = batch.cursor
        if bad:
            checks.append(_check("events", "warn", f"{bad} unreadable {what or 'event(s)'} skipped"))
    return checks


def disk_checks(seen: Seen) -> list[Check]:
    free, total = disk_free(seen.ws.root)
    level = "error" if free < 100 << 20 else "warn" if free < 1 << 30 else "ok"
    checks = [_check("disk", level, f"{free / (1 << 30):.1f} GiB free of {total / (1 << 30):.1f} GiB")]
    if shutil.which("hermes-sup") is None:
        checks.append(_check("path", "info", "hermes-sup is not on PATH (run it from the virtualenv)"))
    return checks


# Doctor's checks, in the order they run and are shown: each reads what the ones before it saw.
CHECKS: tuple[Callable[[Seen], list[Check]], ...] = (
    config_checks, folder_checks, credential_checks, auto_checks, provider_checks,
    lambda seen: breaker_checks(seen.ws.runs_path), lambda seen: tool_use_checks(seen.ws.runs_path),
    containment_checks, board_open_checks, board_checks, disk_checks,
)


def run_checks(ws: Workspace) -> list[Check]:
    seen = Seen(ws)
    checks: list[Check] = []
    for check in CHECKS:
        checks += check(seen)
        if seen.stop:
            break
    return checks
