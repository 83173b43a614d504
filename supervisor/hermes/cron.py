"""Hermes Agent's cron jobs (a profile's cron/jobs.json) as hermes.yaml `schedules:`, with a reason for
each one that cannot be one (pure, but for the bounded read of the file).

Hermes keeps a job's schedule as `{kind: cron, expr}`, `{kind: interval, minutes}` or `{kind: once,
run_at}`, in its configured time zone (config.yaml's `timezone`, else the machine's). Schedules here
are five-field cron in UTC: an interval that divides an hour or a day becomes a cron step, a cron
expression in another zone has its fixed minute and hour moved by the zone's offset when that keeps
its days, and whatever cannot be said exactly is left out and named, never turned into something
that runs at another time without a word.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..governance.schedules import cron_error

MAX_JOBS_FILE = 4 << 20
UTC_NAMES = {"utc", "etc/utc", "gmt", "etc/gmt", "z", "zulu", "universal", "etc/universal"}
NUMBER = re.compile(r"[0-9]{1,2}")


def jobs_in(data: bytes) -> list[dict[str, Any]]:
    """The jobs of a jobs.json, as Hermes reads it ({"jobs": [...]}, or a bare list); ValueError when
    it is no JSON of either shape."""
    parsed = json.loads(data.decode("utf-8"))
    jobs = parsed.get("jobs") if isinstance(parsed, dict) else parsed
    if not isinstance(jobs, list):
        raise ValueError("it holds no list of jobs")
    return [job for job in jobs if isinstance(job, dict)]


def offset_of(zone: str | None, now: datetime) -> tuple[str, int]:
    """(the zone's name, its offset from UTC in minutes at `now`) for Hermes' `timezone` setting, or
    the machine's own zone when it has none; ValueError for a zone this Python does not know."""
    if not zone or zone.strip().lower() in UTC_NAMES:
        if zone:
            return zone.strip(), 0
        local = now.astimezone()
        offset = local.utcoffset() or timedelta(0)
        return f"this machine's zone ({local.tzname()})", int(offset.total_seconds() // 60)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        moment = now.astimezone(ZoneInfo(zone.strip()))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"time zone {zone!r} is unknown") from exc
    return zone.strip(), int((moment.utcoffset() or timedelta(0)).total_seconds() // 60)


def interval_cron(minutes: int) -> str | None:
    """A cron expression that fires every `minutes` from a fixed origin (the hour or the day), or None
    when no five-field expression repeats at that interval."""
    if 0 < minutes < 60 and 60 % minutes == 0:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60 == 0 and 0 < minutes // 60 <= 24 and 24 % (minutes // 60) == 0:
        hours = minutes // 60
        return "0 * * * *" if hours == 1 else "0 0 * * *" if hours == 24 else f"0 */{hours} * * *"
    return None


def in_utc(expr: str, offset: int) -> str | None:
    """`expr` (five fields, local to a zone `offset` minutes ahead of UTC) said in UTC, or None when
    moving it would change its day (a fixed hour that crosses midnight under a day-of-month,
    month or weekday rule) or its fields are no plain numbers."""
    fields = expr.split()
    if offset == 0:
        return expr
    if len(fields) != 5 or not NUMBER.fullmatch(fields[0]) or not all(NUMBER.fullmatch(h)
                                                                     for h in fields[1].split(",")):
        return None
    minute, hours = int(fields[0]), [int(hour) for hour in fields[1].split(",")]
    if minute > 59 or any(hour > 23 for hour in hours):
        return None  # no time of day: moving it would make one
    moved = [hour * 60 + minute - offset for hour in hours]
    if fields[2:] != ["*", "*", "*"] and any(m // 1440 != 0 for m in moved):
        return None
    minutes = sorted({m % 1440 for m in moved})
    if len({m % 60 for m in minutes}) > 1:
        return None
    return f"{minutes[0] % 60} {','.join(str(m // 60) for m in minutes)} {' '.join(fields[2:])}"


def schedule_name(job: dict[str, Any], taken: set[str]) -> str:
    """A schedule name of hermes.yaml for the job (lower-case, digits, '-', at most 45), not in `taken`."""
    base = re.sub(r"[^a-z0-9]+", "-", str(job.get("name") or job.get("id") or "job").lower()).strip("-")[:38]
    base = base or "job"
    name, number = f"hermes-{base}"[:45].rstrip("-"), 2
    while name in taken:
        name, number = f"hermes-{base}"[:41].rstrip("-") + f"-{number}", number + 1
    return name


def carry_jobs(jobs: list[dict[str, Any]], zone: str, offset: int, taken: set[str]
               ) -> tuple[list[dict[str, Any]], list[str], list[dict[str, str]]]:
    """(schedules for hermes.yaml, notes, what was not carried with why) of Hermes' jobs (pure)."""
    schedules: list[dict[str, Any]] = []
    notes: list[str] = []
    left: list[dict[str, str]] = []
    names = set(taken)
    for job in jobs:
        label = str(job.get("name") or job.get("id") or "a job")[:60]
        schedule = job.get("schedule") if isinstance(job.get("schedule"), dict) else {}
        kind = schedule.get("kind")
        prompt = job.get("prompt")

        def leave(why: str, label: str = label) -> None:
            left.append({"what": f"cron job {label}", "why": why})

        if job.get("no_agent") or job.get("script"):
            leave("it runs a script, not an agent: run the script from your own cron")
            continue
        if not isinstance(prompt, str) or not prompt.strip():
            leave("it has no prompt")
            continue
        if job.get("enabled") is False or job.get("state") == "paused":
            leave("paused in Hermes: add it to schedules: in hermes.yaml when it should run")
            continue
        if kind == "interval" and isinstance(schedule.get("minutes"), int):
            cron = interval_cron(schedule["minutes"])
            if cron is None:
                leave(f"every {schedule['minutes']} minutes repeats at no five-field cron time (it must divide an "
                      "hour or a day): add a schedule that comes close by hand")
                continue
        elif kind == "cron" and isinstance(schedule.get("expr"), str):
            cron = in_utc(schedule["expr"].strip(), offset)
            if cron is None or cron_error(cron):
                leave(f"its cron {schedule['expr']!r} in {zone} has no same-day equivalent in UTC, where schedules "
                      "run here: write it in UTC by hand")
                continue
        elif kind == "once":
            leave(f"a one-off at {schedule.get('run_at')}: schedules here repeat; add the task at that time "
                  "(hermes-sup task add)")
            continue
        else:
            leave("its schedule is of no kind Hermes writes (cron, interval, once)")
            continue
        name = schedule_name(job, names)
        names.add(name)
        task: dict[str, Any] = {"title": label, "body": prompt.strip()}
        extra = {key: job[key] for key in ("skills", "model", "provider", "deliver", "workdir")
                 if job.get(key) and not (key == "deliver" and job[key] == "local")}  # local: Hermes' default
        if extra:
            task["meta"] = {"hermes": extra}
        schedules.append({"name": name, "cron": cron, "task": task})
        said = f"schedule {name}: {cron} (UTC)"
        if kind == "cron" and cron != schedule["expr"].strip():
            said += f", Hermes' {schedule['expr'].strip()} in {zone}"
        if offset and kind == "cron":
            said += "; a daylight-saving change there moves it by an hour against UTC"
        times = (job.get("repeat") or {}).get("times") if isinstance(job.get("repeat"), dict) else None
        if isinstance(times, int):
            said += f"; it repeats for good here (Hermes ran it {times} times)"
        if extra:
            said += f"; kept in the task's meta.hermes, not acted on: {', '.join(extra)}"
        notes.append(said)
    return schedules, notes, left


def read_jobs(path: Path, read_bounded: Any) -> list[dict[str, Any]]:
    """The jobs of a profile's cron/jobs.json (none when it has no file); ValueError for a damaged one."""
    data = read_bounded(path, MAX_JOBS_FILE, "cron/jobs.json")
    if data is None:
        return []
    try:
        return jobs_in(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cron/jobs.json is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError("cron/jobs.json is nested too deeply to be Hermes' jobs") from None
