"""A claimer process for the PostgreSQL board tests: claims and completes tasks until the board has
none left, then prints the ids it completed as JSON. The DSN comes from HERMES_SUP_TEST_PG_DSN.

usage: pg_worker.py SCHEMA HOST AGENT
"""

from __future__ import annotations

import json
import os
import sys

from hermes_sup.kanban.errors import ClaimLost
from hermes_sup.kanban.pg.store import PgStore


def main() -> None:
    schema, host, agent = sys.argv[1:4]
    done: list[str] = []
    lost: list[str] = []
    with PgStore(os.environ["HERMES_SUP_TEST_PG_DSN"], schema=schema, host=host, boot_id="boot-1",
                 migrate_schema=False) as store:
        while True:
            doc = store.claim(agent)
            if doc is None:
                counts = store.counts()
                if counts["todo"] == 0 and counts["doing"] == 0:
                    break
                store.listener().wait(store.listener().generation, 0.05)
                continue
            try:
                store.complete(doc["id"], doc["claim"]["token"], result={"by": agent, "host": host})
                done.append(doc["id"])
            except ClaimLost:
                lost.append(doc["id"])
    print(json.dumps({"done": done, "lost": lost}))


if __name__ == "__main__":
    main()
