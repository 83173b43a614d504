"""A blocking call (a model's answer) run so that a stop request need not wait for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def interruptible(call: Callable[[], T], stop: threading.Event, poll: float = 0.1,
                  on_stop: Callable[[], None] = lambda: None) -> T:
    """Run `call` on a daemon thread and wait for it or for `stop`, whichever comes first.

    A model call can take minutes, longer than the supervisor's stop_timeout; a stop request
    should not wait for it, and need not: its answer is not yet in the transcript, so the resumed
    task simply asks again. `on_stop` cuts the call's request (a model must not go on generating
    for a cancelled task); the abandoned thread then ends, or dies with the process."""
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the waiting thread as it is
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=target, name="llm-call", daemon=True).start()
    while not finished.wait(poll):
        if stop.is_set():
            on_stop()
            raise InterruptedError
    if "error" in box:
        raise box["error"]
    return box["value"]
