"""The cascade routing strategy: the check on its own (pure), the cascade through the real openai SDK
against the scripted server, and a real team whose LLM-call log shows each decision."""

from __future__ import annotations

import json
import socket

import pytest
from hermes_sup.agents.cascade import (
    ASK_CONFIDENCE,
    Cascade,
    CascadePolicy,
    cascade_policy,
    cascades,
    confidence,
    judge,
    with_confidence_ask,
    without_confidence,
)
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig
from hermes_sup.agents.spend import llm_record
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply

TOOLS = [{"type": "function", "function": {"name": "write_file", "description": "write", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}]


def call(name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]}


# -- the check --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("message", "verdict"), [
    (call("write_file", '{"path": "a", "content": "b"}'), (True, "1 valid tool call(s)")),
    (call("rm_rf", '{"path": "/"}'), (False, "invalid tool call: a call to 'rm_rf', a tool it was not offered")),
    (call("write_file", '{"path": "a", '), (False, "invalid tool call: write_file: arguments that are not JSON")),
    (call("write_file", '["a"]'), (False, "invalid tool call: write_file: arguments that are not an object")),
    (call("write_file", '{"path": "a"}'), (False, "invalid tool call: write_file: missing required argument(s) "
                                                  "content")),
    ({"role": "assistant", "content": "It is 42.\nconfidence: 0.9"}, (True, "confidence 0.9")),
    ({"role": "assistant", "content": "It is 42.\n**Confidence:** 85%"}, (True, "confidence 0.85")),
    ({"role": "assistant", "content": "Maybe 41?\nconfidence: 0.3"}, (False, "confidence 0.3 below 0.7")),
    ({"role": "assistant", "content": "It is 42."}, (False, "no confidence reported")),
    ({"role": "assistant", "content": "confidence: 1"}, (False, "an empty answer")),
    ({"role": "assistant", "content": None}, (False, "an empty answer")),
])
def test_the_check_accepts_valid_calls_and_confident_answers_and_escalates_the_rest(message, verdict):
    assert judge(message, TOOLS, 0.7) == verdict


@pytest.mark.parametrize(("reported", "minimum", "accepted"), [
    ("0.7", 0.7, True), ("70%", 0.7, True), ("0.85", 0.85, True), ("1", 1.0, True), ("0", 0.0, True),
    ("0.6999", 0.7, False), ("69%", 0.7, False), ("0.84", 0.85, False), ("0.99", 1.0, False)])
def test_a_confidence_exactly_at_min_confidence_is_kept_and_just_below_escalates(reported, minimum, accepted):
    # "At least min_confidence" (docs/explanation/llm-providers.md, Routing strategies): the boundary itself is kept.
    kept, why = judge({"role": "assistant", "content": f"It is 42.\nconfidence: {reported}"}, None, minimum)
    assert kept is accepted, why
    assert why == (f"confidence {confidence('confidence: ' + reported):g}" if accepted
                   else f"confidence {confidence('confidence: ' + reported):g} below {minimum:g}")


def test_the_confidence_line_is_asked_of_the_cheap_tier_and_taken_out_of_an_accepted_answer():
    asked = with_confidence_ask([{"role": "system", "content": "You work."}, {"role": "user", "content": "q"}])
    assert asked[0]["content"] == f"You work.\n\n{ASK_CONFIDENCE}" and asked[1] == {"role": "user", "content": "q"}
    assert with_confidence_ask([{"role": "user", "content": "q"}])[0] == {"role": "system", "content": ASK_CONFIDENCE}
    assert without_confidence({"role": "assistant", "content": "42\n\nconfidence: 0.9\n"})["content"] == "42"
    assert confidence("confidence: 0.2\nmore\nconfidence: 0.8") == 0.8, "the last one counts"
    assert confidence("my confidence: is high") is None


