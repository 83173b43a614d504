"""Restart decisions, without spawning anything."""

from __future__ import annotations

import random

import pytest
from hermes_sup.supervisor.policy import Decision, RestartHistory, RestartSpec, backoff_delay, cleared, decide

SPEC = RestartSpec(policy="on-failure", initial=0.5, max=8.0, max_restarts=5, window=60.0, reset_after=30.0)


def crash_loop(spec: RestartSpec, times: list[float], uptime: float = 0.1) -> list[Decision]:
    history, out, rng = RestartHistory(), [], random.Random(0)
    for now in times:
        decision = decide(spec, history, now=now, returncode=1, uptime=uptime, rng=rng)
        out.append(decision)
        history = decision.history
    return out


def test_first_crash_is_restarted_at_once_then_backoff_grows_with_jitter():
    decisions = crash_loop(SPEC, [0, 1, 2, 3, 4])
    delays = [d.delay for d in decisions]
    assert delays[0] == 0.0
    for delay, base in zip(delays[1:], [0.5, 1.0, 2.0, 4.0], strict=True):
        assert base / 2 <= delay <= base
    assert all(d.action == "restart" for d in decisions)


def test_backoff_is_capped():
    rng = random.Random(1)
    assert all(backoff_delay(SPEC, streak, rng) <= SPEC.max for streak in range(1, 40))
    assert backoff_delay(SPEC, 30, rng) >= SPEC.max / 2


def test_more_than_max_restarts_in_the_window_is_fatal():
    decisions = crash_loop(SPEC, [0, 1, 2, 3, 4, 5])
    assert [d.action for d in decisions] == ["restart"] * 5 + ["fatal"]
    assert "6 crashes within 60 s (limit 5)" in decisions[-1].reason


def test_crashes_outside_the_window_do_not_count():
    decisions = crash_loop(SPEC, [0, 20, 40, 61, 81, 101, 121])
    assert all(d.action == "restart" for d in decisions)


def test_a_healthy_run_resets_the_backoff_but_not_the_crash_count():
    history = crash_loop(SPEC, [0, 1, 2])[-1].history
    assert history.streak == 3
    after_healthy = decide(SPEC, history, now=40, returncode=1, uptime=35, rng=random.Random(0))
    assert after_healthy.delay == 0.0 and after_healthy.history.streak == 1
    assert len(after_healthy.history.crashes) == 4


@pytest.mark.parametrize(
    ("policy", "returncode", "action"),
    [
        ("on-failure", 0, "stop"), ("on-failure", 1, "restart"), ("on-failure", -9, "restart"),
        ("always", 0, "restart"), ("always", -15, "restart"),
        ("never", 1, "stop"), ("never", 0, "stop"),
    ],
)
def test_policies(policy, returncode, action):
    spec = RestartSpec(policy=policy)
    assert decide(spec, RestartHistory(), now=0, returncode=returncode, uptime=1, rng=random.Random(0)).action == action


def test_exit_is_described_for_people():
    decision = decide(SPEC, RestartHistory(), now=0, returncode=-9, uptime=1, rng=random.Random(0))
    assert decision.reason.startswith("killed by SIGKILL")
    assert "exited with status 3" in decide(SPEC, RestartHistory(), now=0, returncode=3, uptime=1,
                                            rng=random.Random(0)).reason


def test_a_manual_restart_clears_the_history():
    fatal = crash_loop(SPEC, [0, 1, 2, 3, 4, 5])[-1]
    assert fatal.action == "fatal"
    fresh = cleared(fatal.history)
    assert decide(SPEC, fresh, now=6, returncode=1, uptime=0.1, rng=random.Random(0)).action == "restart"


def test_a_shortage_at_spawn_backs_off_without_ever_giving_up():
    import errno

    from hermes_sup.supervisor.policy import decide_failed_start

    history, rng = RestartHistory(), random.Random(0)
    for i in range(20):
        decision = decide_failed_start(SPEC, history, now=float(i), error="Too many open files",
                                       err=errno.EMFILE, rng=rng)
        assert decision.action == "restart" and SPEC.initial <= decision.delay <= SPEC.max
        history = decision.history
    assert history.streak == 20 and history.crashes == ()


