"""hermes.yaml's schema as data: every section and key with its type, bounds, default and one sentence of meaning."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...agents.grants import MODES as FOLDER_MODES
from ...agents.offer import MODES as OFFER_MODES
from ...agents.sandbox import MODES as SANDBOX_MODES
from ...agents.tools import CAPABILITIES
from ...kanban.task import TIERS
from ..governance.alerts import ALERTS
from ..governance.alerts import ENV_NAME as ALERT_ENV
from ..governance.schedules import NAME as SCHEDULE_NAME
from .mcpconfig import VARIABLE
from .runtimes import MAX_RUNTIME, RUNTIMES

MAX_COUNT = 64  # each agent is a Python process of its own: more than this is a typo, not a team
MAX_LOG_KEEP = 100  # the agent renames each kept file on every rotation
MAX_WHOLE = 10**9  # other whole numbers: far above any sane setting, and exact in JSON and floats
MAX_SECONDS = 86_400  # every duration in hermes.yaml
MAX_MCP_SECONDS = 3600  # an MCP server's timeouts
PROVIDER_KINDS = ("openai", "anthropic", "auto", "offline")
STRATEGIES = ("tiers", "cascade")  # routing: agents/cascade.py serves the second
Fail = Callable[[Any, str], Exception]  # fail(mapping, message): the error at the mapping's line


@dataclass(frozen=True)
class Field:
    """One key of hermes.yaml. `kind` is seconds, number, whole, bool, text, choice, names (a list of
    names), scalar (text, a number or true/false), mapping (its keys in `fields`, or each value an `item`),
    list (each entry an `item`) or any. `checked`: the schema checks the value; otherwise a hand-written
    checker does (the doc still says it). `each`: how messages name an entry that is this item (`{key}`:
    its name); without it, by its path."""

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
    pattern: str = ""  # text: the regular expression the whole value matches
    each: str = ""

    def names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    def field(self, name: str) -> Field:
        return next(field for field in self.fields if field.name == name)


def _seconds(name: str, doc: str, default: Any = None, *, zero: bool = False, high: float = MAX_SECONDS,
             null: bool = False) -> Field:
    return Field(name, "seconds", doc, default, low=0, high=high, zero=zero, null=null)


def _dollars(name: str, doc: str) -> Field:
    return Field(name, "number", doc, zero=True, says="a number of dollars, 0 or more")


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
    Field("folders", "names", "Folders outside the workspace granted to the agent, by their names in the "
          "top-level `folders`.", says="a list of names of folders"),
    Field("sandbox", "choice", "How the agent's commands are confined: auto: bubblewrap, else Landlock; none: "
          "not at all.", "auto", choices=SANDBOX_MODES,
          says=f"one of {', '.join(SANDBOX_MODES)} (auto: bubblewrap, else Landlock; none: commands run with the "
               "agent's full rights)"),
    Field("mcp_servers", "names", "The MCP servers whose tools the agent may call, by their names in the "
          "top-level `mcp_servers`.", says="a list of names of MCP servers"),
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

# -- the sections whose checkers (governance/, folders.py, mcpconfig.py) judge what the schema cannot say --

SCHEDULE = Field("schedule", "mapping", "One schedule: its task is added at each due time.", each="schedules",
                 fields=(
    Field("name", "text", "Its name (1 to 45 lower-case letters, digits or '-'), part of its tasks' ids "
          "(sched-NAME-YYYYmmddHHMM).", pattern=SCHEDULE_NAME.pattern, checked=False),
    Field("cron", "text", "When, as five cron fields in UTC (minute hour day-of-month month day-of-week), in "
          "quotes.", checked=False),
    Field("task", "mapping", "The task added, as a task file holds it (title, role, priority, ...), without id "
          "or status.", checked=False),
))
ROUTING = Field("routing", "mapping", "How the calls of a task whose tier is auto are served.", fields=(
    Field("strategy", "choice", "tiers: the chain of the agent's tier; cascade: the cheap tier first, the premium "
          "one when its answer is unsure.", "tiers", choices=STRATEGIES),
    Field("cheap", "choice", "cascade: the tier asked first.", "cheap", choices=TIERS[1:]),
    Field("premium", "choice", "cascade: the tier an unsure answer goes up to.", "premium", choices=TIERS[1:]),
    Field("min_confidence", "number", "cascade: the confidence, from 0 to 1, at or above which the cheap answer "
          "is kept.", 0.7, zero=True, high=1, says="a number from 0 to 1"),
    Field("verify", "bool", "cascade: whether a kept answer is also put to a cheap verifier call.", False),
))
ALERT = Field("alert", "mapping", "One webhook and the alerts it is sent.", each="alerts", fields=(
    Field("webhook_env", "text", "The environment variable that holds the webhook's URL (never the URL itself).",
          pattern=ALERT_ENV.pattern, checked=False),
    Field("secret_env", "text", "The environment variable that holds the secret its POSTs are signed with "
          "(HMAC-SHA256).", pattern=ALERT_ENV.pattern, checked=False),
    Field("on", "names", "The alerts it is sent (at least one).", choices=ALERTS, low=1, checked=False),
))
_CAPS = (_dollars("per_day", "Dollars that may be spent per UTC day."),
         _dollars("total", "Dollars that may be spent in all."))
BUDGETS = Field("budgets", "mapping", "Hard caps, in dollars, checked before every model call.", fields=(
    Field("team", "mapping", "The whole team's caps.", fields=_CAPS),
    Field("agents", "mapping", "Each agent's caps, by its name in hermes.yaml (worker for worker-1, worker-2, ...).",
          item=Field("caps", "mapping", "One agent's caps.", fields=_CAPS)),
    Field("tasks", "mapping", "Every task's cap.", fields=(
        _dollars("max_cost", "The most one task may spend (its own meta.max_cost may lower it, never raise it)."),)),
))
FOLDER = Field("folder", "mapping", "One folder and how agents granted it may use it.", each="folder {key}", fields=(
    Field("path", "text", "Its path (~ and paths relative to the workspace allowed): a folder that exists, not "
          "the workspace's own.", checked=False),
    Field("mode", "choice", "ro: read only; rw: read and write.", "ro", choices=FOLDER_MODES),
    Field("worktree", "bool", "mode rw, the top of a git checkout: each task works on a branch of its own, in a "
          "worktree of its own.", False, null=True),
    Field("base", "text", "worktree: the branch, tag or commit a task's branch starts from (null: HEAD).",
          null=True),
))
_VARIABLES = Field("variable", "text", "The name of an environment variable.", pattern=VARIABLE.pattern)
_SCALAR = Field("value", "scalar", "Text or a number.")
MCP_SERVER = Field("MCP server", "mapping", "One MCP server: a program spoken to on stdio (command) or a "
                   "streamable HTTP address (url), never both.", each="MCP server {key}", fields=(
    Field("command", "text", "stdio: the program, a name on PATH or a path.", checked=False),
    Field("args", "list", "stdio: its arguments (never a secret: env_from).", item=_SCALAR, checked=False),
    Field("env", "mapping", "stdio: variables set for it (never a secret: env_from).", item=_SCALAR, checked=False),
    Field("env_from", "mapping", "stdio: its variables, each given the value of the variable of ours it names.",
          item=_VARIABLES, checked=False),
    Field("url", "text", "HTTP: the server's http(s) address.", checked=False),
    Field("headers_env", "mapping", "HTTP: headers, each given the value of the variable of ours it names.",
          item=_VARIABLES, checked=False),
    Field("enabled", "bool", "Whether its tools are offered at all.", True),
    _seconds("timeout", "Seconds one tool call may take.", 120.0, high=MAX_MCP_SECONDS, null=True),
    _seconds("connect_timeout", "Seconds starting it and listing its tools may take.", 30.0, high=MAX_MCP_SECONDS,
             null=True),
    Field("tools", "mapping", "Which of its tools are offered: only those `include` names (all if absent), less "
          "those `exclude` names.", fields=(
              Field("include", "names", "The only tools offered.", checked=False),
              Field("exclude", "names", "Tools never offered.", checked=False))),
))
TELEMETRY = Field("telemetry", "mapping", "OpenTelemetry traces of tasks and model calls.", fields=(
    Field("otlp_endpoint", "text", "The collector's OTLP/HTTP address (/v1/traces is added unless it has a path); "
          "null: the OTEL_EXPORTER_OTLP_* variables decide.", null=True,
          says="an http(s) URL (the collector's OTLP/HTTP address)"),
    Field("content", "bool", "Whether prompts, answers and tool arguments are exported too (keys redacted).",
          False),
))

# The top-level sections check_sections checks from the schema, before their own checkers.
SECTIONS = ("schedules", "routing", "alerts", "budgets", "folders", "mcp_servers", "telemetry", "metrics")
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
          "(faster restarts, shared memory; $HERMES_SUP_FORK_SERVER=1 or 0 overrides it).", True),
    Field("schedules", "list", "Tasks created on a cron schedule.", item=SCHEDULE),
    ROUTING,
    Field("alerts", "list", "Webhooks told of events such as an agent given up.", item=ALERT),
    BUDGETS,
    Field("folders", "mapping", "Folders outside the workspace, by name, that agents may be granted.", item=FOLDER),
    Field("mcp_servers", "mapping", "MCP servers, by name, whose tools agents may call.", item=MCP_SERVER),
    TELEMETRY,
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
    mappings and of their entries, each error at the line of the mapping that holds the key."""
    for field in fields:
        if field.name not in node:
            continue
        value, label = node[field.name], f"{prefix}{field.name}"
        if field.kind in ("mapping", "list") and (field.fields or field.item is not None):
            if not field.checked or value is None:
                continue
            if not isinstance(value, dict if field.kind == "mapping" else list):
                raise fail(value if isinstance(value, dict) else node,
                           f"{_lead(where)}'{label}' must be {expected(field)}")
            if field.fields:
                check_keys(value, field, fail, prefix=f"{label}.", where=where)
                check_values(value, field.fields, fail, where=where, prefix=f"{label}.")
            else:
                _check_entries(node, value, field, fail, where=where, label=label)
        elif field.checked and field.kind != "mapping" and not valid(field, value):
            raise fail(node, f"{_lead(where)}'{label}' must be {expected(field)}, got {value!r}")


