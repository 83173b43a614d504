"""The board in PostgreSQL, shared by the hosts of a team (CONTRACT section 9).

`open_store(config)` is the backend factory's entry: it reads the DSN from the environment
variable the config names (never from the config itself, never printed), applies the schema's
migrations and returns a `PgStore`. Modules: `schema` (tables, migrations), `sql` (the statements),
`rules` (pure row/document rules), `listen` (LISTEN wake-ups), `drops` (the host's inbox/ folders),
`journal` (a task's journal as rows of the database), `stream` (the event stream, watching, health),
`ids` (the task ids a prefix is resolved against), `retry` (a verb run again after a restart), `bulk`
(a migration's copy), `conn` (the store's connection), `claims` (claims and the holder's verbs),
`journalrows` (the journal verbs), `hosts` (heartbeats and recovery) and `store` (the other verbs,
and PgStore assembled).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..backends import BoardConfigError, register
from ..errors import BoardError

# Said wherever the board is asked of an installation without the postgres extra.
NEEDS_PSYCOPG = "the PostgreSQL board needs psycopg 3: pip install 'psycopg[binary]>=3.1' (the postgres extra)"

if TYPE_CHECKING:
    from .store import PgStore

DEFAULT_DSN_ENV = "HERMES_SUP_PG_DSN"
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This machine's boot: processes of an earlier boot of a host are all gone."""
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return "unknown-boot"


def dsn_not_set(dsn_env: str, remedy: str = "put the connection string (DSN) in that environment variable, never in "
                "hermes.yaml", *, on_board: bool = True) -> str:
    """What to say when the DSN's environment variable `dsn_env` is unset or empty (pure): the board,
    the budget ledger and `migrate` say it in one wording, each with its own `remedy`."""
    where = "the board is on PostgreSQL, but " if on_board else ""
    return f"{where}${dsn_env} is not set: {remedy}"


def check_dsn(dsn: str, dsn_env: str) -> None:
    """Refuse a connection string that does not parse, with a message of our own: the parser's
    quotes the part it could not read, which may be the password (`password=half pw-...`)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise BoardConfigError(NEEDS_PSYCOPG) from None
    try:
        conninfo_to_dict(dsn)
    except Exception:
        raise BoardConfigError(f"${dsn_env} does not hold a valid PostgreSQL connection string (the parser's "
                               "message is not shown: it would quote it)") from None


def open_store(config: Mapping[str, Any], *, host: str | None = None, environ: Mapping[str, str] | None = None,
               drop_root: str | os.PathLike[str] | None = None) -> PgStore:
    """A PgStore from the `board:` section of hermes.yaml: dsn_env (default HERMES_SUP_PG_DSN),
    and optionally schema, lease, host_timeout; `host` is the team's `host:` (default: the hostname);
    `drop_root` is this host's kanban folder, whose inbox/ `ingest` takes drops from."""
    environ = os.environ if environ is None else environ
    dsn_env = config.get("dsn_env") or DEFAULT_DSN_ENV
    if not isinstance(dsn_env, str):
        raise BoardConfigError("board.dsn_env must be the name of an environment variable")
    dsn = environ.get(dsn_env)
    if not dsn:
        raise BoardConfigError(dsn_not_set(dsn_env))
    check_dsn(dsn, dsn_env)
    try:
        from .store import PgStore
    except ImportError:
        raise BoardConfigError(NEEDS_PSYCOPG) from None
    try:
        return PgStore(dsn, dsn_env=f"${dsn_env}", schema=config.get("schema") or "hermes_sup",
                       host=host or socket.gethostname(), boot_id=str(config.get("boot_id") or boot_id()),
                       lease=float(config.get("lease", 60.0)), host_timeout=float(config.get("host_timeout", 30.0)),
                       drop_root=drop_root)
    except ValueError as exc:
        raise BoardError(f"board: {exc}") from None


def _open(folder: Path, section: Mapping[str, Any], *, lock_timeout: float, host: str | None) -> PgStore:
    """The factory's opener (kanban.backends): `folder` is this host's kanban/ (its inbox/ drops
    land on the shared board). `lock_timeout` is the file board's; row locks need none."""
    return open_store(section, host=host, drop_root=folder)


register("postgres", _open)

__all__ = ["DEFAULT_DSN_ENV", "boot_id", "check_dsn", "dsn_not_set", "open_store"]
