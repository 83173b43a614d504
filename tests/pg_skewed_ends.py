"""A host whose clock is off: ends claims on a PostgreSQL board, for tests/test_pg_clock.py.

usage: pg_skewed_ends.py SCHEMA SKEW_SECONDS   (the DSN from HERMES_SUP_TEST_PG_DSN)

The skew is installed before anything else is imported, so every way Python reads the wall clock
(time.time, time.time_ns, gmtime and localtime without an argument, datetime's now, utcnow and
today, however a module imported them) says this host's time, SKEW_SECONDS from the real one. The
database keeps its own clock. Each task is claimed and its claim ended in another way (complete,
fail, block, release, a recovery, a cancel); prints JSON: the ids, and the host's time as
kanban.task.now_iso says it, which the test checks is skewed.
"""

from __future__ import annotations

import sys

SKEW = float(sys.argv[2])

import datetime as _datetime  # noqa: E402 - the clock is skewed before any other import
import time  # noqa: E402

_time, _time_ns, _gmtime, _localtime = time.time, time.time_ns, time.gmtime, time.localtime
time.time = lambda: _time() + SKEW
time.time_ns = lambda: _time_ns() + int(SKEW * 1e9)
time.gmtime = lambda secs=None: _gmtime(time.time() if secs is None else secs)  # type: ignore[assignment]
time.localtime = lambda secs=None: _localtime(time.time() if secs is None else secs)  # type: ignore[assignment]


class _SkewedDatetime(_datetime.datetime):
    __slots__ = ()  # the layout of datetime's own (a compiled module importing it checks its size)

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _SkewedDatetime:  # type: ignore[override]
        return cls.fromtimestamp(time.time(), tz)

    @classmethod
    def utcnow(cls) -> _SkewedDatetime:  # type: ignore[override]
        return cls.fromtimestamp(time.time(), _datetime.UTC).replace(tzinfo=None)

    @classmethod
    def today(cls) -> _SkewedDatetime:  # type: ignore[override]
        return cls.fromtimestamp(time.time())


_datetime.datetime = _SkewedDatetime  # type: ignore[misc]

import json  # noqa: E402
import os  # noqa: E402

from hermes_sup.kanban.pg.store import PgStore  # noqa: E402
from hermes_sup.kanban.task import now_iso  # noqa: E402


def main() -> None:
    schema = sys.argv[1]
    dsn = os.environ["HERMES_SUP_TEST_PG_DSN"]
    ends = {
        "completed": lambda s, t: s.complete("completed", t, result="ok"),
        "failed-once": lambda s, t: s.fail("failed-once", t, "boom"),
        "failed-for-good": lambda s, t: s.fail("failed-for-good", t, "never", permanent=True),
        "blocked": lambda s, t: s.block("blocked", t, "stuck"),
        "asked": lambda s, t: s.block("asked", t, "a person decides", question="which one?"),
        "released": lambda s, t: s.release("released", t),
        "cancelled": lambda s, t: s.cancel("cancelled", by="alice"),
    }
    with PgStore(dsn, schema=schema, host="skewed", boot_id="boot-1") as store:
        store.heartbeat()
        for number, (task_id, end) in enumerate(ends.items()):
            # Each task before those back in todo (a failed attempt, a release) in claim order.
            store.add({"id": task_id, "title": task_id, "max_attempts": 3, "priority": number})
            held = store.claim("ag")
            assert held is not None and held["id"] == task_id, held
            end(store, held["claim"]["token"])
        # A host that restarted takes back its claims of before: the recovery's end.
        with PgStore(dsn, schema=schema, host="rebooted", boot_id="boot-old") as before:
            before.heartbeat()
            before.add({"id": "recovered", "title": "recovered", "priority": len(ends)})
            assert before.claim("ag", lease=600)["id"] == "recovered"
        with PgStore(dsn, schema=schema, host="rebooted", boot_id="boot-new") as after:
            after.heartbeat()
            assert [r["task"] for r in after.recover()] == ["recovered"]
    print(json.dumps({"ids": [*ends, "recovered"], "host_now": now_iso()}))


if __name__ == "__main__":
    main()
