"""Hermes Agent's cron jobs become hermes.yaml schedules (jobs.json written by hermes-agent 0.19.0's own
cron.jobs.create_job, in Asia/Kolkata); what cannot run at the same times in UTC is named, never moved."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.workspace import load_config
from hermes_sup.supervisor.governance.schedules import cron_error
from hermes_sup.supervisor.hermes.cron import carry_jobs, in_utc, interval_cron

JOBS = Path(__file__).resolve().parent / "fixtures" / "hermes" / "cron" / "jobs.json"


@pytest.mark.parametrize("minutes, cron", [
    (1, "* * * * *"), (5, "*/5 * * * *"), (30, "*/30 * * * *"), (60, "0 * * * *"), (120, "0 */2 * * *"),
    (480, "0 */8 * * *"), (1440, "0 0 * * *"), (45, None), (90, None), (7 * 60, None), (2880, None), (0, None),
])
def test_an_interval_becomes_a_cron_step_only_when_it_repeats_exactly(minutes, cron):
    assert interval_cron(minutes) == cron
    if cron:
        assert cron_error(cron) is None


@pytest.mark.parametrize("expr, offset, utc", [
    ("0 9 * * 1-5", 330, "30 3 * * 1-5"),        # Kolkata, same day
    ("15 8,20 * * *", -300, "15 1,13 * * *"),   # New York in winter: 20:15 is 01:15 the next day, every day
    ("0 2 * * 1", 330, None),                   # Monday 02:00 in Kolkata is Sunday in UTC
    ("0 23 1 * *", -60, None),                  # the 1st at 23:00 is the 2nd in UTC
    ("*/10 9 * * *", 60, None),                 # not a fixed minute
    ("0 9 * * *", 0, "0 9 * * *"),
    ("0 9-17 * * *", 120, None),                # a range of hours is not moved
    ("0 99 * * *", 60, None), ("75 3 * * *", 60, None),  # no time of day: never folded into one
    ("0 \u0669 * * *", 60, None),                # an Arabic-Indic nine is no cron digit
])
def test_a_cron_in_another_zone_moves_only_when_its_days_stay(expr, offset, utc):
    assert in_utc(expr, offset) == utc


def test_the_jobs_hermes_wrote_become_schedules_and_the_rest_are_named():
    jobs = json.loads(JOBS.read_text())["jobs"]
    schedules, notes, left = carry_jobs(jobs, "Asia/Kolkata", 330, {"hermes-queue-check"})
    by_title = {s["task"]["title"]: s for s in schedules}
    assert set(by_title) == {"morning digest", "queue check", "skilled"}
    assert by_title["morning digest"]["cron"] == "30 3 * * 1-5"
    assert by_title["morning digest"]["task"] == {"title": "morning digest", "body": "Summarise the overnight alerts"}
    assert by_title["queue check"]["cron"] == "*/30 * * * *"
    assert by_title["queue check"]["name"] == "hermes-queue-check-2", "a name taken is not reused"
    assert by_title["skilled"]["cron"] == "0 */2 * * *"
    assert by_title["skilled"]["task"]["meta"] == {"hermes": {"skills": ["arxiv"]}}
    assert any("repeats for good here (Hermes ran it 5 times)" in note for note in notes)
    assert any("Hermes' 0 9 * * 1-5 in Asia/Kolkata" in note for note in notes)
    why = {item["what"]: item["why"] for item in left}
    assert set(why) == {"cron job odd interval", "cron job one off", "cron job paused job", "cron job monday 2am"}
    assert "every 45 minutes" in why["cron job odd interval"]
    assert "no same-day equivalent in UTC" in why["cron job monday 2am"]
    assert "paused" in why["cron job paused job"] and "a one-off" in why["cron job one off"]


def test_import_hermes_writes_the_schedules_and_up_would_take_them(tmp_path: Path):
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    home = tmp_path / "home"
    (home / "cron").mkdir(parents=True)
    shutil.copy(JOBS, home / "cron" / "jobs.json")
    (home / "config.yaml").write_text("timezone: Asia/Kolkata\n")
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "import-hermes", str(home), "--name", "ops"])
    assert result.exit_code == 0, result.output
    assert "schedule hermes-morning-digest: 30 3 * * 1-5 (UTC), Hermes' 0 9 * * 1-5 in Asia/Kolkata" in result.output
    assert "cron job monday 2am: its cron '0 2 * * 1' in Asia/Kolkata has no same-day equivalent" in result.output
    assert "hermes-sup has no scheduler" not in result.output
    config = load_config(tmp_path / "ws" / "hermes.yaml")
    names = [s["name"] for s in config["schedules"]]
    assert names[-3:] == ["hermes-morning-digest", "hermes-queue-check", "hermes-skilled"]


def test_an_empty_cron_folder_and_an_empty_plugin_list_are_not_said_to_be_left_behind(tmp_path: Path):
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    home = tmp_path / "home"
    (home / "cron" / "output").mkdir(parents=True)
    (home / "config.yaml").write_text("plugins:\n  enabled: []\n  disabled: [x]\n")
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "import-hermes", str(home), "--name", "quiet",
                                       "--json"])
    assert result.exit_code == 0, result.output
    left = {item["what"] for item in json.loads(result.output)["not_carried_over"]}
    assert left == {"shell and delegation"}


@pytest.mark.parametrize("content, message", [("{not json", "cron/jobs.json is not JSON"),
                                              ("[" * 100_000, "nested too deeply")])
def test_a_damaged_jobs_file_is_refused_before_anything_is_written(tmp_path: Path, content, message):
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    home = tmp_path / "home"
    (home / "cron").mkdir(parents=True)
    (home / "cron" / "jobs.json").write_text(content)
    before = (tmp_path / "ws" / "hermes.yaml").read_bytes()
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "import-hermes", str(home), "--name", "x"])
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output
    assert (tmp_path / "ws" / "hermes.yaml").read_bytes() == before


def test_the_machines_zone_is_hermes_default(monkeypatch):
    from hermes_sup.supervisor.hermes.cron import offset_of

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    import time
    time.tzset()
    try:
        zone, offset = offset_of(None, datetime(2026, 11, 27, tzinfo=UTC))
        assert offset == 330 and "this machine's zone" in zone
        assert offset_of("Europe/Berlin", datetime(2026, 7, 1, tzinfo=UTC))[1] == 120
        with pytest.raises(ValueError):
            offset_of("Mars/Olympus", datetime(2026, 7, 1, tzinfo=UTC))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_jobs_that_cannot_be_schedules_are_named_and_names_never_collide():
    base = {"prompt": "p", "schedule": {"kind": "cron", "expr": "0 9 * * *"}}
    jobs = [{**base, "name": "x"}, {**base, "name": "x"}, {**base, "name": "x"},
            {**base, "name": "paused", "state": "paused"}, {**base, "name": "scripted", "script": "run.sh"},
            {**base, "name": "bad", "schedule": {"kind": "cron", "expr": "0 9 * * 8"}},
            {**base, "name": "quarter", "schedule": {"kind": "cron", "expr": "*/15 * * * *"}}]
    schedules, _, left = carry_jobs(jobs, "UTC", 0, set())
    assert [s["name"] for s in schedules] == ["hermes-x", "hermes-x-2", "hermes-x-3", "hermes-quarter"]
    assert schedules[-1]["cron"] == "*/15 * * * *", "in UTC already: carried unchanged"
    why = {item["what"]: item["why"] for item in left}
    assert "paused" in why["cron job paused"] and "script" in why["cron job scripted"]
    assert "no same-day equivalent" in why["cron job bad"]
    from hermes_sup.supervisor.hermes.cron import offset_of

    assert offset_of("Z", datetime(2026, 1, 1, tzinfo=UTC)) == ("Z", 0)


def test_a_cron_folder_that_is_a_link_is_not_followed(tmp_path: Path):
    assert CliRunner().invoke(main, ["init", str(tmp_path / "ws")]).exit_code == 0
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(JOBS, tmp_path / "elsewhere" / "jobs.json")
    (home / "cron").symlink_to(tmp_path / "elsewhere")
    result = CliRunner().invoke(main, ["-w", str(tmp_path / "ws"), "import-hermes", str(home), "--name", "x"])
    assert result.exit_code == 1 and "cron/" in result.output and "is a symlink" in result.output
