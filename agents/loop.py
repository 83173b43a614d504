"""The tool-calling loop for one task, durable across a SIGKILL at any point.

Every message goes to the task's transcript (OpenAI format, one JSONL record per message) before
anything acts on it, and every tool call is logged as started and then done, with its result. A
restarted agent rebuilds the conversation from the transcript and goes on from the last completed
step: a call whose result is logged is not executed again; one that was in flight is run again
only if its tool is idempotent, and otherwise the model is told it was interrupted.

The loop always ends the task one way or another: a final answer completes it, `ask_human` blocks
it with the question (a person's answer becomes that call's result when the task is taken again),
providers that cannot serve now (refused, rate limited: see health.ProviderHealth) give it back
to wait for them, and everything else (the model stuck, the iteration limit, every provider
failing) fails it with the reason. It never leaves the task to a "complete" tool the model might
forget to call. A stop, or the task taken away, ends it between any two calls and cuts a model
call in flight.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kanban.faults import fault
from ..kanban.journal import FileTaskJournal, TaskJournal
from ..kanban.parse import load_json
from .budget import price as price  # re-exported: callers knew it from here
from .compress import (
    COMPRESS_AT,
    KEEP_RECENT,
    SUMMARIZE,
    middle_to_summarize,
    prompt_estimate,
    render_for_summary,
    window_of,
)
from .conversation import (
    CONTINUE,
    MAX_CONTINUATIONS,
    MAX_REASKS,
    REASK,
    UNREADABLE,
    answer_pieces,
    awaits_continuation,
    called,
    calls_across_cuts,
    fresh_note,
    reasks,
    repeats,
    unanswered,
)
from .durable import ASKS, MAX_RESULT_CHARS, answer_since, call_done, call_started, logged_calls
from .fallback import Attempt, complete_with_fallback
from .interrupt import interruptible
from .ledger import BudgetReached
from .logline import call_line, model_line, say
from .offer import offered, task_text
from .prompts import system_prompt, task_prompt
from .providers import Provider, ProviderError, abort
from .resume import Transcript
from .sizing import filled_context
from .spend import Spend, llm_record, started_record
from .telemetry import active as telemetry
from .textcalls import unreadable_call
from .tools import Finished, NeedsPerson, Refused, Toolbox, ToolContext, ToolError
from .tooluse import TOOL_USE_FILE as TOOL_USE_FILE  # re-exported: `doctor` reads it from here
from .tooluse import ToolUse, watch_answer
from .translate import Message, text_tool_calls

MAX_ITERATIONS = 60
MAX_CALLS_PER_ANSWER = 10  # tool calls run of one answer; a model's parallel calls are fewer
STUCK_REPEATS = 3
DEFAULT_WINDOW = 128_000  # a chain without providers: nothing is called anyway


@dataclass(frozen=True)
class LoopOutcome:
    """How the model's loop ended a task: the task's next status and what goes with it."""
    kind: str  # done, failed, blocked, waiting (for an unreachable provider: not the task's fault)
    text: str
    question: str | None = None  # blocked by ask_human: what it asks a person
    retry_at: float | None = None  # waiting: when (epoch seconds) a provider may be tried again
    warnings: tuple[str, ...] = ()  # for the task's comments: what a person should know about how it went
    budget: BudgetReached | None = None  # kind "budget": the cap a call would have crossed (nothing was sent)


@dataclass(frozen=True)
class Models:
    """Who answers a task's calls: the provider chain, the call through it (complete_with_fallback,
    or a routing strategy's), and the chain that summarizes when the conversation outgrows the window."""
    chain: list[Provider]
    complete: Callable[..., Any] = complete_with_fallback
    summarizer: list[Provider] | None = None  # None: the chain itself
    context_window: int | None = None  # None: the chain's smallest, as its servers report it
    keep_recent: int = KEEP_RECENT  # messages kept verbatim when the middle is summarized


@dataclass(frozen=True)
class Brief:
    """What the model is told beside the task: who it is, the agent's extra prompt (skills, granted
    folders), the results of the tasks this one depends on, and which tools are offered."""
    identity: str = ""
    prompt_extra: str = ""
    inputs: list[dict[str, Any]] | None = None
    offer_tools: str = "task"


