"""The tool-calling loop for one task, durable across a SIGKILL at any point.

Every message goes to the task's transcript (OpenAI format, one JSONL record per message) before
anything acts on it, and every tool call is logged as started and then done, with its result. A
restarted agent rebuilds the conversation from the transcript and goes on from the last completed
step: a call whose result is logged is not executed again; one that was in flight is run again
only if its tool is idempotent, and otherwise the model is told it was interrupted.

The loop always ends the task one way or another: a final answer completes it, `ask_human` blocks
it with the question (a person's answer becomes that call's result when the task is taken again),
providers that cannot serve now (refused, rate limited: see providers.ProviderHealth) give it back
to wait for them, and everything else (the model stuck, the iteration limit, every provider
failing) fails it with the reason. It never leaves the task to a "complete" tool the model might
forget to call. A stop, or the task taken away, ends it between any two calls and cuts a model
call in flight.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hermes_sup.kanban.faults import fault
from hermes_sup.kanban.fsio import write_json_atomic
from hermes_sup.kanban.journal import FileTaskJournal, Read, TaskJournal
from hermes_sup.kanban.parse import load_json
from hermes_sup.kanban.task import now_iso

from .budget import is_amount, logged_count
from .budget import price as price  # re-exported: callers knew it from here
from .conversation import (
    CONTINUE,
    MAX_CONTINUATIONS,
    MAX_REASKS,
    REASK,
    ROLES,
    UNREADABLE,
    answer_pieces,
    awaits_continuation,
    begun_since_restart,
    called,
    fresh_note,
    fresh_start,
    holders,
    reasks,
    repeats,
    unanswered,
)
from .ledger import BudgetReached
from .logline import call_line, model_line, say
from .offer import offered, task_text
from .providers import Attempt, Provider, ProviderError, abort, complete_with_fallback
from .sizing import filled_context
from .telemetry import active as telemetry
from .textcalls import unreadable_call
from .tools import Finished, NeedsPerson, Refused, Toolbox, ToolContext, ToolError
from .translate import Message, text_tool_calls

MAX_ITERATIONS = 60
MAX_CALLS_PER_ANSWER = 10  # tool calls run of one answer; a model's parallel calls are fewer
ASK_HUMAN = "ask_human"
ASKS = (ASK_HUMAN, "kanban_block")  # the calls that block the task; a person's answer is their result
STUCK_REPEATS = 3
MAX_RESULT_CHARS = 20_000
INPUT_CHARS = 8_000       # of each dependency's result in the task's first message, and of each comment
COMMENT_CHARS = 32_000    # of all the comments in it (the latest are kept)
COMPRESS_AT = 0.8  # of the model's context window
DEFAULT_WINDOW = 128_000  # a chain without providers: nothing is called anyway
KEEP_RECENT = 6    # messages kept verbatim at the end when the middle is summarized
SUMMARIZE = ("Summarize the work below for the agent that will continue it: what was found, what was done "
             "(files written, commands run), what failed, and what is left. Be concise and keep names, paths "
             "and numbers exact.")


@dataclass(frozen=True)
class Outcome:
    kind: str  # done, failed, blocked, waiting (for an unreachable provider: not the task's fault)
    text: str
    question: str | None = None  # blocked by ask_human: what it asks a person
    retry_at: float | None = None  # waiting: when (epoch seconds) a provider may be tried again
    warnings: tuple[str, ...] = ()  # for the task's comments: what a person should know about how it went
    budget: BudgetReached | None = None  # kind "budget": the cap a call would have crossed (nothing was sent)


IGNORED_AFTER = 3  # tool-offered answers in prose, none with a tool call, before a provider is suspected
TOOL_USE_FILE = "tool_use.json"  # runs/<agent>/: each provider's ToolUse, for `doctor`


@dataclass
class ToolUse:
    """How a provider has answered the calls that offered it tools (kept per provider for as long
    as the agent runs): a server that drops the tools (llama.cpp without a tool-capable template)
    never answers with a call."""
    offered: int = 0
    called: int = 0
    warned: bool = False


def ignores_tools(use: ToolUse, answer: str, known: set[str], after: int = IGNORED_AFTER) -> tuple[str, bool] | None:
    """Why a provider seems to drop the tools it is offered, and whether that is sure enough to say
    on the task, or None (pure). Suspect: it never answered an offer with a tool call, and now
    answers in prose that names one of the tools (sure), or has so answered `after` offers in a row
    (a hint only: a task may need no tool)."""
    if use.called or not use.offered:
        return None
    named = sorted(name for name in known if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", answer))
    if named:
        return (f"the model answered in prose that names the tool {named[0]} instead of calling it, and has not "
                f"called a tool in {use.offered} answer(s) that offered tools: its server may be dropping the tools "
                "(a chat template without tool support?)", True)
    if use.offered >= after:
        return (f"no tool call in {use.offered} answers that offered tools: if its tasks need tools, its server may "
                "be dropping them (a chat template without tool support?)", False)
    return None


def tool_use_document(tool_use: dict[str, ToolUse]) -> dict[str, Any]:
    """What the agent saves of its providers' tool use for `doctor` (pure)."""
    return {"saved_at": now_iso(), "providers": {name: {"offered": use.offered, "called": use.called,
                                                        "warned": use.warned} for name, use in tool_use.items()}}


