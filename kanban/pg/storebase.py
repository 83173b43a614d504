"""What PgStore's mixins (claims.py, journalrows.py, hosts.py, stream.py, ids.py) use of the store
they are mixed into: its settings and state, set in PgStore.__init__, and the methods one part calls
on another. Declarations only, for the type checker: at run time the class holds nothing of its own,
and PgStore's bases resolve as before (the mixins, then the connection)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..watch import ChangeSignal
from .conn import Connection

if TYPE_CHECKING:
    import psycopg

    from ..errors import ClaimLost
    from .listen import Listener
    from .rules import TaskDoc


class StoreBase(Connection):
    """The store as its mixins see it; PgStore is all of it."""

    host: str
    boot_id: str
    lease: float
    host_timeout: float
    channel: str
    signal: ChangeSignal
    problems: list[str]
    _watching: bool
    _heartbeat: threading.Thread | None
    _agents: Callable[[], list[dict[str, Any]]] | None
    _closing: threading.Event
    _last_recover: float
    _unjournaled: tuple[str, int] | None  # the last claim's (task, token), when the task had no journal row
    _done_in_tx: tuple[object, set[str]]  # a transaction's cursor and what ClaimsMixin._once did in it

    if TYPE_CHECKING:  # defined by PgStore (store.py) and ClaimsMixin (claims.py)
        def _tx(self) -> contextlib.AbstractContextManager[psycopg.Cursor[Any]]: ...

        def _one(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]: ...

        def listener(self) -> Listener: ...

        def _set_aside(self, cur: psycopg.Cursor[Any], row: dict[str, Any], by: str, note: str) -> None: ...

        def _lost(self, cur: psycopg.Cursor[Any], task_id: str, token: int) -> ClaimLost: ...

        def _write(self, cur: psycopg.Cursor[Any], new: TaskDoc, *, outcome_token: int | None) -> TaskDoc: ...
