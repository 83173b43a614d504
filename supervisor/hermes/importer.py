"""What `hermes-sup import-hermes` reads of a Hermes Agent home or profile, and the plan it makes of it.

A Hermes home (`~/.hermes`) or profile (`~/.hermes/profiles/NAME`) holds config.yaml (the model and
its fallback providers), .env (API keys), SOUL.md (the agent's identity), memories/ (MEMORY.md,
USER.md) and skills/<category>/<name>/. Everything in it is treated as hostile: every file is read
bounded, never through a symlink, never a FIFO; YAML without aliases; and of .env only the names
are read: a key's value is never read, so it can reach neither hermes.yaml nor a log. The plan is
pure data; cli/hermes.py applies it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...agents.memory import HERMES_LIMITS, beyond_hermes, limits_problem, parse
from ...agents.routing import LOOPBACK_HOSTS
from ...agents.tools import DEFAULT_CAPABILITIES
from .cron import carry_jobs, offset_of
from .mcp import carry
from .profile import HermesImportError, Profile

AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

# Hermes provider id -> (kind, base_url, the variables its key is read from). Others need a base_url.
PROVIDERS: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "openrouter": ("openai", "https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY",)),
    "anthropic": ("anthropic", None, ("ANTHROPIC_API_KEY", "ANTHROPIC_TOKEN")),
    "openai": ("openai", "https://api.openai.com/v1", ("OPENAI_API_KEY",)),
    "openai-api": ("openai", "https://api.openai.com/v1", ("OPENAI_API_KEY",)),
    "nous": ("openai", "https://inference-api.nousresearch.com/v1", ("NOUS_API_KEY",)),
    "gemini": ("openai", "https://generativelanguage.googleapis.com/v1beta/openai", ("GEMINI_API_KEY",
                                                                                      "GOOGLE_API_KEY")),
    "deepseek": ("openai", "https://api.deepseek.com/v1", ("DEEPSEEK_API_KEY",)),
    "lmstudio": ("openai", "http://127.0.0.1:1234/v1", ("LM_API_KEY",)),
    "ollama": ("openai", "http://127.0.0.1:11434/v1", ()),
}
# What a Hermes home may hold that has no counterpart here, and why.
NOT_CARRIED = {
    "gateway": "messaging gateways (Telegram, Discord, Slack, ...): hermes-sup has none; its agents take work "
               "from the board (hermes-sup task add, or a file dropped in kanban/inbox/)",
    "sessions": "conversation history: Hermes' chat sessions have no counterpart; each task starts a fresh "
                "conversation, and the memory files carry the facts",
    "kanban": "Hermes' kanban.db: its tasks are not moved onto this board (add them with hermes-sup task add)",
    "plugins": "plugins: hermes-sup loads Python skills instead (skills/NAME.py)",
}
# Hermes toolset -> (the toolsets here, the capabilities they need); a toolset of Hermes' missing here
# has no counterpart and is named. Composites resolve to their parts (toolsets.py in hermes-agent).
TOOLSET_MAP: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "file": (("files",), ("fs.read", "fs.write")),
    "terminal": (("terminal",), ("shell",)),
    "memory": (("memory",), ("memory",)),
    "skills": (("skills",), ("skills",)),
    "delegation": (("delegation",), ("delegate",)),
    "kanban": (("kanban", "board"), ("kanban",)),
    "clarify": (("board",), ()),
}
COMPOSITES = {"hermes-cli": ("file", "terminal", "memory", "skills", "delegation", "clarify", "web", "browser",
                             "vision", "image_gen", "tts", "todo", "session_search", "code_execution", "cronjob"),
              "coding": ("file", "terminal", "skills", "memory", "delegation", "clarify", "web", "browser", "vision",
                         "todo", "session_search", "code_execution"),
              "safe": ("web", "vision", "image_gen")}
DEFAULT_TOOLSETS = ["files", "memory", "board", "skills", "kanban"]
# The default capabilities and `skills`: a Hermes profile uses its skills (skill_view, skill_manage).
IMPORTED_CAPABILITIES = [*DEFAULT_CAPABILITIES, "skills"]


def models_of(config: dict[str, Any]) -> list[dict[str, str]]:
    """The model and its fallbacks, in order, as {provider, model, base_url?} (pure)."""
    chain: list[dict[str, str]] = []
    model = config.get("model")
    if isinstance(model, str) and model.strip():
        chain.append({"provider": str(config.get("provider") or ""), "model": model.strip()})
    elif isinstance(model, dict):
        name = model.get("default") or model.get("model")
        if isinstance(name, str) and name.strip():
            chain.append({key: str(value) for key, value in (("provider", model.get("provider") or ""),
                                                           ("model", name.strip()),
                                                           ("base_url", model.get("base_url"))) if value is not None})
    fallbacks = config.get("fallback_providers") or []
    legacy = config.get("fallback_model")
    fallbacks = [*(fallbacks if isinstance(fallbacks, list) else []),
                 *(legacy if isinstance(legacy, list) else [legacy] if isinstance(legacy, dict) else [])]
    for entry in fallbacks:
        if isinstance(entry, dict) and isinstance(entry.get("model"), str) and entry["model"].strip():
            chain.append({key: str(entry[key]) for key in ("provider", "model", "base_url") if entry.get(key)})
    return chain


def _norm(name: Any) -> str:
    return str(name or "").strip().lower().replace(" ", "-").removeprefix("custom:")


def custom_providers(config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The profile's own named providers, by their normalised names (pure): Hermes' `providers:`
    mapping (by key and by `name`; `enabled: false` left out) and the `custom_providers:` list that
    `hermes model` writes, as {base_url, key_env?, model?}."""
    found: dict[str, dict[str, str]] = {}

    def add(names: list[Any], entry: dict[str, Any], model_key: str) -> None:
        url = entry.get("api") or entry.get("url") or entry.get("base_url")
        if not isinstance(url, str) or not url.strip():
            return
        spec = {"base_url": url.strip()}
        for key, value in (("key_env", entry.get("key_env")), ("model", entry.get(model_key))):
            if isinstance(value, str) and value.strip():
                spec[key] = value.strip()
        for name in names:
            if _norm(name):
                found.setdefault(_norm(name), spec)

    providers = config.get("providers")
    if isinstance(providers, dict):
        for key, entry in providers.items():
            if isinstance(entry, dict) and entry.get("enabled") is not False:
                add([key, entry.get("name")], entry, "default_model")
    listed = config.get("custom_providers")
    if isinstance(listed, list):
        for entry in listed:
            if isinstance(entry, dict):
                add([entry.get("name"), entry.get("provider_key")], entry, "model")
    return found