@dataclass(frozen=True)
class Limits:
    """What bounds a task's loop: its model turns, and its tokens and cost (None: no ceiling) at `prices`."""
    max_iterations: int = MAX_ITERATIONS
    max_tokens: int | None = None
    max_cost: float | None = None
    prices: dict[str, Any] | None = None


@dataclass(frozen=True)
class Workplace:
    """The agent working the task and where its records are kept: its working directory, and the
    task's journal there (or on the board's database)."""
    workdir: Path
    agent: str = ""
    journal: TaskJournal | None = None  # None: the files of `workdir`
    on_step: Callable[[int], None] = lambda step: None
    tool_use: dict[str, ToolUse] | None = None  # each provider's, kept by the agent across its tasks


class TaskLoop:
    """The model's loop over one task (see the module's docstring). What it holds is in parts: the
    conversation (Transcript), the spend against the ceilings (Spend), and the tool calls, logged
    as started and done (durable.py, as a task's steps log theirs)."""

    def __init__(self, task: dict[str, Any], ctx: ToolContext, toolbox: Toolbox, models: Models,
                 place: Workplace, *, brief: Brief = Brief(), limits: Limits = Limits()) -> None:
        self.task = task
        self.models = models
        self.chain = models.chain
        self.summarizer = models.summarizer or models.chain
        self.complete = models.complete
        self.context_window = models.context_window
        self.keep_recent = models.keep_recent
        self.brief = brief
        self.max_iterations = limits.max_iterations
        self.prices = limits.prices or {}
        self.spend = Spend(limits.max_tokens, limits.max_cost)
        self.agent = place.agent
        self.workdir = place.workdir
        self.on_step = place.on_step
        self.tool_use = place.tool_use if place.tool_use is not None else {}
        self.journal: TaskJournal = place.journal if place.journal is not None else FileTaskJournal(
            place.workdir, task["id"])
        self.transcript = Transcript(task, place.agent, self.journal)
        self.notes = self.transcript.notes
        self.warnings: list[str] = []
        self._answered_by = ""
        # A tool that asks a model (the summarize skill) spends for this task too: its calls are
        # logged and counted against the task's ceilings like the loop's own (see Agent.ask_model).
        asked = ctx.llm
        self.ctx = ctx if asked is None else dataclasses.replace(
            ctx, llm=lambda tier, prompt: asked(tier, prompt, log=self._log_llm))  # type: ignore[call-arg]
        self.toolbox = toolbox
        self._log_lock = threading.Lock()
        self._interrupted = False
        self._call_id = ""  # the model call under way: its start record and its outcomes share it

    @property
    def spent_tokens(self) -> int:
        return self.spend.tokens

    # -- state ------------------------------------------------------------------------------------

    def _append(self, messages: list[Message], message: Message) -> None:
        self.transcript.append(messages, message)

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
        done, started = logged_calls(self.journal, turn)
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
        """The conversation so far (see Transcript.resume); a new one, with the task's first
        message, when it starts afresh."""
        messages, why = self.transcript.resume(self._refuse_handed_over_calls)
        if not messages:
            memory = self.ctx.memory.prompt_block() if self.ctx.memory is not None else ""
            brief = self.brief
            for message in ({"role": "system", "content": system_prompt(brief.identity, brief.prompt_extra)},
                            {"role": "user", "content": (f"{memory}\n\n" if memory else "")
                             + task_prompt(self.task, brief.inputs) + (fresh_note(why) if why is not None else "")}):
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
        self.spend.add(record)

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

    def _record(self, messages: list[Message], turn: str, call_id: str, name: str, text: str, outcome: str,
                started_at: float, args: Any = None) -> None:
        text = text[:MAX_RESULT_CHARS]
        duration = time.monotonic() - started_at
        self.journal.append_tool_call(call_done(self.task["id"], turn, call_id, name, outcome, text, duration))
        say(self.agent or "agent", call_line(self.task["id"], "tool", name, args, outcome, duration, text))
        telemetry().tool_call(name, call_id, outcome, duration, args, text)
        fault("tool-done")  # the result is logged, not yet in the transcript
        self._append(messages, {"role": "tool", "tool_call_id": call_id, "content": text,
                                **({"is_error": True} if outcome != "ok" else {})})

    def run_calls(self, messages: list[Message], turn: str, calls: list[dict[str, Any]]) -> None:
        done, started = logged_calls(self.journal, turn)
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
            self.journal.append_tool_call(call_started(self.task["id"], turn, call_id, name, args))
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
        return min((window_of(provider) for provider in self.chain), default=DEFAULT_WINDOW)

    def answer_window(self) -> int:
        """The context window of the provider that gave the last answer (whether that answer filled
        it): a cloud model that answered after a small local server failed has its own room, not the
        local server's. The chain's smallest when it is not known."""
        if self.context_window is None:
            for provider in self.chain:
                if provider.config.name == self._answered_by:
                    return window_of(provider)
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
        name = self._answered_by or (self.chain[0].config.name if self.chain else "-")
        notes, warnings = watch_answer(self.tool_use, name, message, known, self.workdir / TOOL_USE_FILE)
        self.notes += notes
        self.warnings += warnings

    def run(self) -> LoopOutcome:
        self.spend.count_before(self.journal, self.transcript.others, self.task["id"])
        messages = self.resume()
        callable_tools = self.toolbox.callable()
        known = set(callable_tools)  # a text call names any of them, offered or not
        cues = {name: tool.cues for name, tool in callable_tools.items()}
        text = task_text(self.task, self.brief.inputs, self.brief.identity, self.brief.prompt_extra)
        names = offered(cues, text, called(messages), self.brief.offer_tools)
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
                        names = offered(cues, text, called(messages), self.brief.offer_tools)
                        tools = self.toolbox.schemas(names)
                    signature = json.dumps([[c["function"]["name"], c["function"]["arguments"]] for c in pending]
                                           + [m.get("content") for m in messages[-len(pending):]])
                    recent = [*recent[-(STUCK_REPEATS - 1):], signature]
                    if len(recent) == STUCK_REPEATS and len(set(recent)) == 1:
                        return LoopOutcome("failed", f"stuck: the same tool call returned the same result "
                                                 f"{STUCK_REPEATS} times in a row")
                if awaits_continuation(messages):
                    if len(answer_pieces(messages)) > MAX_CONTINUATIONS:
                        return LoopOutcome("failed", f"the answer was cut at max_tokens {len(answer_pieces(messages))} "
                                                 "times in a row; raise the provider's max_tokens",
                                       warnings=tuple(self.warnings))
                    self._append(messages, {"role": "user", "content": CONTINUE})
                if self.ctx.stop.is_set():
                    raise InterruptedError
                ceiling = self.spend.over_ceiling()
                if ceiling:
                    return LoopOutcome("failed", ceiling)
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
                        return LoopOutcome("failed", f"the answer filled the model's whole context ({used:,} of "
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
                        return LoopOutcome("failed", f"{what} {asked + 1} times in a row{detail}",
                                       warnings=tuple(self.warnings))
                    self.notes.append(f"{what}{detail}; asked again ({asked + 1} of {MAX_REASKS})")
                    self._append(messages, {"role": "user", "content": ask})
                    continue
                return LoopOutcome("done", answer, warnings=tuple(self.warnings))
        except NeedsPerson as question:
            return LoopOutcome("blocked", str(question), question=str(question))
        except Finished as end:  # kanban_complete: Hermes' way to end a task
            return LoopOutcome("done", end.summary, warnings=tuple(self.warnings))
        except BudgetReached as exc:
            return LoopOutcome("budget", str(exc), retry_at=exc.refusal.until, budget=exc)
        except ProviderError as exc:
            if exc.kind == "unreachable":
                return LoopOutcome("waiting", str(exc), retry_at=exc.retry_at)
            return LoopOutcome("failed", str(exc))
        finally:
            self.journal.close()
        return LoopOutcome("failed", f"no final answer after {self.max_iterations} model turns")
