"""hermes.yaml's schema as data: every section and key with its type, bounds, default and one sentence of meaning."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...agents.offer import MODES as OFFER_MODES
from ...agents.sandbox import MODES as SANDBOX_MODES
from ...agents.tools import CAPABILITIES
from ...kanban.task import TIERS
from .runtimes import MAX_RUNTIME, RUNTIMES

MAX_COUNT = 64  # each agent is a Python process of its own: more than this is a typo, not a team
MAX_LOG_KEEP = 100  # the agent renames each kept file on every rotation
MAX_WHOLE = 10**9  # other whole numbers: far above any sane setting, and exact in JSON and floats
MAX_SECONDS = 86_400  # every duration in hermes.yaml
PROVIDER_KINDS = ("openai", "anthropic", "auto", "offline")
Fail = Callable[[Any, str], Exception]  # fail(mapping, message): the error at the mapping's line


@dataclass(frozen=True)
class Field:
    """One key of hermes.yaml. `kind` is seconds, number, whole, bool, text, choice, names (a list of
    names), mapping (its keys in `fields`, or each value an `item`), list (each entry an `item`) or any.
    `checked`: the schema checks the value; otherwise a hand-written checker does (the doc still says it)."""

    name: str
    kind: str
    doc: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    zero: bool = False  # seconds and numbers: 0 is allowed (else they must be above it)
    null: bool = False  # null is allowed (and means "no limit" or "the default")
    choices: tuple[Any, ...] = ()
    says: str = ""  # how a message names a right value, where the generic wording would say less
    fields: tuple[Field, ...] = ()
    item: Field | None = None
    checked: bool = True

    def names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    def field(self, name: str) -> Field:
        return next(field for field in self.fields if field.name == name)


def _seconds(name: str, doc: str, default: Any = None, *, zero: bool = False, high: float = MAX_SECONDS) -> Field:
    return Field(name, "seconds", doc, default, low=0, high=high, zero=zero)


BACKOFF = Field("backoff", "mapping", "How long to wait before restarting a failed agent: doubling from `initial` "
                "up to `max`.", fields=(
                    _seconds("initial", "Seconds before the first restart.", 0.5, zero=True),
                    _seconds("max", "The longest wait between restarts, in seconds.", 30.0, zero=True)))
RESTART = Field("restart", "mapping", "When and how often a stopped agent is started again.", fields=(
    Field("policy", "choice", "always: restart whatever the exit; on-failure: only after a failure; never: leave it "
          "stopped.", "on-failure", choices=("always", "on-failure", "never"), checked=False),
    BACKOFF,
    Field("max_restarts", "whole", "Restarts allowed within `window` seconds before the agent is given up.", 5,
          low=0, high=MAX_WHOLE),
    _seconds("window", "The span, in seconds, over which `max_restarts` is counted.", 60.0),
    _seconds("reset_after", "Seconds an agent must stay up for its backoff to start again from `initial`.", 30.0),
))
TERMINAL = Field("terminal", "mapping", "The terminal tool: its time limit and the rules of commands it runs "
                 "without asking.", fields=(
                     _seconds("timeout", "Seconds a command may run before it is stopped."),
                     Field("approve", "names", "Names of the approval rules that let commands through.",
                           says="a list of rule names", checked=False)))
DELEGATION = Field("delegation", "mapping", "How an agent hands part of its task to a sub-agent.", fields=(
    Field("tier", "choice", "The tier of the sub-agents' model.", "cheap", choices=TIERS, checked=False),
    Field("max_depth", "whole", "How deep delegations may nest (0: none).", low=0, high=10),
    Field("max_concurrent", "whole", "Sub-agents that may run at once.", low=1, high=MAX_COUNT),
    _seconds("timeout", "Seconds a sub-agent may take."),
))

# The supervision settings: in `defaults`, and in each agent, where they override the defaults.
SETTINGS = (
    RESTART,
    _seconds("stop_timeout", "Seconds an agent gets to stop after SIGTERM before it is killed.", 10.0),
    _seconds("heartbeat_timeout", "Seconds of silence after which an agent is killed and restarted.", 60.0),
    _seconds("orphan_grace", "How long, in seconds, agents keep working without a supervisor.", 30.0,
             zero=True),
    Field("max_rss_mb", "number", "Memory, in MB, of the agent's whole process tree, checked every 5 s (null: "
          "no limit).", 1024.0, null=True, says="a number > 0 or null"),
    Field("log_max_mb", "number", "The size, in MB, at which agent.log is rotated.", 10.0, says="a number > 0"),
    Field("log_keep", "whole", "How many rotated logs are kept.", 3, low=0, high=MAX_LOG_KEEP),
    Field("max_iterations", "whole", "The loop's turns per task.", 60, low=1, high=MAX_WHOLE,
          null=True, says=f"a whole number > 0 up to {MAX_WHOLE:,} (or absent)"),
    Field("max_tokens", "whole", "The most tokens one task may spend.", low=1, high=MAX_WHOLE, null=True,
          says=f"a whole number > 0 up to {MAX_WHOLE:,} (or absent)"),
    Field("max_cost", "number", "The most dollars one task may spend.", null=True, says="a number > 0 (or absent)"),
    TERMINAL,
    DELEGATION,
    Field("memory", "mapping", "Limits, in characters, of the agent's memory files (memory_char_limit, "
          "user_char_limit).", checked=False),
    Field("offer_tools", "choice", "Which tools the model is offered: task: those the task calls for; all: every "
          "tool.", "task", choices=OFFER_MODES,
          says=f"one of {', '.join(OFFER_MODES)} (task: the tools the task calls for; all: every tool)"),
    Field("folders", "any", "Folders outside the workspace granted to the agent (read or write).", checked=False),
    Field("sandbox", "choice", "How the agent's commands are confined: auto: bubblewrap, else Landlock; none: "
          "not at all.", "auto", choices=SANDBOX_MODES,
          says=f"one of {', '.join(SANDBOX_MODES)} (auto: bubblewrap, else Landlock; none: commands run with the "
               "agent's full rights)"),
    Field("mcp_servers", "any", "The MCP servers whose tools the agent may call.", checked=False),
)

_NAMES = Field("item", "text", "A name.")
AGENT = Field("agent", "mapping", "One agent, or `count` alike ones.", fields=(
    Field("name", "text", "The agent's name (letters, digits, '-' and '_'), which names its folder under runs/.",
          checked=False),
    Field("roles", "names", "The roles of the tasks it takes."),
    Field("tier", "choice", "The tier of model it works with.", "auto", choices=TIERS, checked=False),
    Field("skills", "names", "Skills (in skills/ or bundled) it may use."),
    Field("capabilities", "names", f"What it may do, drawn from {', '.join(CAPABILITIES)}.", choices=CAPABILITIES,
          checked=False),
    Field("count", "whole", "How many alike agents run (named NAME-1, NAME-2, ...).", 1, low=1, high=MAX_COUNT),
    Field("provider", "text", "Accepted for older files and not read: an agent's own chain is `providers`.",
          checked=False),
    Field("env", "mapping", "Environment variables set for the agent.", checked=False),
    *SETTINGS,
    Field("identity", "text", "Its identity, in its system prompt.", null=True),
    Field("toolsets", "names", "Narrows the tools offered to these toolsets (built-in ones or skills' names); "
          "null: all.", null=True),
    Field("command", "names", "The program to run instead of the built-in agent, with its arguments (a path "
          "relative to runs/<agent>/, or a name on PATH).",
          checked=False),
    Field("runtime", "choice", "builtin: the built-in loop; command: any agent CLI, one run per task; hermes: "
          "Hermes Agent's CLI.", "builtin", choices=RUNTIMES, checked=False),
    Field("argv", "names", "runtime command: the CLI's arguments, with placeholders.", checked=False),
    Field("max_runtime", "seconds", "A CLI runtime: seconds one run may take (at most a week).", low=0,
          high=MAX_RUNTIME, checked=False),
    Field("env_from", "mapping", "A CLI runtime: the CLI's variables, each named for one of ours that holds its "
          "value.", checked=False),
    Field("profile", "text", "runtime hermes: the Hermes Agent profile.", checked=False),
    Field("hermes_home", "text", "runtime hermes: Hermes Agent's home folder.", checked=False),
    Field("program", "text", "runtime hermes: the hermes program.", checked=False),
    Field("providers", "names", "The built-in loop's own chain of providers, tried in order.", checked=False),
))

PROVIDER = Field("provider", "mapping", "One LLM provider.", fields=(
    Field("kind", "choice", "The protocol it speaks, or auto (the first that answers) or offline.", "openai",
          choices=PROVIDER_KINDS, checked=False),
    Field("model", "text", "The model's name (needed for openai and anthropic).", null=True),
    Field("base_url", "text", "The server's address.", null=True),
    Field("api_key_env", "text", "The environment variable that holds its API key (keys are never written here).",
          null=True),
    _seconds("timeout", "Seconds one call may take."),
    Field("max_tokens", "whole", "The most tokens of one answer.", low=1, high=MAX_WHOLE),
    Field("context_window", "whole", "The model's context window, in tokens.", low=1, high=MAX_WHOLE),
    Field("stream", "bool", "Whether answers are streamed."),
))
PRICE = Field("price", "mapping", "Dollars per million tokens of one model.", checked=False, fields=(
    Field("input", "number", "Dollars per million input tokens.", zero=True),
    Field("output", "number", "Dollars per million output tokens.", zero=True),
    Field("cached", "number", "Dollars per million cached input tokens.", zero=True),
))

TOP = Field("hermes.yaml", "mapping", "A hermes-sup team.", fields=(
    Field("providers", "mapping", "The LLM providers, by name.", item=PROVIDER, checked=False),
    Field("tiers", "mapping", "Each tier's chain of provider names, tried in order.", checked=False, fields=tuple(
        Field(tier, "names", f"The providers of tier {tier}.", checked=False) for tier in TIERS[1:])),
    Field("defaults", "mapping", "Supervision settings of every agent that does not set them itself.",
          fields=SETTINGS),
    Field("agents", "list", "The team: at least one agent.", item=AGENT, checked=False),
    Field("prices", "mapping", "What each model costs, by model name.", item=PRICE, checked=False),
    Field("board", "mapping", "Where the board lives: backend files (kanban/) or postgres (dsn_env, host_timeout).",
          checked=False, fields=(
              Field("backend", "choice", "files or postgres.", "files", choices=("files", "postgres")),
              Field("dsn_env", "text", "postgres: the environment variable holding the DSN.", "HERMES_SUP_PG_DSN"),
              _seconds("host_timeout", "postgres: seconds after which a silent host's tasks are freed.", 30.0))),
    Field("host", "text", "This host's name on a shared board (default: the hostname).", checked=False),
    Field("fork_server", "bool", "Whether agents start as forks of a process that has imported the agent runtime "
          "(faster restarts, shared memory; $HERMES_SUP_FORK_SERVER=1 or 0 overrides it).", False),
    Field("schedules", "list", "Tasks created on a cron schedule.", checked=False),
    Field("routing", "mapping", "How a task's tier picks its model (strategy: cascade and its settings).",
          checked=False),
    Field("alerts", "list", "Webhooks told of events such as an agent given up.", checked=False),
    Field("budgets", "mapping", "Spending limits of the team and of each task.", checked=False),
    Field("folders", "any", "Folders outside the workspace, by name, that agents may be granted.", checked=False),
    Field("mcp_servers", "mapping", "MCP servers, by name, whose tools agents may call.", checked=False),
    Field("telemetry", "mapping", "OpenTelemetry traces of tasks and model calls.", checked=False, fields=(
        Field("otlp_endpoint", "text", "The collector's OTLP/HTTP address."),
        Field("content", "bool", "Whether prompts and answers are exported too.", False))),
    Field("metrics", "mapping", "The Prometheus metrics endpoint.", fields=(
        Field("port", "whole", "The port it listens on (0: any free one).", low=0, high=65535, null=True,
              says="a port number (0 to 65535)"),
        Field("host", "text", "The address it listens on.", says="an address to listen on"))),
))


# -- checks driven by the schema ------------------------------------------------------------------------

def near(key: Any, known: tuple[str, ...]) -> str:
    """' (did you mean 'roles'?)' for a key that is a near miss of a known one, else ''."""
    match = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_keys(node: dict[Any, Any], field: Field, fail: Fail, *, unknown: str = "unknown key", prefix: str = "",
               where: str = "") -> None:
    """Every key of `node` is one of `field`'s: else the first other one, with the known key it is closest to."""
    known = field.names()
    for key in node:
        if key != "__line__" and key not in known:
            raise fail(node, f"{_lead(where)}{unknown} '{prefix}{key}'{near(key, known)}; expected one of "
                             f"{', '.join(known)}")