def test_a_start_that_can_never_work_ends_fatal_like_a_crash_loop():
    import errno

    from hermes_sup.supervisor.policy import decide_failed_start

    history, rng, actions = RestartHistory(), random.Random(0), []
    for i in range(6):
        decision = decide_failed_start(SPEC, history, now=float(i), error="No such file or directory",
                                       err=errno.ENOENT, rng=rng)
        assert decision.delay >= SPEC.initial or decision.action == "fatal", "never retried at once"
        actions.append(decision.action)
        history = decision.history
    assert actions == ["restart"] * 5 + ["fatal"]
    assert "could not start: No such file or directory" in decision.reason


def test_a_loop_turn_far_longer_than_its_wait_is_a_gap_in_the_supervisors_own_time():
    from hermes_sup.supervisor.policy import loop_gap

    assert loop_gap(elapsed=0.3, expected=1.0, tolerance=1.0) == 0.0  # woken early by an event
    assert loop_gap(elapsed=1.8, expected=1.0, tolerance=1.0) == 0.0  # a busy turn, within tolerance
    assert loop_gap(elapsed=13.0, expected=1.0, tolerance=1.0) == 12.0  # SIGSTOPped for 12 s
    assert loop_gap(elapsed=12.0, expected=0.0, tolerance=1.0) == 12.0


def test_the_loops_sleep_while_judging_never_lets_a_stopped_supervisor_kill_a_live_agent():
    """A supervisor SIGSTOPped at any moment of a sleep, for any time, whose agents' heartbeats were
    all dropped meanwhile: once continued, the silence it judges (time since the last beat it read,
    less the gap it credits) stays under the timeout. The sleep is what bounds it: the stop's part
    before the sleep would have ended is not seen as a gap."""
    from hermes_sup.agents.liveness import beat_every
    from hermes_sup.supervisor.policy import judge_every, loop_gap

    assert (beat_every(60, working=True), beat_every(60, working=False), beat_every(8, working=False)) == (5, 10, 2)
    for timeout in (3.0, 12.0, 60.0, 600.0):  # under 3 s, a busy turn's 1 s of tolerance is most of it
        every = max(beat_every(timeout, working=True), beat_every(timeout, working=False))
        sleep = judge_every(timeout)
        assert sleep >= 1.0
        worst = 0.0
        for late in (0.0, every / 2, every):  # the last beat read, this long before the turn
            for at in (0.0, 0.3, 0.7, 0.99):  # the stop begins this far into the sleep
                for stopped in (0.5, 2.0, sleep, 3 * timeout, 1000.0):
                    woke = max(sleep, at * sleep + stopped)
                    credited = loop_gap(elapsed=woke, expected=sleep, tolerance=1.0)
                    worst = max(worst, late + woke - credited)
        assert worst < timeout, (timeout, sleep, worst)
        if timeout >= 12:
            # a beat's interval, the sleep and the tolerance, and the idle loop turns that seldom
            assert worst <= timeout / 2 + 1.0 and sleep == timeout / 4


def test_a_turn_woken_by_heartbeats_alone_judges_nothing_until_a_deadline_or_a_change():
    from hermes_sup.supervisor.policy import beats_only

    notify = 7
    assert beats_only([7], notify, dirty=False, now=10.0, soonest=11.0)  # a beat: nothing to judge
    assert beats_only([7, 7], notify, dirty=False, now=10.0, soonest=11.0)
    assert not beats_only([7], notify, dirty=False, now=11.0, soonest=11.0)  # a deadline came: judge
    assert not beats_only([7], notify, dirty=True, now=10.0, soonest=11.0)  # an agent now running: write it
    assert not beats_only([7, 9], notify, dirty=False, now=10.0, soonest=11.0)  # an exit, a command, a signal
    assert not beats_only([], notify, dirty=False, now=10.0, soonest=11.0)  # a timeout is a deadline
