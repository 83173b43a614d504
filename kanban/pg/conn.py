"""PgStore's connection: one per store, made again when it broke, one verb at a time, its errors without the DSN."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads

from ..errors import BoardError
from .retry import ENDED_BY_SERVER
from .rules import load_jsonb


class Connection:
    """The store's connection and how it is made, locked and ended; PgStore's base."""

    _dsn: str
    dsn_env: str
    schema: str
    _lock: threading.RLock
    _conn: psycopg.Connection[Any] | None

    def _redact(self, text: str) -> str:
        return redact_dsn(text, self._dsn)

    def _error(self, exc: Exception, what: str) -> BoardError:
        return BoardError(f"the board database ({self.dsn_env}) failed to {what}: "
                          f"{self._redact(str(exc)).strip()[:500] or type(exc).__name__}")

    def _connect(self, *, listen: bool = False) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, row_factory=dict_row, connect_timeout=10,
                                   application_name="hermes-sup-listen" if listen else "hermes-sup")
        except Exception as exc:
            raise self._error(exc, "connect") from None
        set_json_loads(load_jsonb, conn)  # rows another host wrote may hold numbers no float holds
        conn.execute("SELECT set_config('search_path', %s, false)", (f'"{self.schema}"',))
        return conn

    @contextlib.contextmanager
    def _locked(self) -> Iterator[psycopg.Connection[Any]]:
        """The store's connection (reconnected if it broke), for one verb at a time."""
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                self._conn = self._connect()
            try:
                yield self._conn
            except psycopg.Error as exc:
                error = self._error(exc, "answer")
                error.sqlstate = exc.sqlstate
                error.ended_by_server = exc.sqlstate in ENDED_BY_SERVER
                raise error from None

    def _connection_lost(self) -> bool:
        conn = self._conn
        return conn is None or conn.closed or conn.broken

    def _disconnect(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def redact_dsn(text: str, dsn: str) -> str:
    """`text` without the DSN or any password in it (pure): a driver error may quote either."""
    secrets = [dsn]
    try:
        password = conninfo_to_dict(dsn).get("password")
        if password:
            secrets.append(str(password))
    except Exception:
        # Unparsable (open_store refuses such a DSN): no telling which part is the password, so
        # every word of it, and every value after an "=", goes.
        words = dsn.replace("'", " ").split()
        secrets += words + [word.split("=", 1)[1] for word in words if "=" in word]
    if "://" in dsn and "@" in dsn:
        secrets.append(dsn.split("://", 1)[1].rsplit("@", 1)[0])  # user:password of a URL
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text
