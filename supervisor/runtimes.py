"""How an agent works, as hermes.yaml says it: its `runtime` (the built-in loop, or `command`: any agent
CLI, one run per task, agents/clirun.py) and the built-in loop's own provider chain (`providers`);
their checks with file:line, and what the agent is told of them."""

from __future__ import annotations

from typing import Any

from ..agents.clirun import DEFAULT_MAX_RUNTIME, argv_problem
from .mcpconfig import VARIABLE

RUNTIMES = ("builtin", "command")
RUNTIME_KEYS = ("runtime", "argv", "max_runtime", "env_from", "providers")
MAX_RUNTIME = 7 * 86400.0


def check_runtime(agent: dict[str, Any], where: str, fail: Any) -> None:
    """An agent's `runtime`, `argv`, `max_runtime` and `env_from`: a CLI named whole, placeholders
    known, a bound in seconds, secrets by variable name; the last three only with `runtime: command`."""
    runtime = agent.get("runtime", "builtin")
    if runtime == "hermes":
        raise fail(agent, f"{where}: runtime 'hermes' is not supported yet; run Hermes Agent's CLI as any agent CLI: "
                          "runtime: command, argv: [hermes, chat, -q, '{prompt}']")
    if runtime not in RUNTIMES:
        raise fail(agent, f"{where}: 'runtime' must be one of {', '.join(RUNTIMES)} (command: any agent CLI, one run "
                          f"per task, with 'argv'), got {runtime!r}")
    if runtime != "command":
        extra = [key for key in RUNTIME_KEYS[1:-1] if key in agent]
        if extra:
            raise fail(agent, f"{where}: '{extra[0]}' is for runtime: command")
        return
    if "providers" in agent:
        raise fail(agent, f"{where}: 'providers' is for the built-in loop; a runtime: command agent's CLI picks its "
                          "own model")
    problem = argv_problem(agent.get("argv"))
    if problem:
        raise fail(agent, f"{where}: {problem}")
    bound = agent.get("max_runtime", DEFAULT_MAX_RUNTIME)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound <= MAX_RUNTIME:
        raise fail(agent, f"{where}: 'max_runtime' must be a number of seconds > 0 and at most {MAX_RUNTIME:,.0f} "
                          f"(a week), got {bound!r}")
    named = agent.get("env_from", {})
    if not isinstance(named, dict) or not all(isinstance(k, str) and VARIABLE.fullmatch(k) and isinstance(v, str)
                                              and VARIABLE.fullmatch(v) for k, v in named.items() if k != "__line__"):
        raise fail(agent, f"{where}: 'env_from' must map the CLI's variable names to the names of ours that hold "
                          "their values (a key stays out of hermes.yaml: env_from: {OPENAI_API_KEY: CODEX_KEY})")


def check_chain(agent: dict[str, Any], providers: Any, where: str, fail: Any) -> None:
    """An agent's own `providers` chain: names of hermes.yaml's providers (or auto, offline), in the
    order they are tried for every model call of the agent, whatever the tier."""
    if "providers" not in agent:
        return
    chain = agent["providers"]
    known = {*(providers if isinstance(providers, dict) else {}), "auto", "offline"} - {"__line__"}
    if not isinstance(chain, list) or not chain or not all(isinstance(name, str) for name in chain):
        raise fail(agent, f"{where}: 'providers' must be a list of provider names, tried in order (its own chain; "
                          "the tiers stay the team's)")
    unknown = [name for name in chain if name not in known]
    if unknown:
        raise fail(agent, f"{where}: 'providers' names {unknown[0]!r}, which is no provider of hermes.yaml "
                          f"(providers: {', '.join(sorted(known))})")


def check_budgeted(raw: dict[str, Any], fail: Any) -> None:
    """A `command` agent under a budget is refused: a CLI's tokens and cost are not measured, so a cap
    (the team's, the agent's own, a task's max_cost) could not hold it and would say it does."""
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
    if agent.get("runtime", "builtin") != "command":
        return {}
    return {"runtime": {"kind": "command", "argv": list(agent["argv"]),
                        "max_runtime": float(agent.get("max_runtime", DEFAULT_MAX_RUNTIME)),
                        "env_from": {k: v for k, v in (agent.get("env_from") or {}).items() if k != "__line__"}}}
