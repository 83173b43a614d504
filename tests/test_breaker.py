"""The providers' circuit breakers: the state machine on its own (pure), then through the real openai
SDK against the scripted server (a provider that refuses connections, then comes back), and in a real
team whose tasks wait "provider X down until T" without spending attempts, then get done."""

from __future__ import annotations

import json
import random
import socket
import subprocess

import pytest
from hermes_sup.agents.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Breaker,
    BreakerPolicy,
    admit,
    answered,
    blocked,
    describe,
    failed,
    from_dict,
    outage_event,
    released,
    saved_states,
)
from hermes_sup.agents.fallback import complete_with_fallback
from hermes_sup.agents.health import ProviderHealth
from hermes_sup.agents.providers import BREAKERS_FILE, OpenAIProvider, ProviderConfig, ProviderError
from hermes_sup.kanban import Board

from .conftest import CLI, ROOT, init_workspace, wait_until
from .llm_server import ScriptedLLM, error_reply, openai_reply

POLICY = BreakerPolicy(base=5.0, cap=60.0, jitter=0.0, threshold=3, probe_timeout=30.0)
MESSAGES = [{"role": "user", "content": "hi"}]


def fail(breaker: Breaker, now: float, *, at_once: bool = False, why: str = "timing out", **kw) -> Breaker:
    return failed(breaker, now, POLICY, 0.5, why=why, at_once=at_once, **kw)


# -- the state machine ----------------------------------------------------------------------------

def test_failures_in_a_row_open_it_at_the_threshold_and_an_answer_resets_the_count():
    breaker = fail(fail(Breaker(), 100.0), 101.0)
    assert (breaker.state, breaker.failures) == (CLOSED, 2)
    assert admit(breaker, 101.0, POLICY) == (breaker, True), "closed: calls go through"
    assert answered(breaker) == Breaker()
    breaker = fail(fail(fail(Breaker(), 100.0), 101.0), 102.0)
    assert (breaker.state, breaker.until, breaker.why) == (OPEN, 107.0, "timing out")


def test_a_refusal_opens_it_at_once_for_at_least_its_retry_after():
    breaker = fail(Breaker(), 100.0, at_once=True, why="unreachable")
    assert (breaker.state, breaker.until) == (OPEN, 105.0)
    assert fail(Breaker(), 100.0, at_once=True, why="rate limited", at_least=90.0).until == 190.0


def test_open_refuses_until_the_cooldown_then_lets_exactly_one_probe_through():
    breaker = fail(Breaker(), 100.0, at_once=True, why="unreachable")
    assert admit(breaker, 104.9, POLICY) == (breaker, False)
    assert blocked(breaker, 104.9, POLICY) == (105.0, "unreachable")
    probing, allowed = admit(breaker, 105.0, POLICY)
    assert allowed and (probing.state, probing.probe_at) == (HALF_OPEN, 105.0)
    assert admit(probing, 106.0, POLICY) == (probing, False), "a second caller waits for the probe's verdict"
    assert blocked(probing, 106.0, POLICY)[0] == 135.0
    assert answered(probing).state == CLOSED, "the probe answered: closed"


def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_the_cap():
    breaker = fail(Breaker(), 0.0, at_once=True, why="unreachable")
    untils = []
    for _ in range(6):
        probing, allowed = admit(breaker, breaker.until, POLICY)
        assert allowed
        breaker = fail(probing, breaker.until, why="timing out")  # one failure on a probe is enough
        untils.append(breaker.until - probing.probe_at)
    assert untils == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0]


def test_the_cooldown_jitter_spreads_agents_within_bounds():
    policy = BreakerPolicy(base=10.0, cap=60.0, jitter=0.2)
    spread = {round(failed(Breaker(), 0.0, policy, random.Random(seed).random(), why="x", at_once=True).until, 3)
              for seed in range(20)}
    assert len(spread) > 10 and all(8.0 <= until <= 12.0 for until in spread)


def test_a_probe_never_heard_from_is_given_up_on_and_a_stopped_one_is_released():
    probing, _ = admit(fail(Breaker(), 0.0, at_once=True, why="unreachable"), 5.0, POLICY)
    again, allowed = admit(probing, 35.0, POLICY)
    assert allowed and again.probe_at == 35.0, "after probe_timeout another probe may go"
    freed = released(probing, 6.0)
    assert (freed.state, freed.until) == (OPEN, 6.0)
    assert admit(freed, 6.0, POLICY)[1], "the next call probes at once"
    assert released(Breaker(), 6.0) == Breaker()


