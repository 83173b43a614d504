"""A Hermes profile's `mcp_servers` as hermes.yaml's (pure): what `import-hermes` carries over.

Hermes Agent's config.yaml writes a secret into a server's `env` or `headers` as `${VARIABLE}` (or,
carelessly, as the value itself). Here a secret is only ever named: `${VARIABLE}` becomes `env_from`
or `headers_env`; a literal value under a secret's name, or a header that is more than one
`${VARIABLE}` ("Bearer ${TOKEN}"), is not copied, and the user is told which and how to give it.
"""

from __future__ import annotations

import re
from typing import Any

from ..config.mcpconfig import NAME, SECRET_NAMES, SECRET_VALUES, VARIABLE, secret_in

REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
CARRIED = ("command", "args", "url", "enabled", "timeout", "connect_timeout")


def carry(config: dict[str, Any], taken: set[str]) -> tuple[dict[str, Any], list[str], list[dict[str, str]]]:
    """(hermes.yaml's mcp_servers, notes, what was not carried {what, why}) for a profile's config (pure);
    `taken`: the names hermes.yaml's servers already have."""
    servers: dict[str, Any] = {}
    notes: list[str] = []
    left: list[dict[str, str]] = []
    for raw_name, spec in (config.get("mcp_servers") or {}).items():
        name = str(raw_name).lower().replace(".", "-")
        what = f"MCP server {raw_name}"
        if not isinstance(spec, dict) or not NAME.fullmatch(name):
            left.append({"what": what, "why": "not a server hermes.yaml can name (1 to 32 lowercase letters, digits, "
                                              "'-' or '_')"})
            continue
        if name in taken:
            left.append({"what": what, "why": f"hermes.yaml has a server named {name} already; grant it to the agent "
                                              "by hand if it is the same"})
            continue
        out = {key: spec[key] for key in CARRIED if key in spec}
        if ("command" in out) == ("url" in out):
            left.append({"what": what, "why": "it has neither (or both) a command and a url"})
            continue
        if "args" in out:
            out["args"] = [str(arg) for arg in out["args"]] if isinstance(out["args"], list) else [str(out["args"])]
        dropped: list[str] = []
        for source, plain, named in (("env", "env", "env_from"), ("headers", None, "headers_env")):
            for key, value in (spec.get(source) or {}).items():
                whole = REFERENCE.fullmatch(str(value).strip())
                if whole:
                    out.setdefault(named, {})[str(key)] = whole.group(1)
                elif plain and not SECRET_NAMES.search(str(key)) and not REFERENCE.search(str(value)) \
                        and not SECRET_VALUES.search(str(value)):
                    out.setdefault(plain, {})[str(key)] = str(value)
                else:
                    dropped.append(f"{source} {key}")
        tools = spec.get("tools")
        if isinstance(tools, dict):
            kept = {k: [str(t) for t in tools[k]] for k in ("include", "exclude") if isinstance(tools.get(k), list)}
            if kept:
                out["tools"] = kept
        if any(not VARIABLE.fullmatch(v) for m in ("env_from", "headers_env") for v in (out.get(m) or {}).values()):
            left.append({"what": what, "why": "a variable it names is not a variable's name"})
            continue
        secret = secret_in(out)
        if secret:
            left.append({"what": what, "why": f"its {secret} holds a secret: nothing of it was copied; give the "
                                              "server its key by a variable (env_from) and add it by hand"})
            continue
        servers[name] = out
        notes.append(f"MCP server {name}: {'command ' + str(out['command']) if 'command' in out else out['url']}"
                     + (f" (env from {', '.join(sorted(out['env_from'].values()))})" if out.get("env_from") else ""))
        if dropped:
            left.append({"what": f"{what}: {', '.join(dropped)}",
                         "why": "a secret written as a value (or inside other text) is never copied into hermes.yaml: "
                                "put it in a variable and name it with env_from (or headers_env, for a whole "
                                "header)"})
    return servers, notes, left
