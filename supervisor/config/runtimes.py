"""How an agent works, as hermes.yaml says it: its `runtime` (the built-in loop; `command`: any agent
CLI, one run per task, agents/clirun.py; `hermes`: Hermes Agent's CLI on a profile of its own,
agents/hermesrun.py) and the built-in loop's own provider chain (`providers`); their checks with
file:line, and what the agent is told of them."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from ...agents.clirun import DEFAULT_MAX_RUNTIME, argv_problem
from .mcpconfig import VARIABLE

RUNTIMES = ("builtin", "command", "hermes")
RUNTIME_KEYS = ("runtime", "argv", "max_runtime", "env_from", "profile", "hermes_home", "program", "providers")
# Which keys each CLI runtime takes (the built-in loop none of them, but `providers`).
CLI_KEYS = {"command": ("argv", "max_runtime", "env_from"),
            "hermes": ("profile", "hermes_home", "program", "max_runtime", "env_from")}
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_RUNTIME = 7 * 86400.0


def check_runtime(agent: dict[str, Any], where: str, fail: Any) -> None:
    """An agent's `runtime` and the keys of its CLI: `command`'s argv (a CLI named whole, placeholders
    known), `hermes`' profile (a folder that is there), and for both a bound in seconds and secrets by
    variable name; each key only with the runtime that takes it."""
    runtime = agent.get("runtime", "builtin")
    if runtime not in RUNTIMES:
        raise fail(agent, f"{where}: 'runtime' must be one of {', '.join(RUNTIMES)} (command: any agent CLI, one run "
                          f"per task, with 'argv'; hermes: Hermes Agent's CLI, with 'profile'), got {runtime!r}")
    allowed = CLI_KEYS.get(runtime, ())
    extra = [key for key in RUNTIME_KEYS[1:-1] if key in agent and key not in allowed]
    if extra:
        users = [name for name, keys in CLI_KEYS.items() if extra[0] in keys]
        raise fail(agent, f"{where}: '{extra[0]}' is for runtime: {' or '.join(users)}")
    if runtime == "builtin":
        return
    if "providers" in agent:
        raise fail(agent, f"{where}: 'providers' is for the built-in loop; a runtime: {runtime} agent's CLI picks its "
                          "own model")
    if runtime == "command":
        problem = argv_problem(agent.get("argv"))
        if problem:
            raise fail(agent, f"{where}: {problem}")
    else:
        _check_hermes(agent, where, fail)
    bound = agent.get("max_runtime", DEFAULT_MAX_RUNTIME)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound <= MAX_RUNTIME:
        raise fail(agent, f"{where}: 'max_runtime' must be a number of seconds > 0 and at most {MAX_RUNTIME:,.0f} "
                          f"(a week), got {bound!r}")
    named = agent.get("env_from", {})
    if not isinstance(named, dict) or not all(isinstance(k, str) and VARIABLE.fullmatch(k) and isinstance(v, str)
                                              and VARIABLE.fullmatch(v) for k, v in named.items() if k != "__line__"):
        raise fail(agent, f"{where}: 'env_from' must map the CLI's variable names to the names of ours that hold "
                          "their values (a key stays out of hermes.yaml: env_from: {OPENAI_API_KEY: CODEX_KEY})")


def profile_dir(agent: dict[str, Any], environ: dict[str, str] | None = None) -> Path:
    """The Hermes profile folder a `runtime: hermes` agent works with (pure over `environ`): `profile`
    as a path when it is one, else `<hermes_home>/profiles/NAME` (`default`: the home itself, as
    Hermes has it), the home being `hermes_home`, else $HERMES_HOME, else ~/.hermes."""
    environ = dict(os.environ) if environ is None else environ
    profile = str(agent.get("profile"))
    if os.sep in profile or profile.startswith("~"):
        return Path(os.path.expanduser(profile)).absolute()
    home = agent.get("hermes_home") or environ.get("HERMES_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".hermes")
    home_path = Path(os.path.expanduser(str(home))).absolute()
    return home_path if profile == "default" else home_path / "profiles" / profile


def _check_hermes(agent: dict[str, Any], where: str, fail: Any) -> None:
    profile = agent.get("profile")
    if not isinstance(profile, str) or not profile or "\0" in profile or not (
            PROFILE_NAME.fullmatch(profile) or os.sep in profile or profile.startswith("~")):
        raise fail(agent, f"{where}: runtime: hermes needs 'profile': a Hermes profile's name (as in hermes -p NAME; "
                          "default: the home's own) or its folder")
    for key in ("hermes_home", "program"):
        if key in agent and (not isinstance(agent[key], str) or not agent[key] or "\0" in agent[key]):
            raise fail(agent, f"{where}: '{key}' must be a path (or, for program, a name found on PATH)")
    if "network" not in (agent.get("capabilities") or []):
        raise fail(agent, f"{where}: runtime: hermes needs the 'network' capability: Hermes calls its model over "
                          "HTTP (add network to the agent's capabilities)")


def check_profiles(raw: dict[str, Any], workspace: Path, fail: Any) -> None:
    """The Hermes profile folders of `runtime: hermes` agents, which their CLI may write: each one
    there, none holding the workspace or inside its runs/, kanban/ or skills/, no two entries' one
    inside the other (the `default` profile is the home, which holds the others: its run does not
    see profiles/), and the CLI's own installation outside it (a run could rewrite the code every
    profile runs). A relative `hermes_home` or profile path is the workspace's; both are written
    back resolved."""
    from .folders import _inside, forbidden

    seen: list[tuple[str, Path]] = []
    for agent in raw.get("agents") or []:
        if not isinstance(agent, dict) or agent.get("runtime") != "hermes":
            continue
        where = f"agent {agent.get('name')}"
        for key in ("hermes_home", "profile"):
            value = agent.get(key)
            if isinstance(value, str) and (key == "hermes_home" or os.sep in value or value.startswith("~")):
                agent[key] = str((workspace / os.path.expanduser(value)).resolve())
        folder = profile_dir(agent).resolve()
        if not folder.is_dir():
            raise fail(agent, f"{where}: Hermes profile folder {folder} does not exist (make it with hermes profile "
                              f"create {agent.get('profile')}, or name the home with hermes_home)")
        problem = forbidden(folder, workspace)
        if problem:
            raise fail(agent, f"{where}: Hermes profile folder {folder} {problem}")
        for other, other_folder in seen:
            inner, outer = (folder, other_folder) if _inside(folder, other_folder) else (other_folder, folder)
            if not _inside(inner, outer) or (inner != outer and _inside(inner, outer / "profiles")):
                continue  # apart, or a profile of the home the other runs on (its runs do not see profiles/)
            same = "is agent " + other + "'s too" if folder == other_folder else \
                f"and agent {other}'s ({other_folder}) are one inside the other"
            raise fail(agent, f"{where}: Hermes profile folder {folder} {same}; each entry needs a profile of its "
                              "own, which its runs may write (count: N shares one)")
        seen.append((str(agent.get("name")), folder))
        program = shutil.which(str(agent.get("program") or "hermes"))
        if program and _inside(Path(os.path.realpath(program)), folder):
            raise fail(agent, f"{where}: the Hermes CLI {os.path.realpath(program)} is inside the profile folder "
                              f"{folder}, which each run may write: install it elsewhere (pipx, a venv) or name it "
                              "with program")


def check_chain(agent: dict[str, Any], providers: Any, where: str, fail: Any) -> None:
    """An agent's own `providers` chain: names of hermes.yaml's providers (or auto, offline), in the
    order they are tried for every model call of the agent, whatever the tier."""
    if "providers" not in agent:
        return
    chain = agent["providers"]
    known = {*(providers if isinstance(providers, dict) else {}), "auto", "offline"} - {"__line__"}
    if not isinstance(chain, list) or not chain or not all(isinstance(name, str) for name in chain):
        from .checks import BOOLEAN_WORD

        said = BOOLEAN_WORD if isinstance(chain, list) and any(isinstance(n, bool) for n in chain) else ""
        raise fail(agent, f"{where}: 'providers' must be a list of provider names, tried in order (its own chain; "
                          f"the tiers stay the team's){said}")
    unknown = [name for name in chain if name not in known]
    if unknown:
        raise fail(agent, f"{where}: 'providers' names {unknown[0]!r}, which is no provider of hermes.yaml "
                          f"(providers: {', '.join(sorted(known))})")


def check_budgeted(raw: dict[str, Any], fail: Any) -> None:
    """A `command` agent under a budget is refused: its CLI's tokens and cost are not measured, so a
    cap (the team's, the agent's own, a task's max_cost) could not hold it and would say it does. A
    Hermes run's are, once it has ended (agents/worker.py: a run starts only while no cap is reached,
    and its cost is settled after)."""
    budgets = raw.get("budgets")
    if not isinstance(budgets, dict) or not any(k != "__line__" and v for k, v in budgets.items()):
        return
    for agent in raw.get("agents") or []:
        if isinstance(agent, dict) and agent.get("runtime") == "command":
            raise fail(agent, f"agent {agent.get('name')}: a runtime: command agent's spend is not measured (its CLI "
                              "reports no tokens to hermes-sup), so the budgets in hermes.yaml could not hold it; "
                              "remove budgets, or run this CLI's team in a workspace of its own")



def runtime_of(agent: dict[str, Any]) -> dict[str, Any]:
    """What the agent process is told of its runtime (checked already): nothing for the built-in loop."""
    kind = agent.get("runtime", "builtin")
    if kind == "builtin":
        return {}
    common = {"max_runtime": float(agent.get("max_runtime", DEFAULT_MAX_RUNTIME)),
              "env_from": {k: v for k, v in (agent.get("env_from") or {}).items() if k != "__line__"}}
    if kind == "hermes":
        return {"runtime": {"kind": "hermes", "profile": str(agent["profile"]), "profile_dir": str(profile_dir(agent)),
                            "program": str(agent.get("program") or "hermes"), **common}}
    return {"runtime": {"kind": "command", "argv": list(agent["argv"]), **common}}