def test_an_outage_is_told_once_when_it_starts_and_once_when_it_ends():
    policy = BreakerPolicy()
    closed = Breaker()
    opened = failed(closed, 0.0, policy, 0.5, why="unreachable", at_once=True)
    assert outage_event(closed, opened) == "provider_down"
    probing, allowed = admit(opened, opened.until + 1, policy)
    assert allowed and outage_event(opened, probing) is None
    reopened = failed(probing, opened.until + 2, policy, 0.5, why="unreachable", at_once=True)
    assert outage_event(probing, reopened) is None, "a failed probe is the same outage"
    assert outage_event(reopened, answered(reopened)) == "provider_up"
    assert outage_event(closed, failed(closed, 0.0, policy, 0.5, why="timeout", at_once=False)) is None
    assert outage_event(closed, answered(closed)) is None


@pytest.mark.parametrize("data", [None, [], {"state": "melted"}, {"state": "open", "until": float("nan")},
                                  {"state": "open", "failures": -1}, {"state": "open", "opened": True},
                                  {"state": "open", "until": "soon"}])
def test_a_saved_breaker_that_is_not_one_is_refused(data):
    assert from_dict(data) is None


def test_saved_states_say_each_breaker_and_what_cannot_be_read():
    saved = {"w1": {"saved_at": "1970-01-01T00:01:30Z",
                    "breakers": {"local": {"state": "open", "until": 200.0, "why": "unreachable"},
                                 "cloud": {"state": "closed"}, "odd": {"state": 3}}},
             "w2": ["not", "a", "document"]}
    rows = saved_states(saved, 100.0)
    assert rows == [("w1", "cloud", "ok", "closed"),
                    ("w1", "local", "warn", "open: down until 1970-01-01T00:03:20Z (unreachable) "
                                            "(as of 1970-01-01T00:01:30Z)"),
                    ("w1", "odd", "warn", "a breaker that cannot be read"),
                    ("w2", "-", "warn", "its breakers' file cannot be read")]
    assert describe(Breaker(state=OPEN, until=50.0, why="x"), 100.0)[1].startswith("open, cooldown over")


# -- through the real SDK -------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_provider_that_refuses_connections_is_skipped_then_probed_when_it_comes_back(tmp_path):
    now = [1000.0]
    saved = tmp_path / BREAKERS_FILE
    health = ProviderHealth(POLICY, clock=lambda: now[0], path=saved)
    port = free_port()
    flaky = OpenAIProvider(ProviderConfig(name="flaky", kind="openai", model="m",
                                          base_url=f"http://127.0.0.1:{port}/v1", timeout=10))

    def state() -> dict:
        return json.loads(saved.read_text())["breakers"]["flaky"]

    with ScriptedLLM() as backup_llm:
        backup = OpenAIProvider(ProviderConfig(name="backup", kind="openai", model="b",
                                               base_url=f"{backup_llm.url}/v1"))
        backup_llm.script("openai", openai_reply("from backup 1"), openai_reply("from backup 2"))
        attempts: list = []
        first = complete_with_fallback([flaky, backup], MESSAGES, None, log=attempts.append, health=health)
        assert first.message["content"] == "from backup 1", "the chain skips to the next provider"
        assert [(a.provider, a.outcome) for a in attempts] == [("flaky", "unavailable"), ("backup", "ok")]
        assert (state()["state"], state()["until"]) == ("open", 1005.0), "saved for doctor"
        second = complete_with_fallback([flaky, backup], MESSAGES, None, log=attempts.append, health=health)
        assert second.message["content"] == "from backup 2"
        assert [a.provider for a in attempts[2:]] == ["backup"], "an open breaker's provider is not called"
        with pytest.raises(ProviderError) as alone:
            complete_with_fallback([flaky], MESSAGES, None, log=attempts.append, health=health)
        assert alone.value.kind == "unreachable" and alone.value.retry_at == 1005.0
        assert str(alone.value) == "provider flaky down until 1970-01-01T00:16:45Z (unreachable)"
        assert len(attempts) == 3, "waiting costs no call"

    with ScriptedLLM(port=port) as back:  # the server comes back on its port
        back.script("openai", openai_reply("flaky is back"), openai_reply("and stays"))
        now[0] = 1005.0
        probe = complete_with_fallback([flaky], MESSAGES, None, log=attempts.append, health=health)
        assert probe.message["content"] == "flaky is back"
        assert state() == {"state": "closed", "failures": 0, "opened": 0, "until": 0.0, "why": "", "probe_at": 0.0}
        assert complete_with_fallback([flaky], MESSAGES, None, health=health).message["content"] == "and stays"