def _check_entries(node: dict[Any, Any], container: Any, field: Field, fail: Fail, *, where: str,
                   label: str) -> None:
    """Each entry of a mapping of names to items, or of a list of items: an item's keys and values
    (named as its `each` says, else by its path), or a plain item's value."""
    item = field.item
    assert item is not None
    pairs = container.items() if isinstance(container, dict) else enumerate(container, 1)
    for key, entry in pairs:
        if key == "__line__":
            continue
        lead, sub = (item.each.format(key=key), "") if item.each else (where, f"{label}.{key}.")
        if not item.fields:
            if item.checked and not valid(item, entry):
                raise fail(container if isinstance(container, dict) else node,
                           f"{_lead(where)}'{label}.{key}' must be {expected(item)}, got {entry!r}")
        elif not isinstance(entry, dict):
            said = (f"{_lead(lead)}must be" if item.each and isinstance(container, dict)
                    else f"{_lead(where)}each entry of '{label}' must be" if isinstance(container, list)
                    else f"{_lead(where)}'{label}.{key}' must be")
            raise fail(container if isinstance(container, dict) else node,
                       f"{said} a mapping ({', '.join(item.names())})")
        else:
            check_keys(entry, item, fail, prefix=sub, where=lead)
            check_values(entry, item.fields, fail, where=lead, prefix=sub)