def with_custom(chain: list[dict[str, str]], config: dict[str, Any]) -> list[dict[str, str]]:
    """The chain with each entry that names one of the profile's own providers given its address,
    key variable and (when the entry has none) default model (pure)."""
    own = custom_providers(config)
    filled = []
    for entry in chain:
        custom = own.get(_norm(entry.get("provider"))) if not entry.get("base_url") else None
        if custom and _norm(entry.get("provider")) not in PROVIDERS:
            entry = {**entry, "base_url": custom["base_url"], "custom": "yes",
                     **({"key_env": custom["key_env"]} if "key_env" in custom else {})}
        filled.append(entry)
    return filled


def provider_spec(entry: dict[str, str], env: list[str]) -> tuple[dict[str, Any] | None, str]:
    """hermes.yaml's provider for one Hermes model entry, and a note; None when it cannot be carried
    over (pure)."""
    provider = (entry.get("provider") or "").strip().lower()
    if not provider and "/" in entry["model"] and "OPENROUTER_API_KEY" in env:
        provider = "openrouter"  # Hermes' default when only an OpenRouter key is set
    known = PROVIDERS.get(provider)
    if known is None and not entry.get("base_url"):
        return None, (f"model {entry['model']} of provider {provider or '(none named)'}: hermes-sup knows no "
                      "address for it; add a provider with kind openai and its base_url to hermes.yaml")
    kind, base_url, keys = known or ("openai", None, ())
    spec: dict[str, Any] = {"kind": kind, "model": entry["model"]}
    if entry.get("base_url") or base_url:
        spec["base_url"] = entry.get("base_url") or base_url
    key = next((name for name in keys if name in env), keys[0] if keys else None)
    elsewhere = bool(entry.get("base_url")) and entry["base_url"].rstrip("/") != (base_url or "").rstrip("/")
    note = f"{entry['model']} ({provider or 'custom'})"
    if entry.get("custom"):
        note = f"{entry['model']} (the profile's own provider {provider} at {entry['base_url']})"
        named = entry.get("key_env")
        if named and urlsplit(entry["base_url"]).hostname in LOOPBACK_HOSTS:
            key, elsewhere = named, False  # a server on this machine: the key goes nowhere else
        elif named:
            note += (f": its key variable {named} is left out, as the address is not on this machine (add "
                     f"api_key_env: {named} to the provider by hand if that address is yours)")
    if key and elsewhere:
        # The profile's address with this workspace's key for the provider: a hostile profile would
        # have the team's key (and, first in every tier, its tasks) sent wherever it says.
        note += (f" at {spec['base_url']}, not {provider}'s own address: its key variable is left out (add "
                 f"api_key_env: {key}, or another, to the provider by hand if that address is yours)")
        key = None
    if key:
        spec["api_key_env"] = key
    if key and key not in env:
        note += f": its key is read from {key}, which the profile's .env does not set"
    return spec, note