def answer_since(task: dict[str, Any], moment: str) -> str | None:
    """The answer a person gave (`task answer`) to the task's question after `moment`, as the one
    who asked sees it, or None (pure). The latest answer wins."""
    answers = [c for c in task.get("comments") or [] if isinstance(c, dict) and c.get("answers")
               and isinstance(c.get("text"), str) and str(c.get("at") or "") > moment]
    if not answers:
        return None
    last = answers[-1]
    return f"{last.get('by', 'a person')} answered: {last['text']}"


def llm_record(task_id: str, attempt: Attempt, prices: dict[str, Any]) -> dict[str, Any]:
    """One model call as the LLM-call log keeps it (pure)."""
    usage = attempt.completion.usage if attempt.completion else None
    model = (attempt.completion.model if attempt.completion and attempt.completion.model else attempt.model)
    return {"at": now_iso(), "task": task_id, "provider": attempt.provider, "model": model,
            "outcome": attempt.outcome, "latency_s": round(attempt.latency, 3), "error": attempt.error or None,
            "tokens_in": usage.input if usage else 0, "tokens_out": usage.output if usage else 0,
            "tokens_cached": usage.cached if usage else 0, "cost_usd": price(prices, model, usage) if usage else 0.0,
            **({"estimated": True} if usage and usage.estimated else {}),
            **({"route": attempt.route} if attempt.route else {})}


def started_record(task_id: str, call_id: str, chain: list[Provider], prompt_estimate: int) -> dict[str, Any]:
    """The LLM-call log's record of a call about to be made (pure); its outcome records carry the
    same `call`. No token fields: a reader that does not pair them counts it as nothing spent."""
    first = chain[0].config if chain else None
    return {"at": now_iso(), "task": task_id, "call": call_id, "outcome": "started",
            "provider": first.name if first else "-", "model": first.model if first else "-",
            "prompt_estimate": prompt_estimate}


def system_prompt(identity: str, skills_block: str = "") -> str:
    """The system message: what stays the same across an agent's calls and tasks, and across the
    agents of one entry. A server renders the tool definitions right after it, so a prefix cache
    reuses both; what changes (memory, the task) comes in the first user message, after them."""
    parts = [identity.strip() or "You are an agent on a team. Work the task you are given.",
             "Use the tools when they help. When the task is done, answer with the result as your final "
             "message, without calling a tool. If you cannot go on without a person, call ask_human."]
    parts += [skills_block] if skills_block else []
    return "\n\n".join(parts)


def task_prompt(task: dict[str, Any], inputs: list[dict[str, Any]] | None = None) -> str:
    """The task as the model first sees it: title, body, the results of the tasks it depends on
    (how work planned on the board flows from one agent to the next), and people's comments."""
    body = (task.get("body") or "").strip()
    parts = [f"Task {task['id']}: {task['title']}" + (f"\n\n{body}" if body else "")]
    if inputs:
        parts.append("Results of the tasks this one depends on:")
        for dep in inputs:
            result = dep.get("result")
            if isinstance(result, dict) and set(result) == {"answer"}:
                result = result["answer"]
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
            parts.append(f"## {dep['id']}: {dep.get('title', '')}\n{text[:INPUT_CHARS]}")
    comments = [c for c in task.get("comments") or [] if isinstance(c, dict) and isinstance(c.get("text"), str)
                and c["text"]]
    if comments:
        parts.append("Comments on this task:\n" + comment_block(comments))
    return "\n\n".join(parts)


