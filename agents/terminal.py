"""The `terminal` tool: a shell command in the agent's folder, with a timeout, its output capped, in
a process group of its own (the timeout kills the whole group; the supervisor kills every group of
the agent's session when the agent exits, so nothing it started outlives it), with no API key in
its environment, and refused when it matches a destructive pattern the agent's config has not
approved (`terminal: {approve: [rule, ...]}`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from .tools import Tool, ToolContext, ToolError, register

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
MAX_OUTPUT = 20_000

# Rule name -> pattern. The names are what `terminal.approve` lists to allow one.
DENY_RULES: dict[str, re.Pattern[str]] = {
    "rm-root": re.compile(r"\brm\s+(-[a-zA-Z]*[rR][a-zA-Z]*\s+|--recursive\s+|--no-preserve-root\s+|-[a-zA-Z]+\s+)*"
                          r"(/|/\*|~|~/|\$HOME|/[a-z]+/?)(\s|$|;|&|\|)"),
    "block-device": re.compile(r"(\bof=/dev/(sd|nvme|hd|vd|xvd|mmcblk|disk)|>\s*/dev/(sd|nvme|hd|vd|xvd|mmcblk|disk))"),
    "mkfs": re.compile(r"\b(mkfs(\.\w+)?|mkswap|wipefs|fdisk|parted|sgdisk)\b"),
    "fork-bomb": re.compile(r":\s*\(\s*\)\s*\{.*:\s*\|\s*:.*\}|\bfork\s*\(\s*\)\s*while|while\s*true.*&\s*done"),
    "power": re.compile(r"(?:^|[;&|(]\s*|\bsudo\s+)(shutdown|reboot|halt|poweroff|init\s+[06])(\s|;|$)"),
    "kill-all": re.compile(r"\bkill(all)?\s+(-\w+\s+)*-1\b|\bpkill\s+-9\s+-?u?\s*\S*\s*\.\*"),
    "chmod-root": re.compile(r"\bch(mod|own)\s+(-[a-zA-Z]*R[a-zA-Z]*\s+)\S+\s+/(\s|$)"),
}
SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


def denied(command: str, approved: tuple[str, ...] = ()) -> str | None:
    """The name of the first deny rule `command` matches and the config does not approve (pure)."""
    for name, pattern in DENY_RULES.items():
        if name not in approved and pattern.search(command):
            return name
    return None


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment without anything that looks like a credential (pure)."""
    return {key: value for key, value in env.items() if not SECRET_NAMES.search(key)}


def _cap(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    half = MAX_OUTPUT // 2
    return f"{text[:half]}\n[... {len(text) - MAX_OUTPUT:,} characters cut ...]\n{text[-half:]}"


def terminal(ctx: ToolContext, args: dict[str, Any]) -> str:
    settings = ctx.settings.get("terminal") or {}
    command = args["command"]
    rule = denied(command, tuple(settings.get("approve") or ()))
    if rule:
        raise ToolError(f"refused: the command matches the deny rule '{rule}' (destructive); an operator can "
                        f"allow it with terminal: {{approve: [{rule}]}} in hermes.yaml")
    limit = float(settings.get("timeout", DEFAULT_TIMEOUT))
    timeout = min(float(args.get("timeout") or limit), MAX_TIMEOUT)
    ctx.scratch.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["/bin/sh", "-c", command], cwd=ctx.scratch, env=clean_env(os.environ),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            process_group=0, close_fds=True)
    try:
        output, timed_out = _communicate(proc, ctx, timeout)
    finally:
        _kill_group(proc)  # what the command left running in the background goes with it
    text = _cap(output.decode("utf-8", "replace"))
    if timed_out:
        raise ToolError(f"timed out after {timeout:g} s (the command's processes were killed)\n{text}")
    if proc.returncode != 0:
        return f"exit status {proc.returncode}\n{text}"
    return text


def _communicate(proc: subprocess.Popen[bytes], ctx: ToolContext, timeout: float) -> tuple[bytes, bool]:
    """The command's output, and whether it ran out of time. Waits in short slices so that a stop
    request (SIGTERM to the agent) ends the command too."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.communicate(timeout=min(0.2, max(0.0, deadline - time.monotonic())))[0], False
        except subprocess.TimeoutExpired:
            if ctx.stop.is_set():
                _kill_group(proc)
                proc.communicate()
                raise InterruptedError from None
            if time.monotonic() >= deadline:
                _kill_group(proc)
                return proc.communicate()[0], True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


register(Tool("terminal", "Run a shell command in your folder and get its output (exit status shown when not 0).",
              terminal, {"type": "object", "properties": {
                  "command": {"type": "string", "minLength": 1},
                  "timeout": {"type": "number", "minimum": 1, "maximum": MAX_TIMEOUT,
                              "description": "seconds (default 60)"}},
                  "required": ["command"], "additionalProperties": False},
              capabilities=("shell",), toolset="terminal"))