@dataclass
class Plan:
    name: str
    entry: dict[str, Any]
    providers: dict[str, dict[str, Any]]
    memories: dict[str, bytes]
    skills: list[tuple[str, bytes]]
    notes: list[str]                          # what was carried over, said to the user
    not_carried: list[dict[str, str]]         # {what, why}
    warnings: list[str]
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    schedules: list[dict[str, Any]] = field(default_factory=list)


def toolsets_of(config: dict[str, Any]) -> tuple[list[str], list[str], list[dict[str, str]]] | None:
    """(toolsets, capabilities, what has no counterpart) of the Hermes toolsets the profile's CLI
    uses (`platform_toolsets.cli`, else `toolsets`), or None when it names none or only Hermes'
    default set (pure). `shell` and `delegate` are granted when the profile used them: the import
    carries the profile's rights, no more."""
    platforms = config.get("platform_toolsets")
    chosen = platforms.get("cli") if isinstance(platforms, dict) else None
    if chosen is None:
        chosen = config.get("toolsets")
    if not isinstance(chosen, list) or not chosen or chosen == ["hermes-cli"]:
        return None
    names: list[str] = []
    for item in chosen:
        if isinstance(item, str):
            names += COMPOSITES.get(item.strip(), (item.strip(),))
    toolsets: list[str] = []
    capabilities: list[str] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        mapped = TOOLSET_MAP.get(name)
        if mapped is None:
            missing.append(name)
            continue
        toolsets += [t for t in mapped[0] if t not in toolsets]
        capabilities += [c for c in mapped[1] if c not in capabilities]
    left = [{"what": f"toolset {name[:60]}", "why": "Hermes' toolset has no counterpart here (an MCP server may give "
             "its tools: mcp_servers in hermes.yaml)"} for name in missing]
    return toolsets, capabilities, left


def skill_names_of(files: list[tuple[str, bytes]]) -> list[str]:
    """The instruction skills among a profile's skill files, by name (their folder's), as hermes-sup
    finds them: not an archived SKILL.md in a skill's references/, templates/, scripts/, assets/ (pure)."""
    from ...agents.skills import SUPPORT_FOLDERS

    names = set()
    for path, _ in files:
        parts = path.split("/")
        if parts[-1] == "SKILL.md" and len(parts) >= 2 and not set(parts[:-2]) & SUPPORT_FOLDERS:
            names.add(parts[-2])
    return sorted(names)