def comment_block(comments: list[dict[str, Any]]) -> str:
    """The latest comments, each cut to INPUT_CHARS and together to COMMENT_CHARS (pure). Anyone
    with `kanban` may comment on any task, up to tens of MiB: all of it in the first message would
    make every call of the task fail, or cost what a prompt that size costs, at every attempt."""
    shown: list[str] = []
    used = 0
    for comment in reversed(comments):
        text = comment["text"]
        line = f"- {comment.get('by', '?')}: {text[:INPUT_CHARS]}" + (
            f" [... {len(text) - INPUT_CHARS:,} characters cut]" if len(text) > INPUT_CHARS else "")
        if shown and used + len(line) > COMMENT_CHARS:
            break
        shown.append(line)
        used += len(line)
    left_out = len(comments) - len(shown)
    return "\n".join(([f"[{left_out} earlier comment(s) left out]"] if left_out else []) + shown[::-1])


def _dollars(amount: float) -> str:
    """$0.00011 rather than $0.0001: small amounts keep their significant digits."""
    return "$" + (f"{amount:.6f}".rstrip("0").rstrip(".") or "0")


def estimate_tokens(messages: list[Message]) -> int:
    """A pessimistic token count (3 characters a token) of a conversation, for deciding when to
    compress; the provider's own count only arrives after the call."""
    return sum(len(json.dumps(message, ensure_ascii=False)) for message in messages) // 3


def middle_to_summarize(messages: list[Message], keep_recent: int = KEEP_RECENT) -> tuple[int, int] | None:
    """The slice [start, end) to replace by a summary: after the system prompt and the task, before
    the last `keep_recent` messages, with its end moved back so that a tool result is never kept
    without the call it answers. None when there is too little to gain."""
    start = 2
    end = len(messages) - keep_recent
    while end > start and messages[end]["role"] == "tool":
        end -= 1
    return (start, end) if end - start >= 2 else None


def render_for_summary(messages: list[Message]) -> str:
    lines = []
    for message in messages:
        if message["role"] == "tool":
            lines.append(f"[result of {message.get('tool_call_id')}] {message.get('content')}")
            continue
        if message.get("content"):
            lines.append(f"[{message['role']}] {message['content']}")
        for call in message.get("tool_calls") or []:
            lines.append(f"[call {call['id']}] {call['function']['name']}({call['function'].get('arguments')})")
    return "\n".join(lines)


T = TypeVar("T")


def interruptible(call: Callable[[], T], stop: threading.Event, poll: float = 0.1,
                  on_stop: Callable[[], None] = lambda: None) -> T:
    """Run `call` on a daemon thread and wait for it or for `stop`, whichever comes first.

    A model call can take minutes, longer than the supervisor's stop_timeout; a stop request
    should not wait for it, and need not: its answer is not yet in the transcript, so the resumed
    task simply asks again. `on_stop` cuts the call's request (a model must not go on generating
    for a cancelled task); the abandoned thread then ends, or dies with the process."""
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the waiting thread as it is
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=target, name="llm-call", daemon=True).start()
    while not finished.wait(poll):
        if stop.is_set():
            on_stop()
            raise InterruptedError
    if "error" in box:
        raise box["error"]
    return box["value"]


def calls_across_cuts(message: Message, cut: list[str], known: set[str]) -> Message:
    """`message`, the rest of the answers `cut` at max_tokens before it, with the tool calls they
    write together as text (pure): a call a local model writes as text may be longer than its
    max_tokens (a whole file for write_file), and no piece of it alone is a call. Their text is in
    the cut answers already; unchanged when they write no call."""
    if message.get("tool_calls") or not cut:
        return message
    whole = text_tool_calls({"role": "assistant", "content": "".join(cut) + str(message.get("content") or "")},
                            known)
    return {**message, "content": None, "tool_calls": whole["tool_calls"]} if whole.get("tool_calls") else message