def check_sections(raw: dict[Any, Any], fail: Fail) -> None:
    """The keys and simple values of the top-level sections the schema describes whole; what it cannot
    say (paths, cron, URLs, names, secrets) their own checkers judge after it."""
    check_values(raw, tuple(field for field in TOP.fields if field.name in SECTIONS), fail)


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
        return isinstance(value, str) and (not field.pattern or re.fullmatch(field.pattern, value) is not None)
    if field.kind == "choice":
        return value in field.choices
    if field.kind == "names":
        return (isinstance(value, list) and len(value) >= (field.low or 0)
                and all(isinstance(item, str) and item and (not field.choices or item in field.choices)
                        for item in value))
    if field.kind == "scalar":
        return isinstance(value, (str, int, float))  # YAML's true and false too, as the checkers took them
    return True


def expected(field: Field) -> str:
    """What a right value of `field` is, in the words of its error message."""
    if field.says:
        return field.says
    if field.kind == "seconds":
        return f"a number of seconds {'>=' if field.zero else '>'} 0 and at most {field.high:,.0f}"
    if field.kind == "number":
        return f"a number {'>=' if field.zero else '>'} 0" + (f" and at most {field.high:g}" if field.high else "")
    if field.kind == "whole":
        return f"a whole number from {field.low:,.0f} to {field.high:,.0f}"
    if field.kind == "bool":
        return "true or false"
    if field.kind == "choice":
        return f"one of {', '.join(map(str, field.choices))}"
    if field.kind in ("mapping", "list") and field.item is not None:
        shape = f"{{{', '.join(field.item.names())}}}" if field.item.fields else field.item.doc.lower().rstrip(".")
        return f"a mapping of names to {shape}" if field.kind == "mapping" else f"a list of {shape}"
    if field.kind == "mapping":
        return f"a mapping ({', '.join(field.names())})"
    return {"text": "text", "names": "a list of names", "scalar": "text or a number"}.get(field.kind, "a value")


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
