"""Child specs: each agent process as data (OTP's child_spec), built from a checked hermes.yaml.

Pure: the same config gives the same specs, and `digest` changes exactly when an agent's
effective settings change, which is what `reload` compares.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..agents.tools import DEFAULT_CAPABILITIES
from .config.folders import granted, not_granted
from .config.mcpconfig import granted_servers
from .config.runtimes import runtime_of
from .policy import RestartSpec

# The built-in runtime's arguments after the interpreter. -P: nothing in the agent's working directory
# may shadow a package.
RUNTIME_ARGS = ("-P", "-m", "hermes_sup.agents", "run")

DEFAULTS: dict[str, Any] = {
    "restart": {"policy": "on-failure", "backoff": {"initial": 0.5, "max": 30.0}, "max_restarts": 5, "window": 60.0,
                "reset_after": 30.0},
    "stop_timeout": 10.0,
    "heartbeat_timeout": 60.0,
    "orphan_grace": 30.0,
    "max_rss_mb": 1024.0,
    "log_max_mb": 10.0,
    "log_keep": 3,
}



@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    workdir: Path
    env: tuple[tuple[str, str], ...] = ()
    roles: tuple[str, ...] = ()
    tier: str = "auto"
    capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES
    skills: tuple[str, ...] = ()
    restart: RestartSpec = field(default_factory=RestartSpec)
    stop_timeout: float = 10.0
    heartbeat_timeout: float = 60.0
    orphan_grace: float = 30.0
    max_rss_mb: float | None = 1024.0
    log_max_mb: float = 10.0
    log_keep: int = 3
    identity: str = ""
    max_iterations: int = 60
    max_tokens: int | None = None
    max_cost: float | None = None
    llm: str = "{}"  # the providers and tiers of hermes.yaml, as JSON (what the agent calls)
    tools: str = "{}"  # toolsets, terminal and delegation settings, as JSON
    board: str = "{}"  # hermes.yaml's board section and host, as JSON (the agent opens the same board)
    digest: str = ""

    @property
    def forkable(self) -> bool:
        """Whether the fork server may start it: the built-in loop's agents only. A `command` agent is
        another program, and a `runtime:` agent's work is one it runs: the server's imports would
        speed up neither."""
        return self.argv[1:] == RUNTIME_ARGS and "runtime" not in json.loads(self.tools)

    def agent_config(self) -> dict[str, Any]:
        """What the agent process is told about itself (as JSON in its environment)."""
        return {
            "name": self.name, "roles": list(self.roles), "tier": self.tier,
            "capabilities": list(self.capabilities), "skills": list(self.skills),
            "heartbeat_timeout": self.heartbeat_timeout, "orphan_grace": self.orphan_grace,
            "log_max_mb": self.log_max_mb, "log_keep": self.log_keep, "identity": self.identity,
            "max_iterations": self.max_iterations, "max_tokens": self.max_tokens, "max_cost": self.max_cost,
            "llm": json.loads(self.llm), **json.loads(self.tools), **json.loads(self.board),
        }


def _merged(defaults: dict[str, Any], agent: dict[str, Any], key: str) -> Any:
    value = agent.get(key, defaults.get(key, DEFAULTS.get(key)))
    return value


def _restart(defaults: dict[str, Any], agent: dict[str, Any]) -> RestartSpec:
    base = {**DEFAULTS["restart"], **(defaults.get("restart") or {})}
    over = agent.get("restart") or {}
    merged = {**base, **over}
    backoff = {**DEFAULTS["restart"]["backoff"], **(base.get("backoff") or {}), **(over.get("backoff") or {})}
    return RestartSpec(
        policy=merged["policy"], initial=float(backoff["initial"]), max=float(backoff["max"]),
        max_restarts=int(merged["max_restarts"]), window=float(merged["window"]),
        reset_after=float(merged["reset_after"]),
    )


def agent_names(entry: dict[str, Any]) -> list[str]:
    count = int(entry.get("count", 1))
    name = str(entry["name"])
    return [name] if count == 1 else [f"{name}-{index}" for index in range(1, count + 1)]


def build_specs(config: dict[str, Any], root: Path, *, python: str = sys.executable) -> list[ChildSpec]:
    defaults = config.get("defaults") or {}
    specs = []
    for entry in config.get("agents") or []:
        for name in agent_names(entry):
            rss = _merged(defaults, entry, "max_rss_mb")
            env = {str(k): str(v) for k, v in (entry.get("env") or {}).items()}
            command = entry.get("command")
            argv = tuple(command) if command else (python, *RUNTIME_ARGS)
            spec = ChildSpec(
                name=name,
                argv=argv,
                workdir=root / "runs" / name,
                env=tuple(sorted(env.items())),
                roles=tuple(entry.get("roles") or ()),
                tier=str(entry.get("tier", "auto")),
                capabilities=tuple(entry.get("capabilities") or DEFAULT_CAPABILITIES),
                skills=tuple(entry.get("skills") or ()),
                restart=_restart(defaults, entry),
                stop_timeout=float(_merged(defaults, entry, "stop_timeout")),
                heartbeat_timeout=float(_merged(defaults, entry, "heartbeat_timeout")),
                orphan_grace=float(_merged(defaults, entry, "orphan_grace")),
                max_rss_mb=None if rss is None else float(rss),
                log_max_mb=float(_merged(defaults, entry, "log_max_mb")),
                log_keep=int(_merged(defaults, entry, "log_keep")),
                identity=str(entry.get("identity") or ""),
                max_iterations=int(_merged(defaults, entry, "max_iterations") or 60),
                max_tokens=_merged(defaults, entry, "max_tokens"),
                max_cost=_merged(defaults, entry, "max_cost"),
                llm=json.dumps({"providers": config.get("providers") or {}, "tiers": config.get("tiers") or {},
                                "prices": config.get("prices") or {}, "routing": config.get("routing") or {},
                                "budgets": config.get("budgets") or {},
                                **({"chain": list(entry["providers"])} if entry.get("providers") else {})},
                               sort_keys=True),
                tools=json.dumps({"toolsets": entry.get("toolsets"),
                                  "terminal": _merged(defaults, entry, "terminal") or {},
                                  "delegation": _merged(defaults, entry, "delegation") or {},
                                  "memory": _merged(defaults, entry, "memory") or {},
                                  "offer_tools": _merged(defaults, entry, "offer_tools") or "task",
                                  "sandbox": _merged(defaults, entry, "sandbox") or "auto",
                                  "folders": granted(config, defaults, entry),
                                  "folders_hidden": not_granted(config, defaults, entry),
                                  "mcp_servers": granted_servers(config, defaults, entry),
                                  **runtime_of(entry)}, sort_keys=True),
                board=json.dumps({"board": config.get("board") or {}, "host": config.get("host"),
                                  **({"telemetry": config["telemetry"]} if config.get("telemetry") else {})},
                                 sort_keys=True),
            )
            specs.append(_with_digest(spec))
    return specs


def _with_digest(spec: ChildSpec) -> ChildSpec:
    data = asdict(spec)
    data.pop("digest")
    text = json.dumps(data, sort_keys=True, default=str)
    return ChildSpec(**{**asdict(spec), "restart": spec.restart, "workdir": spec.workdir,
                        "digest": hashlib.sha256(text.encode()).hexdigest()[:16]})


@dataclass(frozen=True)
class ReloadPlan:
    start: tuple[str, ...]
    stop: tuple[str, ...]
    restart: tuple[str, ...]
    keep: tuple[str, ...]


def describe_reload(plan: ReloadPlan) -> str:
    """The reload's one line for a person: what it did, by name, without Python's list syntax (pure)."""
    done = [f"{verb} {', '.join(names)}" for verb, names in
            (("started", plan.start), ("stopped", plan.stop), ("restarted", plan.restart)) if names]
    if not done:
        return "reload: nothing changed" + (f" ({', '.join(plan.keep)} unchanged)" if plan.keep else "")
    return f"reload: {'; '.join(done)}" + (f"; unchanged {', '.join(plan.keep)}" if plan.keep else "")


def plan_reload(running: dict[str, ChildSpec], wanted: list[ChildSpec]) -> ReloadPlan:
    """Which agents a reload starts, stops, restarts (changed settings) and leaves alone."""
    wanted_by_name = {spec.name: spec for spec in wanted}
    start = tuple(name for name in wanted_by_name if name not in running)
    stop = tuple(name for name in running if name not in wanted_by_name)
    restart = tuple(name for name, spec in wanted_by_name.items()
                    if name in running and running[name].digest != spec.digest)
    keep = tuple(name for name, spec in wanted_by_name.items()
                 if name in running and running[name].digest == spec.digest)
    return ReloadPlan(start, stop, restart, keep)