def agent_name(requested: str | None, profile: Path) -> str:
    """The new agent's name: --name, else the profile's folder name (`.hermes`: hermes) (pure)."""
    name = requested or profile.resolve().name.lstrip(".") or "hermes"
    if not AGENT_NAME.fullmatch(name):
        raise HermesImportError(f"agent name {name!r} must be 1 to 64 letters, digits, '-' or '_', starting with a "
                                "letter or digit; give one with --name")
    return name


def make_plan(profile: Profile, name: str, current: dict[str, Any], now: datetime | None = None) -> Plan:
    """The agent, providers and files the profile becomes, given the workspace's hermes.yaml as
    parsed (pure). Refuses a name already taken, by an agent or a provider."""
    agents = [a for a in current.get("agents") or [] if isinstance(a, dict)]
    taken = {str(a.get("name")) for a in agents}
    taken |= {f"{a.get('name')}-{i}" for a in agents for i in range(1, int(a.get("count", 1) or 1) + 1)}
    if name in taken:
        raise HermesImportError(f"hermes.yaml already has an agent named {name}; import under another name with "
                                "--name (nothing was changed)")
    existing_providers = set(current.get("providers") or {})
    now = now or datetime.now(UTC)
    schedules: list[dict[str, Any]] = []
    notes: list[str] = []
    warnings: list[str] = []
    not_carried = [{"what": key, "why": NOT_CARRIED[key]} for key in profile.present]
    providers: dict[str, dict[str, Any]] = {}
    for index, model in enumerate(with_custom(models_of(profile.config), profile.config)):
        spec, note = provider_spec(model, profile.env)
        if spec is None:
            not_carried.append({"what": "model", "why": note})
            continue
        provider_name = name if index == 0 else f"{name}-fallback-{index}"
        if provider_name in existing_providers:
            raise HermesImportError(f"hermes.yaml already has a provider named {provider_name}; import under another "
                                    "name with --name (nothing was changed)")
        providers[provider_name] = spec
        notes.append(f"provider {provider_name}: {note}")
    for where in (profile.config.get("model"), *(profile.config.get("fallback_providers") or [])):
        if isinstance(where, dict) and where.get("api_key"):
            warnings.append("config.yaml holds an api_key value: it was not copied; put the key in the workspace's "
                            ".env and name it with api_key_env")
            break
    model = profile.config.get("model")
    window = model.get("context_length") if isinstance(model, dict) else None
    if providers and isinstance(window, int) and not isinstance(window, bool):
        first = next(iter(providers))
        if 1_000 <= window <= 10_000_000:
            providers[first]["context_window"] = window
            notes.append(f"provider {first}: context_window {window:,} (model.context_length)")
        else:
            not_carried.append({"what": "model.context_length", "why": f"{window} is no context window hermes-sup "
                                "takes (1,000 to 10,000,000 tokens)"})
    display = profile.config.get("display")
    personality = display.get("personality") if isinstance(display, dict) else None
    if isinstance(personality, str) and personality.strip() and personality.strip().lower() not in ("default",
                                                                                                      "none"):
        not_carried.append({"what": f"display.personality {personality.strip()[:60]}",
                            "why": "Hermes' personality presets have no counterpart here: write the tone you want "
                                   "into the agent's identity (its SOUL.md, carried over as identity)"})
    if profile.description:
        notes.append(f"description (profile.yaml): {profile.description[:200]!r}: hermes-sup routes tasks by "
                     "roles; give the agent roles that say it")
    entry: dict[str, Any] = {"name": name, "capabilities": list(IMPORTED_CAPABILITIES),
                             "toolsets": list(DEFAULT_TOOLSETS)}
    mapped = toolsets_of(profile.config)
    if mapped is not None:
        entry["toolsets"], entry["capabilities"], left = mapped
        not_carried += left
        notes.append(f"toolsets: {', '.join(entry['toolsets']) or 'none'} (capabilities "
                     f"{', '.join(entry['capabilities']) or 'none'}), from the profile's CLI toolsets")
    if profile.soul:
        entry["identity"] = profile.soul
        notes.append(f"identity: SOUL.md ({len(profile.soul):,} characters)")
    memory = profile.config.get("memory")
    if isinstance(memory, dict):
        limits = {key: memory[key] for key in ("memory_char_limit", "user_char_limit")
                  if key in memory and memory[key] != HERMES_LIMITS[key.split("_")[0]]}
        if limits and not limits_problem(limits):
            entry["memory"] = limits
    for file_name, data in profile.memories.items():
        target = "user" if file_name == "USER.md" else "memory"
        entries = parse(data.decode("utf-8"))
        notes.append(f"memory: {file_name} ({len(entries)} entries)")
        flag = beyond_hermes(target, entries)
        limit = (entry.get("memory") or {}).get(f"{target}_char_limit", HERMES_LIMITS[target])
        if flag and len(data.decode("utf-8")) > limit:
            warnings.append(f"{flag}; it is copied as it is, and the agent will have to remove entries before it "
                            "can add one")
    names = skill_names_of(profile.skills)
    if names:
        # Hermes keeps skills per profile: the agent's own are the ones it sees (agents/skills.py).
        entry["skills"] = names
        notes.append(f"skills: {len(names)} copied into the workspace's skills/, and the agent's skills: are "
                     "these (it sees no other instruction skill; agents without a skills: list see them all)")
    warnings += [f"not copied: {what}" for what in profile.skipped]
    if profile.env:
        notes.append(f"keys named in .env: {', '.join(profile.env)} (values are never copied: put the ones you need "
                     "in the workspace's .env)")
    if mapped is None:
        not_carried.append({"what": "shell and delegation", "why": "not granted by default: add shell and delegate "
                            "to the agent's capabilities (and terminal, delegation to its toolsets) to give them"})
    servers, mcp_notes, mcp_left = carry(profile.config, set(current.get("mcp_servers") or {}) - {"__line__"})
    notes += mcp_notes
    not_carried += mcp_left
    if servers:
        entry["mcp_servers"] = sorted(servers)
        entry["toolsets"].append("mcp")
        if any("command" in spec for spec in servers.values()):
            # A stdio server's tools need shell; the terminal stays out of the toolsets, so it is
            # theirs alone (and confined: agents/sandbox.py).
            entry["capabilities"].append("shell")
        if any("url" in spec for spec in servers.values()):
            entry["capabilities"].append("network")
    chain = list(providers)
    if chain:  # its own models, as in Hermes: the team's tiers stay the team's
        entry["providers"] = chain
        notes.append(f"providers: the agent's own chain {', '.join(chain)} serves all its model calls, whatever "
                     "the tier (the team's tiers are unchanged)")
    if profile.jobs:
        taken = {str(s.get("name")) for s in current.get("schedules") or [] if isinstance(s, dict)}
        try:
            zone, offset = offset_of(profile.config.get("timezone") if isinstance(profile.config.get("timezone"),
                                                                                   str) else None, now)
        except ValueError as exc:
            zone, offset = str(profile.config.get("timezone")), None
            not_carried += [{"what": f"cron job {job.get('name') or job.get('id')}", "why": f"{exc}"}
                            for job in profile.jobs]
        if offset is not None:
            schedules, cron_notes, cron_left = carry_jobs(profile.jobs, zone, offset, taken)
            notes += cron_notes
            not_carried += cron_left
    return Plan(name, entry, providers, profile.memories, profile.skills, notes, not_carried, warnings,
                servers, schedules)
