"""Which provider serves a call: the `auto` strategy, and tiers as ordered fallback chains.

`auto` looks for an API key in the environment first (Anthropic, OpenAI, OpenRouter), then for a
local OpenAI-compatible server on its usual port (Ollama 11434, LM Studio 1234, vLLM 8000,
llama.cpp 8080, probed at /v1/models with a short timeout), and otherwise answers None: offline,
where only tasks with `steps` can run. The decision is a pure function of the environment and the
probe's answers.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from .providers import ProviderConfig

KEYED = (
    ("ANTHROPIC_API_KEY", "anthropic", None, "claude-sonnet-4-5"),
    ("OPENAI_API_KEY", "openai", None, "gpt-4o-mini"),
    ("OPENROUTER_API_KEY", "openai", "https://openrouter.ai/api/v1", "openrouter/auto"),
)
LOCAL_PORTS = ((11434, "ollama"), (1234, "lm-studio"), (8000, "vllm"), (8080, "llama.cpp"))
PROBE_TIMEOUT = 0.3
REACH_TIMEOUT = 2.0


def probe_models(base_url: str, timeout: float = PROBE_TIMEOUT) -> list[str] | None:
    """The model ids an OpenAI-compatible server lists, or None if nothing answers there."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/models", timeout=timeout) as response:
            data = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    return [str(m.get("id")) for m in models if isinstance(m, dict) and m.get("id")] if isinstance(models, list) else []


def unreachable(config: ProviderConfig, timeout: float = REACH_TIMEOUT) -> str | None:
    """Why a provider's server cannot be reached, or None when it answers: one short GET of its model
    list, without a key and around any proxy. Any HTTP answer (401, 404 included) means a server is
    there. A provider without a base_url (the SDK's cloud endpoint) is not probed: None."""
    if not config.base_url:
        return None
    path = "/v1/models" if config.kind == "anthropic" else "/models"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{config.base_url.rstrip('/')}{path}", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return str(reason) or type(reason).__name__


def resolve_auto(env: Mapping[str, str], probe: Callable[[str], list[str] | None] = probe_models,
                 host: str = "127.0.0.1", ports: tuple[tuple[int, str], ...] = LOCAL_PORTS) -> ProviderConfig | None:
    for variable, kind, base_url, model in KEYED:
        if env.get(variable):
            return ProviderConfig(name=f"auto:{kind if not base_url else 'openrouter'}", kind=kind, model=model,
                                  base_url=base_url, api_key_env=variable)
    for port, server in ports:
        base_url = f"http://{host}:{port}/v1"
        models = probe(base_url)
        if models is not None:
            return ProviderConfig(name=f"auto:{server}", kind="openai", model=models[0] if models else "default",
                                  base_url=base_url)
    return None


def provider_configs(config: Mapping[str, Any]) -> dict[str, ProviderConfig]:
    """The named providers of hermes.yaml (`auto` is resolved separately, when needed)."""
    out = {}
    for name, spec in (config.get("providers") or {}).items():
        if not isinstance(spec, Mapping) or spec.get("kind") == "auto":
            continue
        out[name] = ProviderConfig(
            name=name, kind=str(spec.get("kind", "openai")), model=str(spec.get("model", "")),
            base_url=spec.get("base_url"), api_key_env=spec.get("api_key_env"),
            timeout=float(spec.get("timeout", 120.0)), max_tokens=int(spec.get("max_tokens", 4096)),
            context_window=int(spec.get("context_window", 200_000 if spec.get("kind") == "anthropic" else 128_000)),
            stream=bool(spec.get("stream", False)),
        )
    return out


def chain_for(tier: str, config: Mapping[str, Any], auto: Callable[[], ProviderConfig | None],
              env: Mapping[str, str]) -> list[ProviderConfig]:
    """The ordered providers of a tier. Providers whose key is missing from the environment are left
    out (a local server needs none); `auto` stands for whatever `resolve_auto` finds."""
    tiers = config.get("tiers") or {}
    names = tiers.get(tier) or tiers.get("standard") or ["auto"]
    named = provider_configs(config)
    chain: list[ProviderConfig] = []
    for name in names:
        if name == "auto":
            found = auto()
            if found is not None:
                chain.append(found)
            continue
        provider = named.get(name)
        if provider is None:
            continue
        if provider.api_key_env and not env.get(provider.api_key_env):
            continue
        chain.append(provider)
    return chain


ESCALATION = ("cheap", "standard", "premium")
SHORT_TASK = 500  # characters of title and body


def task_tier(task: Mapping[str, Any], agent_tier: str) -> str:
    """A task's own tier, else its agent's. `auto` on both picks by the attempt: a short task starts
    on the cheap tier, a long one on standard, and each failed attempt escalates one tier."""
    for tier in (task.get("tier"), agent_tier):
        if tier and tier != "auto":
            return str(tier)
    size = len(str(task.get("title") or "")) + len(str(task.get("body") or ""))
    start = 0 if size <= SHORT_TASK else 1
    attempt = max(1, int(task.get("attempts") or 1))
    return ESCALATION[min(len(ESCALATION) - 1, start + attempt - 1)]
