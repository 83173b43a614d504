"""A PgStore verb run a second time when the server had ended its connection before it ran (a
restart, a terminated backend): nothing was done, so running it again on a new connection is safe.
Shared by the store and its mixins (kanban/pg/store.py, ids.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import BoardError

_T = TypeVar("_T")

# The server ended the connection before running the statement: the store's _locked marks the
# BoardError it raises with `ended_by_server` for these SQLSTATEs.
ENDED_BY_SERVER = frozenset({"57P01", "57P02", "57P03"})


def again(method: Callable[..., _T]) -> Callable[..., _T]:
    """The verb, run a second time if the server had ended the connection before it ran."""
    @functools.wraps(method)
    def verb(self: Any, *args: Any, **kwargs: Any) -> _T:
        try:
            return method(self, *args, **kwargs)
        except BoardError as exc:
            if not getattr(exc, "ended_by_server", False):
                raise
        return method(self, *args, **kwargs)
    return verb
