"""hermes.yaml's `mcp_servers:` (MCP tool servers, in Hermes Agent's shape) and each agent's
`mcp_servers: [names]`, checked when the file is read: a server is a stdio `command` (with `args`,
`env`, `env_from`) or a streamable HTTP `url` (with `headers_env`), never both; a secret is given by
the name of the variable that holds it (`env_from`, `headers_env`), never as a value here."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .folders import check_granted

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A value in `env` under such a name is a secret written into hermes.yaml: refused, env_from it.
SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|DSN|COOKIE|PRIVATE"
                          r"|(^|[_-])PAT($|[_-])|(^|[_-])PASS($|[_-]))", re.IGNORECASE)
# A value that is a key whatever its name: the shapes of the usual providers' keys, a URL with a password.
SECRET_VALUES = re.compile(r"(\bsk-[A-Za-z0-9_-]{8}|\bgh[pousr]_[A-Za-z0-9]{8}|github_pat_|\bxox[abpr]-"
                           r"|\bAKIA[0-9A-Z]{12}|\bglpat-|://[^/\s:@]+:[^/\s@]+@)")


def secret_in(server: dict[str, Any]) -> str | None:
    """Where a server's spec holds a secret as a value, in words, or None (pure): an env value under a
    secret's name or of a key's shape, an argument that names one (`--api-key X`, `--token=X`) or has
    one's shape, a URL with a password or a secret's name in its query."""
    for key, value in (server.get("env") or {}).items():
        if key != "__line__" and (SECRET_NAMES.search(str(key)) or SECRET_VALUES.search(str(value))):
            return f"env {key}"
    args = [str(arg) for arg in server.get("args") or ()]
    for index, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if SECRET_VALUES.search(arg) or (flag.startswith("-") and SECRET_NAMES.search(flag)
                                         and ("=" in arg or index + 1 < len(args))):
            return f"argument {flag if flag.startswith('-') else index + 1}"
    if server.get("url"):
        parts = urlsplit(str(server["url"]))
        if parts.username or parts.password or SECRET_VALUES.search(str(server["url"])):
            return "url (a user or password in it)"
        if any(SECRET_NAMES.search(name) for name, _ in parse_qsl(parts.query, keep_blank_values=True)):
            return "url (a secret in its query)"
    return None


def check_mcp_servers(raw: dict[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """Check `mcp_servers:` and the agents' (and defaults') lists of them, after their schema; raises
    what `fail` makes."""
    servers = raw.get("mcp_servers")
    if servers is None:
        servers = {}
    for name, spec in servers.items():
        if name == "__line__":
            continue
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise fail(servers, f"MCP server name {name!r} must be 1 to 32 lowercase letters, digits, '-' or '_', "
                                "starting with a letter")
        _check_server(name, spec, fail)
    safe: dict[str, str] = {}
    for name in servers:
        made = re.sub(r"[^A-Za-z0-9]", "_", str(name))
        if name != "__line__" and made in safe:
            raise fail(servers, f"MCP servers {safe[made]} and {name} would give their tools the same names "
                                f"(mcp__{made}__...); rename one")
        safe[made] = str(name)
    check_granted(raw, "mcp_servers", servers, "MCP server", fail)


def _check_server(name: str, spec: dict[str, Any], fail: Callable[[Any, str], Exception]) -> None:
    """One server, after its schema (config/schema.py: its keys, enabled, timeouts, tools' keys): command
    or url, the types the schema leaves to this check, and no secret written as a value."""
    where = f"MCP server {name}"
    if ("command" in spec) == ("url" in spec):
        raise fail(spec, f"{where}: give either command (a stdio server) or url (streamable HTTP), not "
                         f"{'both' if 'command' in spec else 'neither'}")
    if "command" in spec:
        if not isinstance(spec["command"], str) or not spec["command"].strip():
            raise fail(spec, f"{where}: 'command' must be a program's name or path")
        if not isinstance(spec.get("args", []), list) or not all(isinstance(a, (str, int, float))
                                                                  for a in spec.get("args", [])):
            raise fail(spec, f"{where}: 'args' must be a list of strings")
        for key in ("url", "headers_env"):
            if key in spec:
                raise fail(spec, f"{where}: '{key}' is for a server reached by url")
    else:
        parts = urlsplit(str(spec["url"]))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise fail(spec, f"{where}: 'url' must be an http(s) URL, got {spec['url']!r}")
        for key in ("args", "env", "env_from"):
            if key in spec:
                raise fail(spec, f"{where}: '{key}' is for a stdio server (command)")
    env = spec.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float))
                                            for k, v in env.items() if k != "__line__"):
        raise fail(spec, f"{where}: 'env' must map variable names to values")
    secret = secret_in(spec)
    if secret:
        raise fail(spec, f"{where}: its {secret} looks like a secret; hermes.yaml never holds one: put it in a "
                         "variable and name that (env_from: {NAME: YOUR_VARIABLE}, headers_env for a header)")
    for key in ("env_from", "headers_env"):
        mapping = spec.get(key) or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, str) and VARIABLE.fullmatch(v)
                                                    for k, v in mapping.items() if k != "__line__"):
            raise fail(spec, f"{where}: '{key}' must map names to the names of environment variables")
    tools = spec.get("tools") or {}
    if not all(isinstance(tools.get(k, []), list) and all(isinstance(t, str) for t in tools.get(k, []))
               for k in ("include", "exclude")):
        raise fail(spec, f"{where}: 'tools' must be {{include: [names], exclude: [names]}}")


def granted_servers(config: dict[str, Any], defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The MCP servers an agent is granted, as its settings carry them (pure): enabled ones only,
    without the lines the YAML loader noted."""
    names = entry.get("mcp_servers", defaults.get("mcp_servers")) or []
    servers = config.get("mcp_servers") or {}

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "__line__"}
        return [plain(v) for v in value] if isinstance(value, list) else value

    return {name: plain(servers[name]) for name in names if name in servers
            and servers[name].get("enabled", True)}