def prompt_estimate(messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    """The estimated tokens of a call's prompt: the conversation and the tool definitions sent with it."""
    return estimate_tokens(messages) + estimate_tokens(tools or [])


def _window_of(provider: Provider) -> int:
    """A provider's context window, as its server reports it when it can (OpenAIProvider.context_window)."""
    measured = getattr(provider, "context_window", None)
    return measured() if callable(measured) else provider.config.context_window


def _cost(value: Any) -> float:
    """A cost as logged; 0.0 for anything but a finite amount of at least 0 (see logged_count)."""
    return float(value) if is_amount(value) else 0.0


class TaskLoop:
    def __init__(self, *, task: dict[str, Any], chain: list[Provider], workdir: Path, ctx: ToolContext,
                 toolbox: Toolbox, identity: str = "", prompt_extra: str = "", max_iterations: int = MAX_ITERATIONS,
                 complete: Callable[..., Any] = complete_with_fallback,
                 prices: dict[str, Any] | None = None, max_tokens: int | None = None,
                 max_cost: float | None = None, context_window: int | None = None,
                 summarizer: list[Provider] | None = None, keep_recent: int = KEEP_RECENT,
                 on_step: Callable[[int], None] = lambda step: None, agent: str = "",
                 inputs: list[dict[str, Any]] | None = None, tool_use: dict[str, ToolUse] | None = None,
                 journal: TaskJournal | None = None, offer_tools: str = "task") -> None:
        self.task = task
        self.offer_tools = offer_tools
        self.tool_use = tool_use if tool_use is not None else {}
        self.warnings: list[str] = []
        self._answered_by = ""
        self.inputs = inputs
        # Other agents' working directories sit beside ours: a task reclaimed from one of them
        # continues its conversation, and what they spent on it counts against the ceilings.
        self.earlier, self.others = holders(task, agent)
        self.prices = prices or {}
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.context_window = context_window
        self.summarizer = summarizer or chain
        self.keep_recent = keep_recent
        self.on_step = on_step
        self.agent = agent
        self.spent_tokens = 0
        self.spent_cost = 0.0
        self.chain = chain
        # A tool that asks a model (the summarize skill) spends for this task too: its calls are
        # logged and counted against the task's ceilings like the loop's own (see Agent.ask_model).
        asked = ctx.llm
        self.ctx = ctx if asked is None else dataclasses.replace(
            ctx, llm=lambda tier, prompt: asked(tier, prompt, log=self._log_llm))  # type: ignore[call-arg]
        self.toolbox = toolbox
        self.prompt_extra = prompt_extra
        self.identity = identity
        self.max_iterations = max_iterations
        self.complete = complete
        self.workdir = workdir
        self.journal: TaskJournal = journal if journal is not None else FileTaskJournal(workdir, task["id"])
        self.notes: list[str] = []
        self._log_lock = threading.Lock()
        self._interrupted = False
        self._call_id = ""  # the model call under way: its start record and its outcomes share it

    # -- state ------------------------------------------------------------------------------------

    def _append(self, messages: list[Message], message: Message) -> None:
        self.journal.append_message(message)
        messages.append(message)

    def continue_conversation(self) -> None:
        """Continue the conversation this claim takes over: the transcript written last among those
        of the holders since the conversation last started afresh (a holder may have died before
        writing anything, however many in a row). Every one of those holders' tool-call records is
        taken in first, so a call completed by any of them is never run again here."""
        for holder in reversed(self.earlier):
            if holder != self.agent:
                self.journal.take_tool_calls(holder, ("turn", "call_id", "status"))
        for holder in self.journal.newest_transcripts(self.earlier):
            theirs = self.journal.holder_transcript(holder)
            if not theirs.records or not begun_since_restart(self.task, theirs.records):
                continue
            if holder == self.agent:
                return  # ours is the latest: it goes on
            self.take_over(holder, theirs)
            return
        mine = self.journal.transcript().records
        if mine and (self.agent not in self.earlier or not begun_since_restart(self.task, mine)):
            # None since the last fresh start: a transcript of ours predates it, and it ended badly.
            kept = self.journal.set_aside_attempt(max(1, int(self.task.get("claims") or 1) - 1))
            if kept:
                self.notes.append(f"started afresh; an older conversation of ours is kept as {kept}")

    def take_over(self, previous: str, theirs: Read) -> None:
        """Continue the conversation of another agent: copy its transcript (ours, from an older
        attempt, is set aside); its journal is only read. The calls its model asked for and that did
        not run to the end there are answered, not run."""
        self.notes += [f"{previous}: {note}" for note in theirs.notes]
        self.journal.replace_transcript(theirs.records)
        self._refuse_handed_over_calls(previous, [r for r in theirs.records if r.get("role") in ROLES])
        self.notes.append(f"continued the conversation of {previous} ({len(theirs.records)} messages)")

    def _refuse_handed_over_calls(self, previous: str, messages: list[Message]) -> None:
        """Answer, without running them, the calls the other agent's model asked for and that did not
        run to the end there: run here they would have our rights, not that agent's (one without
        `shell` would have its `terminal` call run by a teammate with it, once it stops mid-turn).
        The answer goes into the transcript and the tool-call log at once, so a later resume, ours
        or another agent's, finds the call answered. A call completed there keeps its logged result;
        an `ask_human` a person answered keeps the answer (neither runs anything). One that was
        running there and is not safe to repeat is said to be interrupted, as on a restart of its
        own agent: it may have taken effect."""
        turn, pending = unanswered(messages)
        if not pending:
            return
        done, started = self._logged_calls(turn)
        for call in pending:
            name = str(call["function"].get("name"))
            if call["id"] in done or (name in ASKS and call["id"] in started):
                continue
            tool = self.toolbox.get(name)
            if call["id"] in started and not (tool and tool.idempotent):
                text = (f"interrupted: {name} was running when {previous} stopped, and it is not safe to repeat; "
                        "check its effect before calling it again")
            else:
                text = (f"not run: {previous} asked for this call and stopped before it finished; a call runs with "
                        "the rights of the agent that asked for it, so make it again if it is still needed")
            self._record(messages, turn, call["id"], name, text, "refused", time.monotonic())

    def resume(self) -> list[Message]:
        """The conversation so far, from the transcript; a new one if there is none, or if the
        previous attempt failed or a person retried the task (its conversation is set aside: replayed
        it would end the same way, at a growing price)."""
        why = fresh_start(self.task)
        if why is not None:
            # Named by the claim that made it (claims never reset, unlike attempts after a retry).
            kept = self.journal.set_aside_attempt(max(1, int(self.task.get("claims") or 1) - 1))
            if kept:
                self.notes.append(f"started afresh; the previous conversation is kept as {kept}")
        elif self.earlier:
            self.continue_conversation()
        read = self.journal.transcript()
        self.notes += read.notes
        # A record that is no message (hand-edited, damaged) is left out, not sent on every call.
        messages = [record for record in read.records if record.get("role") in ROLES]
        if len(messages) != len(read.records):
            self.notes.append(f"transcript {self.journal.label}: skipped "
                              f"{len(read.records) - len(messages)} record(s) that are not messages")
        if not messages:
            memory = self.ctx.memory.prompt_block() if self.ctx.memory is not None else ""
            for message in ({"role": "system", "content": system_prompt(self.identity, self.prompt_extra)},
                            {"role": "user", "content": (f"{memory}\n\n" if memory else "")
                             + task_prompt(self.task, self.inputs) + (fresh_note(why) if why is not None else "")}):
                self._append(messages, message)
        return messages

    def _log_llm(self, attempt: Attempt) -> None:
        with self._log_lock:  # the call runs on its own thread (see interruptible)
            if not self._interrupted:
                self._write_llm_record(attempt)
                if attempt.outcome == "ok":
                    self._answered_by = attempt.provider
                elif attempt.outcome in ("misconfigured", "auth"):
                    self.notes.append(f"provider {attempt.provider} skipped: {attempt.error}")

    def _write_llm_record(self, attempt: Attempt) -> None:
        record = {**llm_record(self.task["id"], attempt, self.prices), "call": self._call_id}
        self.journal.append_llm_call(record)
        telemetry().model_call(record, attempt)
        say(self.agent or "agent", model_line(record))
        self.spent_tokens += record["tokens_in"] + record["tokens_out"]
        self.spent_cost += record["cost_usd"] or 0.0

    def _spent_before(self) -> None:
        """What earlier attempts at this task cost, ours and other agents': a ceiling holds across
        restarts and reclaims."""
        for record in self.journal.llm_calls(self.others):
            if record.get("task") == self.task["id"]:
                self.spent_tokens += logged_count(record.get("tokens_in")) + logged_count(record.get("tokens_out"))
                self.spent_cost += _cost(record.get("cost_usd"))

    def over_ceiling(self) -> str | None:
        if self.max_tokens is not None and self.spent_tokens > self.max_tokens:
            return f"token ceiling: {self.spent_tokens:,} tokens used, the limit is {self.max_tokens:,} (max_tokens)"
        if self.max_cost is not None and self.spent_cost > self.max_cost:
            return f"cost ceiling: {_dollars(self.spent_cost)} spent, the limit is {_dollars(self.max_cost)} (max_cost)"
        return None

    # -- compression ----------------------------------------------------------------------------

    def compress(self, messages: list[Message]) -> bool:
        """Summarize the middle of the conversation with the summarizer chain; the transcript is
        rewritten (the old one kept beside it). False when nothing can be compressed."""
        cut = middle_to_summarize(messages, self.keep_recent)
        if cut is None:
            return False
        start, end = cut
        request = [{"role": "system", "content": SUMMARIZE},
                   {"role": "user", "content": render_for_summary(messages[start:end])}]
        summary = self._complete(self.summarizer, request, None).message.get("content") or ""
        note = {"role": "user", "content": "Summary of the earlier work on this task (older turns were compressed "
                                           f"to fit the context window):\n{summary.strip()}"}
        compressed = [*messages[:start], note, *messages[end:]]
        kept = self.journal.replace_transcript(compressed)
        messages[:] = compressed
        self.notes.append(f"compressed {end - start} messages into a summary ({kept} keeps them)")
        return True

    # -- tools ------------------------------------------------------------------------------------

    def _logged_calls(self, turn: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """The calls of a turn logged as done (their records) and as started (when)."""
        done, started = {}, {}
        for record in self.journal.tool_calls():
            if str(record.get("turn")) != turn:
                continue
            if record.get("status") == "done":
                done[record["call_id"]] = record
            elif record.get("status") == "started":
                started[record["call_id"]] = str(record.get("at") or "")
        return done, started

    def _record(self, messages: list[Message], turn: str, call_id: str, name: str, text: str, outcome: str,
                started_at: float, args: Any = None) -> None:
        text = text[:MAX_RESULT_CHARS]
        is_error = outcome != "ok"
        duration = time.monotonic() - started_at
        self.journal.append_tool_call({"at": now_iso(), "task": self.task["id"], "turn": turn, "call_id": call_id,
                                       "tool": name, "status": "done", "outcome": outcome, "result": text,
                                       "is_error": is_error, "duration_s": round(duration, 3)})
        say(self.agent or "agent", call_line(self.task["id"], "tool", name, args, outcome, duration, text))
        telemetry().tool_call(name, call_id, outcome, duration, args, text)
        fault("tool-done")  # the result is logged, not yet in the transcript
        self._append(messages, {"role": "tool", "tool_call_id": call_id, "content": text,
                                **({"is_error": True} if is_error else {})})

    def run_calls(self, messages: list[Message], turn: str, calls: list[dict[str, Any]]) -> None:
        done, started = self._logged_calls(turn)
        parsed: dict[str, Any] = {}
        for call in calls:
            try:
                # Bounded: a model's arguments nested 100,000 deep are its mistake to hear about,
                # not a RecursionError that fails the task again on every attempt.
                parsed[call["id"]] = load_json(call["function"].get("arguments") or "{}")
            except ValueError as exc:
                parsed[call["id"]] = exc
        for call in calls:  # start what can work in parallel (delegations) before running one by one
            tool = self.toolbox.get(call["function"]["name"])
            if tool is not None and tool.prepare is not None and call["id"] not in done:
                try:
                    self.toolbox.check(tool.name, parsed[call["id"]])
                except ToolError:
                    continue
                tool.prepare(self.ctx, parsed[call["id"]])
        again = repeats(calls)
        for call in calls:
            if self.ctx.stop.is_set():  # stopped, or the task taken away: no further call
                raise InterruptedError
            call_id, name = call["id"], call["function"]["name"]
            tool = self.toolbox.get(name)
            if call_id in done:  # ran before a restart: its result stands, it is not run again
                record = done[call_id]
                self._append(messages, {"role": "tool", "tool_call_id": call_id, "content": record["result"],
                                        **({"is_error": True} if record.get("is_error") else {})})
                continue
            if call_id in started and name in ASKS:
                # The question blocked the task; a person's answer is the call's result.
                answer = answer_since(self.task, started[call_id])
                self._record(messages, turn, call_id, name, answer or (
                    "no answer: a person put the task back without answering; go on without it, or ask again"),
                    "ok", time.monotonic())
                continue
            if call_id in started and not (tool and tool.idempotent):
                self._append(messages, {"role": "tool", "tool_call_id": call_id, "is_error": True, "content": (
                    f"interrupted: {name} was running when the agent stopped, and it is not safe to repeat; "
                    "check its effect before calling it again")})
                continue
            started_at = time.monotonic()
            args = parsed[call_id]
            if isinstance(args, ValueError):
                self._record(messages, turn, call_id, name, f"refused: invalid arguments for {name}: "
                             f"not JSON ({args})", "refused", started_at)
                continue
            try:
                self.toolbox.check(name, args)
            except Refused as exc:  # never run, so nothing to resume: logged as done, refused
                self._record(messages, turn, call_id, name, str(exc), "refused", started_at, args)
                continue
            if call_id in again and not (tool and tool.idempotent):
                self._record(messages, turn, call_id, name, f"not run: the same call as {again[call_id]} earlier "
                             "in this answer; its result stands for both", "refused", started_at, args)
                continue
            self.journal.append_tool_call({"at": now_iso(), "task": self.task["id"], "turn": turn,
                                           "call_id": call_id, "tool": name, "args": args, "status": "started"})
            try:
                result = self.toolbox.call(self.ctx, name, args)
                text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
                outcome = "ok"
            except (NeedsPerson, Finished, InterruptedError):
                raise
            except ToolError as exc:
                text, outcome = f"error: {exc}", "error"
            self._record(messages, turn, call_id, name, text, outcome, started_at, args)

    # -- the loop ---------------------------------------------------------------------------------

    def _complete(self, chain: list[Provider], messages: list[Message], tools: list[dict[str, Any]] | None,
                  prompt_tokens: int | None = None) -> Any:
        """One model call through `chain`; `prompt_tokens` is the prompt's estimate when the caller
        has it already (it serializes the whole conversation)."""
        started = time.monotonic()
        if prompt_tokens is None:
            prompt_tokens = prompt_estimate(messages, tools)
        # Logged before the call, so one the agent does not survive (kill -9, OOM) is still counted:
        # `usage` and `task log` show a start without an outcome as interrupted, tokens estimated.
        self._call_id = uuid.uuid4().hex[:16]
        self.journal.append_llm_call(started_record(self.task["id"], self._call_id, chain, prompt_tokens))
        telemetry().prompt(messages)
        try:
            return interruptible(lambda: self.complete(chain, messages, tools, log=self._log_llm, stop=self.ctx.stop),
                                 self.ctx.stop, on_stop=lambda: abort(chain))
        except InterruptedError:
            with self._log_lock:
                self._interrupted = True  # a late answer of the abandoned call is not logged as used
                self._write_llm_record(Attempt(chain[0].config.name if chain else "-", chain[0].config.model if chain
                                               else "-", "interrupted", time.monotonic() - started,
                                               error="the agent was asked to stop during the call"))
            raise

    def window(self) -> int:
        """The context window to keep the conversation within: the one given, else the smallest of
        the chain's (each provider's as its server reports it, see OpenAIProvider.context_window):
        any of them may be the one that answers."""
        if self.context_window is not None:
            return self.context_window
        return min((_window_of(provider) for provider in self.chain), default=DEFAULT_WINDOW)

    def answer_window(self) -> int:
        """The context window of the provider that gave the last answer (whether that answer filled
        it): a cloud model that answered after a small local server failed has its own room, not the
        local server's. The chain's smallest when it is not known."""
        if self.context_window is None:
            for provider in self.chain:
                if provider.config.name == self._answered_by:
                    return _window_of(provider)
        return self.window()

    def _call_model(self, messages: list[Message], tools: list[dict[str, Any]]) -> Any:
        # The tool definitions go with every call: they fill the window as much as the messages.
        size = prompt_estimate(messages, tools)
        if size > COMPRESS_AT * self.window() and self.compress(messages):
            size = prompt_estimate(messages, tools)
        try:
            return self._complete(self.chain, messages, tools or None, size)
        except ProviderError as exc:
            if exc.kind != "context_overflow":
                raise
            if not self.compress(messages):
                # Said plainly: the raw 400 read as a server fault; the conversation outgrew the model.
                raise ProviderError("context_overflow", f"the conversation (about {size:,} tokens with the tool "
                                    f"definitions) no longer fits the model's context and has nothing left to "
                                    f"compress ({exc})", provider=exc.provider, status=exc.status) from exc
            return self._complete(self.chain, messages, tools or None)

    def _watch_tool_use(self, message: Message, known: set[str]) -> None:
        """Count the answer to a tool-offered call for the provider that gave it, and say so (the
        agent's log, and the task when sure) when that provider seems to drop the tools."""
        name = self._answered_by or (self.chain[0].config.name if self.chain else "-")
        use = self.tool_use.setdefault(name, ToolUse())
        use.offered += 1
        if message.get("tool_calls"):
            use.called += 1
        elif (found := ignores_tools(use, str(message.get("content") or ""), known)) is not None:
            why, sure = found
            if not use.warned:
                use.warned = True
                self.notes.append(f"provider {name}: {why}")
            if sure:
                self.warnings.append(f"provider {name}: {why}")
        try:  # beside the breakers, where `doctor` reads it; the task goes on without it
            write_json_atomic(self.workdir / TOOL_USE_FILE, tool_use_document(self.tool_use))
        except OSError as exc:
            self.notes.append(f"cannot save {TOOL_USE_FILE}: {exc}")

    def run(self) -> Outcome:
        self._spent_before()
        messages = self.resume()
        callable_tools = self.toolbox.callable()
        known = set(callable_tools)  # a text call names any of them, offered or not
        cues = {name: tool.cues for name, tool in callable_tools.items()}
        text = task_text(self.task, self.inputs, self.identity, self.prompt_extra)
        names = offered(cues, text, called(messages), self.offer_tools)
        tools = self.toolbox.schemas(names)
        recent: list[str] = []
        try:
            for iteration in range(self.max_iterations):
                self.on_step(iteration + 1)
                turn, pending = unanswered(messages)
                if pending:
                    self.run_calls(messages, turn, pending)
                    if any(c["function"]["name"] in known and c["function"]["name"] not in names for c in pending):
                        # Called without being offered: offered from now on, its arguments shown.
                        names = offered(cues, text, called(messages), self.offer_tools)
                        tools = self.toolbox.schemas(names)
                    signature = json.dumps([[c["function"]["name"], c["function"]["arguments"]] for c in pending]
                                           + [m.get("content") for m in messages[-len(pending):]])
                    recent = [*recent[-(STUCK_REPEATS - 1):], signature]
                    if len(recent) == STUCK_REPEATS and len(set(recent)) == 1:
                        return Outcome("failed", f"stuck: the same tool call returned the same result "
                                                 f"{STUCK_REPEATS} times in a row")
                if awaits_continuation(messages):
                    if len(answer_pieces(messages)) > MAX_CONTINUATIONS:
                        return Outcome("failed", f"the answer was cut at max_tokens {len(answer_pieces(messages))} "
                                                 "times in a row; raise the provider's max_tokens",
                                       warnings=tuple(self.warnings))
                    self._append(messages, {"role": "user", "content": CONTINUE})
                if self.ctx.stop.is_set():
                    raise InterruptedError
                ceiling = self.over_ceiling()
                if ceiling:
                    return Outcome("failed", ceiling)
                completion = self._call_model(messages, tools)
                message = {**text_tool_calls(completion.message, known), "turn": uuid.uuid4().hex[:12]}
                if len(message.get("tool_calls") or ()) > MAX_CALLS_PER_ANSWER:
                    # A runaway answer (30 calls, most the same) would fill a small model's context
                    # with their results: the first ones run, the rest are dropped as never made.
                    dropped = len(message["tool_calls"]) - MAX_CALLS_PER_ANSWER
                    message = {**message, "tool_calls": message["tool_calls"][:MAX_CALLS_PER_ANSWER],
                               "dropped_calls": dropped}
                    self.notes.append(f"the model wrote {dropped + MAX_CALLS_PER_ANSWER} tool calls in one answer; "
                                      f"the first {MAX_CALLS_PER_ANSWER} were run, {dropped} dropped")
                if messages[-1]["role"] == "user" and messages[-1].get("content") == CONTINUE:
                    message = calls_across_cuts(message, answer_pieces(messages[:-1]), known)
                if completion.stop == "length" and not message.get("tool_calls"):
                    used, window = completion.usage.input + completion.usage.output, self.answer_window()
                    if filled_context(completion.usage.input, completion.usage.output, window):
                        # The rest has no room: asked to continue, the model would overflow the context.
                        self._append(messages, message)
                        return Outcome("failed", f"the answer filled the model's whole context ({used:,} of "
                                                 f"{window:,} tokens) and cannot be continued",
                                       warnings=tuple(self.warnings))
                    message["cut"] = True  # in the transcript, so a resumed loop asks for the rest too
                self._append(messages, message)
                if tools:
                    self._watch_tool_use(message, known)
                if message.get("tool_calls") or message.get("cut"):
                    continue
                pieces = answer_pieces(messages)
                if len(pieces) > 1:
                    self.warnings.append(f"the answer reached max_tokens {len(pieces) - 1} times and was continued")
                answer = "".join(pieces).strip()
                wrong = (("the model answered nothing", f" (stop: {completion.stop})", REASK) if not answer else
                         ("the model's tool call could not be read", "", UNREADABLE) if unreadable_call(answer)
                         else None)
                if wrong is not None:
                    what, detail, ask = wrong
                    asked = reasks(messages)
                    if asked >= MAX_REASKS:
                        return Outcome("failed", f"{what} {asked + 1} times in a row{detail}",
                                       warnings=tuple(self.warnings))
                    self.notes.append(f"{what}{detail}; asked again ({asked + 1} of {MAX_REASKS})")
                    self._append(messages, {"role": "user", "content": ask})
                    continue
                return Outcome("done", answer, warnings=tuple(self.warnings))
        except NeedsPerson as question:
            return Outcome("blocked", str(question), question=str(question))
        except Finished as end:  # kanban_complete: Hermes' way to end a task
            return Outcome("done", end.summary, warnings=tuple(self.warnings))
        except BudgetReached as exc:
            return Outcome("budget", str(exc), retry_at=exc.refusal.until, budget=exc)
        except ProviderError as exc:
            if exc.kind == "unreachable":
                return Outcome("waiting", str(exc), retry_at=exc.retry_at)
            return Outcome("failed", str(exc))
        finally:
            self.journal.close()
        return Outcome("failed", f"no final answer after {self.max_iterations} model turns")
