"""A claimer process for the PostgreSQL board tests: claims and completes tasks until the board has
none left, then prints the ids it completed as JSON. The DSN comes from HERMES_SUP_TEST_PG_DSN.

usage: pg_worker.py SCHEMA HOST AGENT [HOST_TIMEOUT [WORK_SECONDS]]
With HOST_TIMEOUT the process heartbeats for its host and, while it waits, takes back the claims of
silent hosts (as a supervisor's sweeper would). WORK_SECONDS is how long each task takes.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hermes_sup.kanban.errors import ClaimLost
from hermes_sup.kanban.pg.store import PgStore


def main() -> None:
    schema, host, agent = sys.argv[1:4]
    host_timeout = float(sys.argv[4]) if len(sys.argv) > 4 else None
    work = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    done: list[str] = []
    lost: list[str] = []
    with PgStore(os.environ["HERMES_SUP_TEST_PG_DSN"], schema=schema, host=host, boot_id="boot-1",
                 migrate_schema=False, host_timeout=host_timeout or 30.0) as store:
        if host_timeout is not None:
            store.start_heartbeat(interval=host_timeout / 6)
        last_recover = 0.0
        while True:
            doc = store.claim(agent)
            if doc is None:
                counts = store.counts()
                if counts["todo"] == 0 and counts["doing"] == 0:
                    break
                if host_timeout is not None and time.monotonic() - last_recover > 0.3:
                    store.recover()
                    last_recover = time.monotonic()
                store.listener().wait(store.listener().generation, 0.05)
                continue
            if work:
                time.sleep(work)  # the task's work, during which the claim is held
            try:
                store.complete(doc["id"], doc["claim"]["token"], result={"by": agent, "host": host})
                done.append(doc["id"])
            except ClaimLost:
                lost.append(doc["id"])
    print(json.dumps({"done": done, "lost": lost}))


if __name__ == "__main__":
    main()