@pytest.mark.parametrize(("spec", "words"), [
    ("{strategy: cheapest}", "'routing.strategy' must be one of tiers, cascade, got 'cheapest'"),
    ("{strategy: cascade, cheap: tiny}", "'routing.cheap' must be one of cheap, standard, premium"),
    ("{strategy: cascade, min_confidence: 1.5}", "'routing.min_confidence' must be a number from 0 to 1"),
    ("{strategy: cascade, min_confidence: -0.1}", "must be a number from 0 to 1, got -0.1"),
    ("{strategy: cascade, min_confidence: true}", "must be a number from 0 to 1"),
    ("{strategy: cascade, verifier: true}", "unknown key 'routing.verifier' (did you mean 'verify'?)"),
    ("{strategy: cascade, verify: 'yes'}", "'routing.verify' must be true or false"),
    ("{strategy: null}", "'routing.strategy' must be one of"),
    ("[]", "'routing' must be a mapping"),
])
def test_a_wrong_routing_is_named(tmp_path, spec, words):
    path = tmp_path / "hermes.yaml"
    path.write_text(f"agents:\n  - name: w\nrouting: {spec}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert words in str(info.value), str(info.value)


def test_routing_is_checked_at_load_with_its_line(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_text("agents:\n  - name: w\nrouting:\n  strategy: cascade\n  min_confidence: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:4: 'routing.min_confidence' must be a number from 0 to 1")
    path.write_text("agents:\n  - name: w\nrouting: {strategy: cascade, premium: standard}\n")
    assert cascade_policy(load_config(path)) == CascadePolicy(cheap="cheap", premium="standard")
    assert cascade_policy({}) is None and cascade_policy({"routing": {"strategy": "tiers"}}) is None
    assert cascade_policy({"routing": {"strategy": "cascade", "verify": True}}).verify


def test_only_tasks_whose_tier_is_left_to_routing_cascade():
    assert cascades({}, "auto") and cascades({"tier": "auto"}, "auto")
    assert not cascades({"tier": "premium"}, "auto") and not cascades({}, "standard")


# -- through the real SDK ---------------------------------------------------------------------------

def by_model(replies: dict[str, list[str]]):
    def respond(api: str, body: dict) -> dict:
        return openai_reply(replies[body["model"]].pop(0), prompt=1000, completion=100, model=body["model"])
    return respond


def provider(url: str, name: str) -> OpenAIProvider:
    return OpenAIProvider(ProviderConfig(name=name, kind="openai", model=f"{name}-model", base_url=f"{url}/v1"))


MESSAGES = [{"role": "system", "content": "You work."}, {"role": "user", "content": "What is 6 x 7?"}]
PRICES = {"cheap-model": {"input": 0.25, "output": 1.25}, "premium-model": {"input": 15, "output": 75}}


def test_a_confident_cheap_answer_is_accepted_and_the_premium_tier_never_called():
    with ScriptedLLM(responder=by_model({"cheap-model": ["42\nconfidence: 0.95"]})) as llm:
        cascade = Cascade([provider(llm.url, "cheap")], [provider(llm.url, "premium")], CascadePolicy())
        records = []
        answer = cascade(cascade.chain, MESSAGES, None, log=lambda a: records.append(llm_record("t", a, PRICES)))
        sent = [r["body"] for r in llm.requests]
    assert answer.message["content"] == "42"
    assert [b["model"] for b in sent] == ["cheap-model"] and ASK_CONFIDENCE in sent[0]["messages"][0]["content"]
    assert [(r["model"], r["route"]) for r in records] == [("cheap-model", {
        "strategy": "cascade", "tier": "cheap", "decision": "accepted", "why": "confidence 0.95"})]


def test_an_unsure_cheap_answer_escalates_and_the_log_says_why():
    replies = {"cheap-model": ["maybe 41\nconfidence: 0.3"], "premium-model": ["42"]}
    with ScriptedLLM(responder=by_model(replies)) as llm:
        cascade = Cascade([provider(llm.url, "cheap")], [provider(llm.url, "premium")], CascadePolicy())
        records = []
        answer = cascade(cascade.chain, MESSAGES, None, log=lambda a: records.append(llm_record("t", a, PRICES)))
        sent = [r["body"] for r in llm.requests]
    assert answer.message["content"] == "42"
    assert sent[1]["messages"] == MESSAGES, "the premium tier gets the conversation as it is"
    assert [(r["model"], r["route"]["decision"], r["route"]["why"]) for r in records] == [
        ("cheap-model", "escalated", "confidence 0.3 below 0.7"),
        ("premium-model", "final", "escalated: confidence 0.3 below 0.7")]
    assert records[0]["cost_usd"] == pytest.approx(0.000375) and records[1]["cost_usd"] == pytest.approx(0.0225)


def test_a_cheap_answer_exactly_at_min_confidence_stands_and_the_premium_tier_is_never_called():
    with ScriptedLLM(responder=by_model({"cheap-model": ["42\nconfidence: 0.8"]})) as llm:
        cascade = Cascade([provider(llm.url, "cheap")], [provider(llm.url, "premium")],
                          CascadePolicy(min_confidence=0.8))
        records = []
        answer = cascade(cascade.chain, MESSAGES, None, log=lambda a: records.append(llm_record("t", a, PRICES)))
        sent = [r["body"]["model"] for r in llm.requests]
    assert answer.message["content"] == "42" and sent == ["cheap-model"]
    assert [r["route"]["decision"] for r in records] == ["accepted"]


def test_an_invalid_cheap_tool_call_escalates():
    def respond(api: str, body: dict) -> dict:
        if body["model"] == "cheap-model":
            return openai_reply(None, [("write_file", {"path": "a"})])
        return openai_reply(None, [("write_file", {"path": "a", "content": "b"})])

    with ScriptedLLM(responder=respond) as llm:
        cascade = Cascade([provider(llm.url, "cheap")], [provider(llm.url, "premium")], CascadePolicy())
        records = []
        answer = cascade(cascade.chain, MESSAGES, TOOLS, log=records.append)
    assert json.loads(answer.message["tool_calls"][0]["function"]["arguments"]) == {"path": "a", "content": "b"}
    assert [a.route["decision"] for a in records] == ["escalated", "final"]
    assert records[0].route["why"] == "invalid tool call: write_file: missing required argument(s) content"


def test_a_cheap_tier_that_is_down_escalates():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with ScriptedLLM(responder=by_model({"premium-model": ["42"]})) as llm:
        cascade = Cascade([provider(closed, "cheap")], [provider(llm.url, "premium")], CascadePolicy())
        records = []
        answer = cascade(cascade.chain, MESSAGES, None, log=records.append)
    assert answer.message["content"] == "42"
    assert [(a.outcome, a.route["tier"]) for a in records] == [("unavailable", "cheap"), ("ok", "premium")]
    assert records[1].route["why"].startswith("escalated: the cheap tier failed: ")


# -- a real team ------------------------------------------------------------------------------------

def test_a_team_routed_by_cascade_logs_each_decision(tmp_path, up):
    def respond(api: str, body: dict) -> dict:
        task = body["messages"][1]["content"]
        if body["model"] == "cheap-model":
            sure = "0.9" if "easy" in task else "0.2"
            return openai_reply(f"cheap answer\nconfidence: {sure}", model="cheap-model")
        return openai_reply("premium answer", model="premium-model")

    with ScriptedLLM(responder=respond) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            "defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
            f"providers:\n  small: {{kind: openai, base_url: '{llm.url}/v1', model: cheap-model}}\n"
            f"  big: {{kind: openai, base_url: '{llm.url}/v1', model: premium-model}}\n"
            "tiers: {cheap: [small], standard: [big], premium: [big]}\n"
            "routing: {strategy: cascade, min_confidence: 0.7}\n"
            "agents:\n  - name: thinker\n")
        board = Board(ws / "kanban")
        easy = board.add({"title": "an easy one"})
        hard = board.add({"title": "a hard one"})
        up(ws)
        docs = wait_until(lambda: all(board.get(t["id"])["status"] == "done" for t in (easy, hard))
                          and [board.get(t["id"]) for t in (easy, hard)], timeout=60)
    assert [d["result"]["answer"] for d in docs] == ["cheap answer", "premium answer"]
    calls = [json.loads(line) for line in (ws / "runs/thinker/llm_calls.jsonl").read_text().splitlines()
             if "\"outcome\":\"started\"" not in line]
    routes = {(c["task"], c["model"]): c["route"] for c in calls}
    assert routes[(easy["id"], "cheap-model")]["decision"] == "accepted"
    assert routes[(hard["id"], "cheap-model")] == {"strategy": "cascade", "tier": "cheap", "decision": "escalated",
                                                   "why": "confidence 0.2 below 0.7"}
    assert routes[(hard["id"], "premium-model")]["decision"] == "final"


# -- the verifier -----------------------------------------------------------------------------------

def test_the_verifier_is_asked_the_task_and_the_answer_and_its_first_word_decides():
    from hermes_sup.agents.cascade import VERIFY, verified, verifier_prompt

    asked = verifier_prompt([*MESSAGES, {"role": "assistant", "content": "?"}, {"role": "user", "content": "more"}],
                            {"role": "assistant", "content": "42"})
    assert asked[0] == {"role": "system", "content": VERIFY}
    assert asked[1]["content"] == "The request:\nWhat is 6 x 7?\n\n(latest message: more)\n\nThe answer:\n42"
    assert verified({"content": "Yes."}) and verified({"content": " **YES**"})
    assert not verified({"content": "No, it is wrong"}) and not verified({"content": None})
    assert not verified({"content": "Yesterday"}), "a word, not a prefix"


@pytest.mark.parametrize(("verdict", "served_by", "decisions"), [
    ("YES", "42", [("cheap-model", "verifier", "yes"), ("cheap-model", None, "accepted")]),
    ("NO", "premium 42", [("cheap-model", "verifier", "no"), ("cheap-model", None, "escalated"),
                          ("premium-model", None, "final")]),
])
def test_with_verify_a_confident_answer_stands_only_if_the_verifier_says_yes(verdict, served_by, decisions):
    def respond(api: str, body: dict) -> dict:
        if body["model"] == "premium-model":
            return openai_reply("premium 42", model="premium-model")
        if body["messages"][0]["content"].startswith("You check another model's answer"):
            return openai_reply(verdict, model="cheap-model")
        return openai_reply("42\nconfidence: 0.95", model="cheap-model")

    with ScriptedLLM(responder=respond) as llm:
        cascade = Cascade([provider(llm.url, "cheap")], [provider(llm.url, "premium")], CascadePolicy(verify=True))
        records = []
        answer = cascade(cascade.chain, MESSAGES, None, log=lambda a: records.append(llm_record("t", a, PRICES)))
        verifier_request = llm.requests[1]["body"]
    assert answer.message["content"] == served_by
    assert "The answer:\n42" in verifier_request["messages"][1]["content"] and "tools" not in verifier_request
    assert [(r["model"], r["route"].get("check"), r["route"]["decision"]) for r in records] == decisions
    assert records[1]["route"]["why"] == f"confidence 0.95; the verifier said {verdict.lower()}"


def test_task_log_shows_each_routing_decision_and_keeps_a_hostile_one_to_text():
    from hermes_sup.supervisor.views.render import log_lines
    from hermes_sup.supervisor.views.timeline import model_entry

    record = {"at": "2026-11-22T18:00:00Z", "provider": "small", "model": "cheap-model", "outcome": "ok",
              "tokens_in": 10, "tokens_out": 2, "latency_s": 0.1, "cost_usd": 0.0,
              "route": {"strategy": "cascade", "tier": "cheap", "decision": "escalated",
                        "why": "confidence 0.3 below 0.7\x1b[31m", "extra": {"deep": 1}}}
    entry = model_entry("thinker", record)
    assert entry["route"] == {"strategy": "cascade", "tier": "cheap", "decision": "escalated",
                              "why": "confidence 0.3 below 0.7\x1b[31m"}
    line = log_lines(entry)[0]
    assert line.endswith("route: cheap escalated (confidence 0.3 below 0.7\\x1b[31m)"), line
    assert "route" not in model_entry("thinker", {**record, "route": ["not", "a", "route"]})
    assert "route" not in model_entry("thinker", {**record, "route": {"tier": 3}})
