"""The operator's requests to a running supervisor (status, restart, stop and start, reload, down): what each
changes in the team, and the answer the control socket sends back."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .child import Child
from .config.workspace import ConfigError, load_config
from .control import down_timeout
from .forking import enabled, reload_note
from .governance.alerts import exposed, rules_of
from .governance.schedules import schedules_of
from .ingestwarn import team_of
from .policy import cleared
from .spec import ChildSpec, build_specs, describe_reload, plan_reload
from .steer import agent_groups, targets

if TYPE_CHECKING:
    from .runner import Supervisor

STOPPING = "the supervisor is stopping the team; nothing is started now"


class Operator:
    """Applies the operator's requests to `sup`'s team; the supervisor's loop calls it, never a thread."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "state": self.sup.snapshot()}
        if cmd == "restart":
            name = request.get("agent")
            child = self.sup.children.get(name) if isinstance(name, str) else None
            if child is None:
                return {"ok": False, "message": f"no agent named {name!r}; agents: {', '.join(self.sup.children)}"}
            if self.sup.shutting_down:
                return {"ok": False, "message": STOPPING}
            if name in self.sup.held:
                return {"ok": False, "message": f"{name} was stopped by hand and stays stopped until "
                                                f"`hermes-sup start {name}`"}
            child.history = cleared(child.history)  # a manual restart is not a crash
            if child.alive():
                self.sup.stop(child, "restart")
            else:
                child.restarts += 1
                self.sup.start(child)
            return {"ok": True, "message": f"{name}: restarting"}
        if cmd in ("stop", "start"):
            return self.steer(cmd, request.get("agent"))
        if cmd == "reload":
            return self.reload()
        if cmd == "down":
            timeout = down_timeout(request.get("timeout"))  # ValueError: a bad request, refused
            if timeout is not None:
                for child in self.sup.children.values():
                    child.spec = _with_stop_timeout(child.spec, timeout)
            self.sup.shutdown("hermes-sup down")
            return {"ok": True, "message": "stopping"}
        return {"ok": False, "message": f"unknown command {cmd!r}"}

    def steer(self, cmd: str, name: object) -> dict[str, Any]:
        """`stop`: stop the agents `name` means and keep them stopped until `start`, which starts
        them again; neither is counted as a restart."""
        chosen = targets(name, [n for n in self.sup.children if n in self.sup.known], self.sup.groups)
        if chosen is None:
            return {"ok": False, "message": f"no agent named {name!r}; agents: {', '.join(self.sup.children)}"}
        if self.sup.shutting_down:
            return {"ok": False, "message": STOPPING}
        said = []
        for agent in chosen:
            child = self.sup.children[agent]
            if cmd == "stop":
                said.append(self._hold(child))
            else:
                said.append(self._release(child))
        self.sup.dirty = True
        return {"ok": True, "message": "; ".join(said), "agents": chosen}

    def _hold(self, child: Child) -> str:
        name = child.spec.name
        self.sup.held.add(name)
        if child.state == "stopping":
            # Already on its way out (a restart, a hang): it stays out once gone, on the same deadline.
            child.stopping_for = "stop"
        elif child.alive():
            self.sup.stop(child, "stop")
        else:
            child.state, child.restart_at, child.stopping_for = "stopped", None, ""
            return f"{name}: stopped (not running); stays stopped until `hermes-sup start {name}`"
        self.sup._print(f"{name}: stopping by hand; stays stopped until `hermes-sup start {name}`")  # event: its answer
        return f"{name}: stopping; stays stopped until `hermes-sup start {name}`"

    def _release(self, child: Child) -> str:
        name = child.spec.name
        was_held = name in self.sup.held
        self.sup.held.discard(name)
        if child.state == "stopping":
            # Its exit starts it again: a stop by hand now sees it is no longer held (see _on_exit).
            return f"{name}: starting once its old process has stopped"
        if child.alive():
            return f"{name}: already {child.state}"
        child.history = cleared(child.history)  # a start by hand begins a fresh run, as from fatal
        self.sup._print(f"{name}: started by hand" + ("" if was_held else f" (it was {child.state})"))  # the same
        self.sup.start(child)
        return f"{name}: starting"

    def reload(self) -> dict[str, Any]:
        """Apply hermes.yaml anew. Whatever reading or checking it raises (not only ConfigError: a
        file nested deep enough to exhaust the parser's recursion, say) refuses the reload and
        leaves the team as it was; it never ends the supervisor."""
        if self.sup.shutting_down:
            return {"ok": False, "message": STOPPING}
        try:
            config = load_config(self.sup.ws.config_path)
            everyone = build_specs(config, self.sup.ws.root)
            wanted = [s for s in everyone if self.sup.only is None or s.name in self.sup.only]
            plan = plan_reload({name: child.spec for name, child in self.sup.children.items()}, wanted)
        except ConfigError as exc:
            return {"ok": False, "message": f"reload refused, the team is unchanged: {exc}"}
        except Exception as exc:  # see the docstring
            return {"ok": False, "message": f"reload refused, the team is unchanged: {self.sup.ws.config_path}: "
                                            f"could not be read: {type(exc).__name__}: {exc}"}
        by_name = {spec.name: spec for spec in wanted}
        for name in plan.stop:
            self.sup.stop(self.sup.children[name], "remove")
            self.sup.held.discard(name)
        for name in plan.restart:
            child = self.sup.children[name]
            child.spec = by_name[name]
            if name in self.sup.held:
                continue  # stopped by hand: the new settings apply when it is started
            self.sup.stop(child, "reload") if child.alive() else self.sup.start(child)
        for name in plan.start:
            self.sup.children[name] = Child(by_name[name])
            self.sup.start(self.sup.children[name])
        self.sup.known = {spec.name for spec in build_specs(config, self.sup.ws.root)}
        self.sup.groups = agent_groups(config)
        self.sup.held &= self.sup.known
        self.sup.dirty = True
        self.sup.ingest_warnings.team = team_of(everyone)
        self.sup.scheduler.reconfigure(schedules_of(config))
        self.sup.alerts.reconfigure(rules_of(config))
        changed = self.sup.telemetry.reconfigure(config)
        if changed:
            self.sup.say(changed)
        self.withhold_secrets()
        note = reload_note(self.sup.fork_wanted, enabled(config, os.environ))
        return {"ok": True, "message": describe_reload(plan) + note,
                "plan": {"start": plan.start, "stop": plan.stop, "restart": plan.restart, "keep": plan.keep}}

    def withhold_secrets(self) -> None:
        """Restart each agent whose environment holds a webhook's URL or secret variable, named so only
        after it started (by a reload, or in the hermes.yaml of this supervisor for an agent a previous
        one started): nothing takes a variable back from a running process and what it started."""
        running = {name: child.env_names for name, child in self.sup.children.items()
                   if child.alive() and child.state != "stopping"}
        for name in exposed(running, self.sup.alerts.env_names()):
            self.sup.say(f"{name}: restarting, its environment holds a webhook's variable that agents are not given")
            self.sup.stop(self.sup.children[name], "reload")


def _with_stop_timeout(spec: ChildSpec, seconds: float) -> ChildSpec:
    return replace(spec, stop_timeout=seconds)
