"""What an agent's exit means (supervisor/exits.py), decided without processes: the state it goes to,
its restart history, the events as records (what the stream, the alerts and `events` read) and the
log line rendered from the same decision."""

from __future__ import annotations

import random

import pytest
from hermes_sup.supervisor.exits import State, Why, exit_fields, on_exit, on_failed_start
from hermes_sup.supervisor.governance.alerts import alert_for
from hermes_sup.supervisor.policy import RestartHistory, RestartSpec

SPEC = RestartSpec(policy="on-failure", initial=0.5, max=30.0, max_restarts=2, window=60.0, reset_after=30.0)


FRESH = RestartHistory()


def exit_of(why: Why, returncode: int | None, history: RestartHistory = FRESH, *, held: bool = False,
            uptime: float = 1.0, spec: RestartSpec = SPEC):
    return on_exit("w", spec, history, why, returncode, now=100.0, uptime=uptime, held=held, rng=random.Random(1))


def names(decided) -> list[str]:
    return [record["event"] for record in decided.events]


def test_a_first_crash_restarts_at_once_with_its_exit_and_restart_as_records():
    decided = exit_of(Why.NONE, -9)
    assert decided.state is State.STARTING and decided.restarted and decided.restart_at is None
    assert names(decided) == ["exited", "restarting"]
    exited, restarting = decided.events
    assert exited == {"kind": "supervisor", "event": "exited", "agent": "w", "signal": "SIGKILL",
                      "note": "w: killed by SIGKILL; restart in 0.00 s"}
    assert restarting["delay"] == 0.0 and decided.line == exited["note"]
    assert decided.history.streak == 1 and decided.history.crashes == (100.0,)


def test_a_crash_streak_backs_off_and_the_line_says_the_delay_the_record_holds():
    decided = exit_of(Why.NONE, 3, RestartHistory(crashes=(99.0,), streak=1))
    assert decided.state is State.BACKOFF and decided.restart_at is not None and not decided.restarted
    exited, restarting = decided.events
    assert exited["code"] == "3" and "signal" not in exited
    assert decided.line == f"w: exited with status 3; restart in {restarting['delay']:.2f} s"
    assert decided.restart_at == pytest.approx(100.0 + restarting["delay"], abs=0.006)


def test_a_crash_loop_is_fatal_and_the_fatal_record_is_what_the_alert_reads():
    decided = exit_of(Why.NONE, 1, RestartHistory(crashes=(98.0, 99.0), streak=2))
    assert decided.state is State.FATAL and names(decided) == ["fatal"]
    fatal = decided.events[0]
    assert fatal["code"] == "1" and "3 crashes within 60 s (limit 2)" in fatal["reason"]
    # The line is rendered from the decision: a rewording here fails this test, and never the alert,
    # which reads the record.
    assert decided.line == f"w: FATAL: {fatal['reason']}"
    assert alert_for({**fatal, "at": "2026-01-01T00:00:00Z"}) == "agent_fatal"


@pytest.mark.parametrize("why", [Why.HANG, Why.MEMORY])
def test_a_hang_or_memory_kill_is_a_crash_whatever_the_status(why):
    decided = exit_of(why, 0)  # it exited 0 on SIGTERM: still a crash, so on-failure restarts it
    assert decided.state is State.STARTING and decided.restarted
    assert decided.events[0]["why"] == why.value and decided.events[0]["code"] == "0"
    assert decided.line == f"w: exited with status 0 ({why.value}); restart in 0.00 s"


@pytest.mark.parametrize("why", [Why.STOP, Why.DOWN, Why.REMOVE])
def test_stopped_by_a_person_down_or_a_removal_stays_stopped_and_is_no_crash(why):
    history = RestartHistory(crashes=(99.0,), streak=1)
    decided = exit_of(why, -15, history, held=True)
    assert decided.state is State.STOPPED and decided.history == history and names(decided) == ["exited"]
    assert decided.line == f"w: stopped, killed by SIGTERM ({why.value})"
    assert decided.events[0]["why"] == why.value


def test_a_stop_undone_while_stopping_starts_again_without_counting_a_restart():
    decided = exit_of(Why.STOP, 0, held=False)
    assert decided.state is State.STARTING and not decided.restarted
    assert names(decided) == ["exited", "restarting"]
    assert decided.line == "w: exited with status 0 (stop); starting again"


@pytest.mark.parametrize("why", [Why.RESTART, Why.RELOAD])
def test_a_restart_or_reload_restarts_at_once_and_counts_no_crash(why):
    decided = exit_of(why, 0)
    assert decided.state is State.STARTING and decided.restarted and decided.history == RestartHistory()
    assert decided.line == f"w: exited with status 0 ({why.value}); restarting"


def test_a_clean_exit_under_on_failure_stops_and_never_under_always():
    assert exit_of(Why.NONE, 0).state is State.STOPPED
    assert exit_of(Why.NONE, 0).line == "w: exited with status 0; restart policy on-failure"
    always = RestartSpec(policy="always")
    assert exit_of(Why.NONE, 0, spec=always).state is State.STARTING


def test_how_an_exit_is_told():
    assert exit_fields(0) == {"code": "0"} and exit_fields(-15) == {"signal": "SIGTERM"}
    assert exit_fields(None) == {} and exit_fields(-200) == {"signal": "signal 200"}
    assert exit_of(Why.NONE, None).line.startswith("w: vanished")
    with pytest.raises(ValueError):
        Why("rebooted")  # the reasons are a closed set


def test_an_agent_that_stopped_itself_for_no_supervisor_is_a_crash_said_and_alerted():
    from hermes_sup.agents.notify import ORPHANED

    decided = exit_of(Why.NONE, ORPHANED)
    assert decided.state is State.STARTING and decided.restarted, "a clean-looking exit it is not"
    assert names(decided) == ["orphaned", "exited", "restarting"]
    assert alert_for({**decided.events[0], "at": "2026-01-01T00:00:00Z"}) == "agent_orphaned"
    assert names(exit_of(Why.STOP, ORPHANED, held=True)) == ["exited"], "stopped by a person: no such event"


def test_a_start_that_fails_backs_off_then_is_fatal_and_both_are_records_the_alert_reads():
    rng = random.Random(1)
    first = on_failed_start("w", SPEC, FRESH, "No such file or directory", 2, now=100.0, rng=rng)
    assert first.state is State.BACKOFF and first.restart_at == pytest.approx(100.0 + first.events[0]["delay"])
    assert first.events == ({"kind": "supervisor", "event": "start_failed", "agent": "w",
                             "delay": first.events[0]["delay"], "reason": "could not start: No such file or directory",
                             "note": first.line},)
    assert first.last_exit == "could not start: No such file or directory"
    history = first.history
    for now in (101.0, 102.0):
        decided = on_failed_start("w", SPEC, history, "No such file or directory", 2, now=now, rng=rng)
        history = decided.history
    assert decided.state is State.FATAL and decided.restart_at is None
    assert decided.line.startswith("w: FATAL: could not start: No such file or directory; 3 failures")
    [fatal] = decided.events
    assert fatal["event"] == "fatal" and fatal["note"] == decided.line
    assert alert_for({**fatal, "at": "2026-01-01T00:00:00Z"}) is not None


def test_a_shortage_of_descriptors_backs_off_without_ever_being_fatal():
    history = FRESH
    for now in range(100, 120):
        decided = on_failed_start("w", SPEC, history, "Too many open files", 24, now=float(now), rng=random.Random(1))
        history = decided.history
        assert decided.state is State.BACKOFF