def check_values(node: dict[Any, Any], fields: tuple[Field, ...], fail: Fail, *, where: str = "",
                 prefix: str = "") -> None:
    """The values of `node`'s keys that the schema checks (types, bounds, choices), and the keys of its
    mappings that have keys of their own, each error at the line of the mapping that holds the key."""
    for field in fields:
        if field.name not in node:
            continue
        value, label = node[field.name], f"{prefix}{field.name}"
        if field.kind == "mapping" and field.fields and field.checked:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise fail(node, f"{_lead(where)}'{label}' must be a mapping ({', '.join(field.names())})")
            check_keys(value, field, fail, prefix=f"{label}.", where=where)
            check_values(value, field.fields, fail, where=where, prefix=f"{label}.")
        elif field.checked and field.kind != "mapping" and not valid(field, value):
            raise fail(node, f"{_lead(where)}'{label}' must be {expected(field)}, got {value!r}")


def valid(field: Field, value: Any) -> bool:
    """Whether `value` is right for `field` (its kind, bounds and choices)."""
    if value is None:
        return field.null
    if field.kind in ("seconds", "number"):
        if not finite(value):
            return False
        above = value >= (field.low or 0) if field.zero else value > (field.low or 0)
        return above and (field.high is None or value <= field.high)
    if field.kind == "whole":
        return (isinstance(value, int) and not isinstance(value, bool)
                and (field.low is None or value >= field.low) and (field.high is None or value <= field.high))
    if field.kind == "bool":
        return isinstance(value, bool)
    if field.kind == "text":
        return isinstance(value, str)
    if field.kind == "choice":
        return value in field.choices
    if field.kind == "names":
        return isinstance(value, list) and all(isinstance(item, str) and item for item in value)
    return True


def expected(field: Field) -> str:
    """What a right value of `field` is, in the words of its error message."""
    if field.says:
        return field.says
    if field.kind == "seconds":
        return f"a number of seconds {'>=' if field.zero else '>'} 0 and at most {field.high:,.0f}"
    if field.kind == "number":
        return f"a number {'>=' if field.zero else '>'} 0"
    if field.kind == "whole":
        return f"a whole number from {field.low:,.0f} to {field.high:,.0f}"
    if field.kind == "bool":
        return "true or false"
    if field.kind == "choice":
        return f"one of {', '.join(map(str, field.choices))}"
    return {"text": "text", "names": "a list of names"}.get(field.kind, "a value")


def finite(value: Any) -> bool:
    """A finite int or float: NaN compares false with everything, so no range check would catch it,
    and an int too large for a float would raise where the specs are built."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _lead(where: str) -> str:
    return f"{where}: " if where else ""
