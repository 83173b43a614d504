"""uvicorn's h11 protocol with a deadline for each request to arrive whole, so slow clients cannot hold the dashboard.

uvicorn times a connection out only while it is idle after a response, and any byte received cancels
that: a client that opens connections and sends a request a byte at a time (slowloris) would hold
each one, and a descriptor, for ever. Here each request, its headers and body, must arrive within
REQUEST_TIMEOUT of the connection being opened or of the previous response ending; a deadline, not
an idle time, so a drip of bytes does not extend it. Once a request is in, the application's answer
(an event stream, say) takes as long as it takes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

REQUEST_TIMEOUT = 10.0  # seconds for a request's headers and body to arrive
KEEP_ALIVE = 5  # seconds an idle connection is kept after a response (uvicorn's default, named here)
MAX_CONNECTIONS = 200  # beyond, uvicorn answers 503 at once (page streams are capped lower, in app.py)
MAX_HEADER_BYTES = 64 << 10  # h11's bound on a request's head (and any incomplete event)


class DeadlineH11Protocol(H11Protocol):
    request_timeout = REQUEST_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._request_deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None

    def _too_slow(self) -> None:
        self._request_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the request is in (or the connection is ending): no more to wait for

    def on_response_complete(self) -> None:
        self._arm()  # the next request on this connection gets a deadline of its own
        super().on_response_complete()
        if self.transport.is_closing():
            self._disarm()


def server_options() -> dict[str, Any]:
    """The uvicorn.Config options that bound what slow or many clients can hold."""
    return {"http": DeadlineH11Protocol, "timeout_keep_alive": KEEP_ALIVE, "limit_concurrency": MAX_CONNECTIONS,
            "h11_max_incomplete_event_size": MAX_HEADER_BYTES}