def test_timeouts_open_the_breaker_only_after_the_threshold_in_a_row(tmp_path):
    now = [1000.0]
    health = ProviderHealth(POLICY, clock=lambda: now[0])
    with ScriptedLLM() as llm:
        slow = OpenAIProvider(ProviderConfig(name="slow", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                             timeout=0.3))
        llm.script("openai", *[{"delay": 1.0, **openai_reply("late")} for _ in range(3)])
        for count in (1, 2):
            with pytest.raises(ProviderError) as info:
                complete_with_fallback([slow], MESSAGES, None, health=health)
            assert info.value.kind == "exhausted", f"failure {count} is the task's to count"
            assert health.cooling("slow") is None
        with pytest.raises(ProviderError) as third:
            complete_with_fallback([slow], MESSAGES, None, health=health)
    assert third.value.kind == "unreachable" and "(timing out)" in str(third.value)
    assert health.cooling("slow") == (1005.0, "timing out")


def test_a_rate_limit_with_retry_after_is_retried_as_before_without_opening_the_breaker():
    health = ProviderHealth(POLICY, clock=lambda: 1000.0)
    waited: list[float] = []
    with ScriptedLLM() as llm:
        llm.script("openai", error_reply(429, "slow down", kind="rate_limit_exceeded", headers={"retry-after": "2"}),
                   openai_reply("fine"))
        busy = OpenAIProvider(ProviderConfig(name="busy", kind="openai", model="m", base_url=f"{llm.url}/v1"))
        done = complete_with_fallback([busy], MESSAGES, None, health=health, sleep=waited.append)
    assert done.message["content"] == "fine" and waited == [2.0]
    assert health.cooling("busy") is None and health.breakers.get("busy", Breaker()) == Breaker()


# -- a real team ------------------------------------------------------------------------------------

def test_tasks_wait_while_the_provider_is_down_then_get_done_when_it_comes_back(tmp_path, up):
    port = free_port()
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        "defaults:\n  stop_timeout: 20\n  heartbeat_timeout: 30\n"
        f"providers:\n  flaky: {{kind: openai, base_url: 'http://127.0.0.1:{port}/v1', model: m, timeout: 10}}\n"
        "tiers: {cheap: [flaky], standard: [flaky], premium: [flaky]}\nagents:\n  - name: thinker\n")
    board = Board(ws / "kanban")
    tasks = [board.add({"title": f"think {n}"}) for n in range(2)]
    up(ws)

    def waiting() -> list[dict]:
        docs = [board.get(t["id"]) for t in tasks]
        return docs if all(d["status"] == "todo" and (d.get("waiting") or "").startswith("provider flaky down until ")
                           for d in docs) else []

    docs = wait_until(waiting, timeout=60)
    assert [d["attempts"] for d in docs] == [0, 0], "an outage costs no attempt"
    doctor = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["breaker flaky"]["level"] == "warn"
    assert checks["breaker flaky"]["detail"].startswith("thinker: open: down until "), checks["breaker flaky"]

    with ScriptedLLM(responder=lambda api, body: openai_reply("thought it through"), port=port) as llm:
        assert llm.port == port
        # The first cooldown is 5 s (+/- 20%): the probe goes then, and both tasks follow.
        done = wait_until(lambda: all(board.get(t["id"])["status"] == "done" for t in tasks) and
                          [board.get(t["id"]) for t in tasks], timeout=90, interval=0.2)
        assert [d["attempts"] for d in done] == [1, 1]
        saved = json.loads((ws / "runs" / "thinker" / BREAKERS_FILE).read_text())
        assert saved["breakers"]["flaky"]["state"] == "closed"
    # The outage is in the events stream once, start and end, where alerts and the dashboard see it.
    events = subprocess.run([*CLI, "-w", str(ws), "events", "--json"], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    outages = [e for e in map(json.loads, events.stdout.splitlines()) if e.get("kind") == "agent"]
    assert [(e["event"], e["agent"], e["provider"]) for e in outages] == [
        ("provider_down", "thinker", "flaky"), ("provider_up", "thinker", "flaky")], outages
    assert outages[0]["until"] and outages[1]["until"] is None
