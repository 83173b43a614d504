"""The supervisor's own telemetry: its events exported as spans, made anew when a reload changes `telemetry:`."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..agents.spans import endpoint_of, shown
from ..agents.telemetry import Telemetry

Append = Callable[[dict[str, Any]], None]


def export_of(config: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """What the supervisor's export depends on (pure): where its spans go (None: nowhere) and the host
    its resource names. A reload that changes neither leaves the exporter as it is."""
    host = config.get("host")
    return endpoint_of(config.get("telemetry"), env), str(host) if host else None


def change_line(before: str | None, after: str | None) -> str:
    """What the supervisor says of a reload that changed its export (pure): the address, never its
    credentials (spans.shown)."""
    if after is None:
        return "supervisor: telemetry: its events are no longer exported"
    return f"supervisor: telemetry: its events are exported to {shown(after)}" + (
        f" (before: {shown(before)})" if before else "")


class SupervisorTelemetry:
    """The supervisor's Telemetry, held here so that a reload can replace it: `exporting` wraps the
    board's append of an event so that each goes to the collector configured now."""

    def __init__(self, config: Mapping[str, Any], workspace: str, env: Mapping[str, str] | None = None) -> None:
        self.workspace = workspace
        self.env = os.environ if env is None else env  # read at the start: a reload changes hermes.yaml, not these
        self.export = export_of(config, self.env)
        self.current = self._made(config)

    def _made(self, config: Mapping[str, Any]) -> Telemetry:
        return Telemetry.from_settings(config.get("telemetry"), self.env, agent="supervisor",
                                       workspace=self.workspace, host=config.get("host"))

    def exporting(self, append: Append) -> Append:
        """The supervisor's `append` of its events to the board, each also exported when telemetry is on."""
        def both(record: dict[str, Any]) -> None:
            append(record)  # the board first: an export never costs the event its place in the log
            current = self.current  # one read: a reload on the loop replaces it whole
            if current.enabled:
                current.event(record)

        return both

    def reconfigure(self, config: Mapping[str, Any]) -> str | None:
        """Export by a reloaded hermes.yaml (already checked: a broken `telemetry:` refused the reload);
        the line to say when that changed the export, else None. The old exporter's last batch is sent
        on a thread of its own: its close may wait for a collector, and the loop never waits."""
        wanted = export_of(config, self.env)
        if wanted == self.export:
            return None
        before, old = self.export[0], self.current
        self.current, self.export = self._made(config), wanted
        threading.Thread(target=old.close, name="telemetry-close", daemon=True).start()
        return change_line(before, wanted[0])

    def close(self) -> None:
        self.current.close()
