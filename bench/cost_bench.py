"""Cost routing, measured, run by hand: `python bench/cost_bench.py [--tasks 200] [--seed 16]`.

A scripted workload of tasks of known difficulty, served through the real openai SDK by the test
suite's scripted server on 127.0.0.1 (tests/llm_server.py) with three model tiers priced per
million tokens. Three strategies work the same tasks in one run:

- premium-only: every task on the premium tier;
- length heuristic (`auto`, agents/routing.py task_tier): a short task starts on the cheap tier, a
  long one on standard, and each failed attempt moves one tier up (3 attempts at most);
- cascade (agents/cascade.py): every call on the cheap tier first, its answer checked, escalated to
  premium when the check says so; and the cascade with `verify` (a cheap verifier call on each
  answer that passed the check; the scripted verifier knows the right answer, so this row measures
  what verifying costs, not how well a real verifier judges).

The scripted models: premium and standard answer every task correctly. The cheap model answers
every easy task correctly and a known share of the hard ones (HARD_FAIL, default half) wrongly: half
of its failures are a malformed tool call (a required argument missing), the other half a wrong
answer reporting a low confidence. That calibration is by construction: the bench measures what the
routing costs and completes given a cheap model whose failures can be seen, not how well a real
model reports its own confidence. A malformed tool call fails the attempt (in a real loop the
model would be told and try again on the same tier, spending more); a wrong answer in prose is
taken as done: the length heuristic has no check, so it completes such a task incorrectly.

Each task is graded against the answer it should get. Figures go to stdout and to
bench/results/cost_bench.json.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.agents.cascade import VERIFY, Cascade, CascadePolicy  # noqa: E402
from hermes_sup.agents.fallback import Attempt, complete_with_fallback  # noqa: E402
from hermes_sup.agents.loop import price  # noqa: E402
from hermes_sup.agents.prompts import system_prompt  # noqa: E402
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig, ProviderError  # noqa: E402
from hermes_sup.agents.routing import ESCALATION, SHORT_TASK, task_tier  # noqa: E402

from tests.llm_server import ScriptedLLM, openai_reply  # noqa: E402

# Dollars per million tokens, in the range of today's small, mid and frontier models.
PRICES = {"cheap-model": {"input": 0.15, "output": 0.60},
          "standard-model": {"input": 3.0, "output": 15.0},
          "premium-model": {"input": 15.0, "output": 75.0}}
MODELS = {"cheap": "cheap-model", "standard": "standard-model", "premium": "premium-model"}
HARD_SHARE = 0.4        # of the tasks
HARD_FAIL = 0.5         # of the hard tasks, the cheap model gets wrong
SHORT_IF_EASY = 0.75    # easy tasks are mostly short, hard ones mostly long: what the length heuristic bets on
ANSWER_TOKENS = 150
MAX_ATTEMPTS = 3
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file in the agent's scratch folder.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}]
TASK_ID = re.compile(r"Task (\d+)\.")


@dataclass(frozen=True)
class Task:
    number: int
    hard: bool
    cheap_fails: str  # "", "tool" (a malformed call) or "wrong" (a wrong answer, low confidence)
    text: str

    @property
    def answer(self) -> str:
        return f"ANSWER-{self.number}"


def workload(count: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    hard_numbers = set(rng.sample(range(count), round(count * HARD_SHARE)))
    failing = sorted(rng.sample(sorted(hard_numbers), round(len(hard_numbers) * HARD_FAIL)))
    modes = {number: ("tool" if index % 2 == 0 else "wrong") for index, number in enumerate(failing)}
    tasks = []
    for number in range(count):
        hard = number in hard_numbers
        short = rng.random() < (SHORT_IF_EASY if not hard else 1 - SHORT_IF_EASY)
        size = rng.randint(120, SHORT_TASK - 60) if short else rng.randint(SHORT_TASK + 100, 2_000)
        filler = " ".join(rng.choice(("check", "the", "report", "numbers", "module", "and", "fix", "tests", "of"))
                          for _ in range(size // 5))
        text = f"Task {number}. {'Hard' if hard else 'Easy'} work: {filler}"[:size].ljust(size, ".")
        tasks.append(Task(number, hard, modes.get(number, ""), text))
    return tasks


def responder(tasks: dict[int, Task]):
    """The three scripted models: the reply for a request, by its model and the task it is about."""
    def respond(api: str, body: dict[str, Any]) -> dict[str, Any]:
        found = TASK_ID.search(json.dumps(body["messages"]))
        task = tasks[int(found.group(1))]
        model = body["model"]
        prompt = len(json.dumps(body["messages"])) // 4 + len(json.dumps(body.get("tools") or [])) // 4
        asked = "confidence:" in json.dumps(body["messages"][0])
        if body["messages"][0]["content"] == VERIFY:  # the verifier sees whether the answer is the right one
            verdict = "YES" if task.answer in body["messages"][1]["content"] else "NO"
            return openai_reply(verdict, prompt=prompt, completion=1, model=model)
        if model != "cheap-model" or not task.cheap_fails:
            text = f"The result is {task.answer}." + ("\nconfidence: 0.9" if asked else "")
            return openai_reply(text, prompt=prompt, completion=ANSWER_TOKENS, model=model)
        if task.cheap_fails == "tool":
            return openai_reply(None, [("write_file", {"path": "result.txt"})], prompt=prompt,
                                completion=ANSWER_TOKENS, model=model)
        text = "The result is ANSWER-wrong." + ("\nconfidence: 0.4" if asked else "")
        return openai_reply(text, prompt=prompt, completion=ANSWER_TOKENS, model=model)
    return respond


@dataclass
class Tally:
    cost: float = 0.0
    correct: int = 0
    incorrect: int = 0
    failed: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    escalated: int = 0
    prices: dict[str, Any] = field(default_factory=lambda: PRICES)  # cost_real.py prices its own models

    def log(self, attempt: Attempt) -> None:
        if attempt.completion is None:
            return
        model = attempt.completion.model or attempt.model
        self.cost += price(self.prices, model, attempt.completion.usage) or 0.0
        self.calls[model] = self.calls.get(model, 0) + 1
        if attempt.route and attempt.route.get("decision") == "escalated":
            self.escalated += 1

    def grade(self, task: Task, message: dict[str, Any] | None) -> None:
        if message is None:
            self.failed += 1
        elif task.answer in str(message.get("content") or ""):
            self.correct += 1
        else:
            self.incorrect += 1


def messages_for(task: Task) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system_prompt("You are a worker on a team of agents.", "")},
            {"role": "user", "content": task.text}]


def valid_final(message: dict[str, Any]) -> bool:
    """What the task loop would close as done: a final answer, not a tool call it must run (here a
    malformed one, whose error fails the attempt)."""
    return not message.get("tool_calls") and bool(message.get("content"))


def premium_only(tasks: list[Task], chains: dict[str, list[OpenAIProvider]]) -> Tally:
    tally = Tally()
    for task in tasks:
        done = complete_with_fallback(chains["premium"], messages_for(task), TOOLS, log=tally.log)
        tally.grade(task, done.message if valid_final(done.message) else None)
    return tally


def length_heuristic(tasks: list[Task], chains: dict[str, list[OpenAIProvider]]) -> Tally:
    tally = Tally()
    for task in tasks:
        doc: dict[str, Any] = {"title": task.text[:60], "body": task.text[60:]}
        final = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            doc["attempts"] = attempt
            tier = task_tier(doc, "auto")
            done = complete_with_fallback(chains[tier], messages_for(task), TOOLS, log=tally.log)
            if valid_final(done.message):
                final = done.message
                break
        tally.grade(task, final)
    return tally


def cascade(tasks: list[Task], chains: dict[str, list[OpenAIProvider]], verify: bool = False) -> Tally:
    tally = Tally()
    routed = Cascade(chains["cheap"], chains["premium"], CascadePolicy(min_confidence=0.7, verify=verify))
    for task in tasks:
        try:
            done = routed(routed.chain, messages_for(task), TOOLS, log=tally.log)
        except ProviderError:
            tally.grade(task, None)
            continue
        tally.grade(task, done.message if valid_final(done.message) else None)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    tasks = workload(args.tasks, args.seed)
    hard = sum(task.hard for task in tasks)
    failing = sum(bool(task.cheap_fails) for task in tasks)
    short = sum(len(task.text) <= SHORT_TASK for task in tasks)
    results: dict[str, Any] = {}
    started = time.monotonic()
    with ScriptedLLM(responder=responder({task.number: task for task in tasks})) as llm:
        chains = {tier: [OpenAIProvider(ProviderConfig(name=tier, kind="openai", model=MODELS[tier],
                                                       base_url=f"{llm.url}/v1"))] for tier in ESCALATION}
        for name, strategy in (("premium-only", premium_only), ("length heuristic (auto)", length_heuristic),
                               ("cascade", cascade),
                               ("cascade + verifier", lambda t, c: cascade(t, c, verify=True))):
            tally = strategy(tasks, chains)
            results[name] = {"cost_usd": round(tally.cost, 6), "correct": tally.correct,
                             "incorrect": tally.incorrect, "failed": tally.failed,
                             "calls": dict(sorted(tally.calls.items())), "escalated": tally.escalated}
    base = results["premium-only"]["cost_usd"]
    for row in results.values():
        row["cost_vs_premium"] = round(row["cost_usd"] / base, 3) if base else None
    print(f"{len(tasks)} tasks: {hard} hard, of which the cheap model fails {failing} "
          f"({failing - failing // 2} malformed tool calls, {failing // 2} wrong answers); {short} short "
          f"(<= {SHORT_TASK} characters); {len(llm.requests)} requests in {time.monotonic() - started:.1f} s\n")
    print("| strategy | cost | vs premium-only | correct | incorrect | failed | calls (cheap/standard/premium) |")
    print("|---|---|---|---|---|---|---|")
    for name, row in results.items():
        calls = "/".join(str(row["calls"].get(MODELS[tier], 0)) for tier in ESCALATION)
        print(f"| {name} | ${row['cost_usd']:.4f} | {row['cost_vs_premium']:.3f}x | {row['correct']} | "
              f"{row['incorrect']} | {row['failed']} | {calls} |")
    out = ROOT / "bench" / "results" / "cost_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tasks": len(tasks), "hard": hard, "cheap_fails": failing, "short": short,
                               "seed": args.seed, "prices": PRICES, "results": results}, indent=2) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
