"""One call of a skill's tool in a process of its own, confined as a terminal command is (the child
side of agents/skillproc.py).

The request is one JSON line on stdin: the skill's source (the bytes its check vouched for), the
tool's name, the arguments and what the handler may use of its context. The answers are JSON lines
on the stdout this process keeps to itself (the skill's own prints go to stderr): `{"llm": [tier,
prompt]}` asks the agent for a model call and reads `{"answer": text}` or `{"error": text}` back on
stdin; the last line is the outcome, `{"result": value}`, `{"error": text, "kind": "tool" | "raised"
| "interrupted"}`. SIGTERM is the agent's stop: the handler's `ctx.stop` is set.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

CPU_SECONDS = 600  # a hard limit: a tool that spins is ended however its wall time is spent


class _Channel:
    """The private stdout and the stdin of this process, one JSON line each way."""

    def __init__(self, out: IO[str], into: IO[str]) -> None:
        self.out, self.into, self.lock = out, into, threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.out.write(json.dumps(message, default=str, ensure_ascii=False) + "\n")
            self.out.flush()

    def ask_model(self, tier: str, prompt: str) -> str:
        from .tools import ToolError

        with self.lock:
            self.out.write(json.dumps({"llm": [str(tier), str(prompt)]}, ensure_ascii=False) + "\n")
            self.out.flush()
            line = self.into.readline()
        try:
            reply = json.loads(line)
        except ValueError:
            reply = {"error": "the agent gave no answer"}
        if not isinstance(reply, dict) or not isinstance(reply.get("answer"), str):
            raise ToolError(str(reply.get("error") if isinstance(reply, dict) else "") or "no answer from the model")
        return reply["answer"]


def outcome(request: dict[str, Any], channel: _Channel, stop: threading.Event) -> dict[str, Any]:
    """Run the request's tool; what it gave or how it failed, as the last line says it."""
    from . import tools
    from .tools import Finished, NeedsPerson, ToolContext, ToolError

    path = str(request["file"])
    namespace: dict[str, Any] = {"__name__": f"hermes_skill_{Path(path).stem}", "__file__": path}
    with tools.collecting() as found:
        exec(compile(request["source"], path, "exec"), namespace)
    tool = next((t for t in found if t.name == request["tool"]), None)
    if tool is None:
        return {"error": f"the skill no longer registers {request['tool']}", "kind": "tool"}
    given = request.get("ctx") or {}
    ctx = ToolContext(scratch=Path(given["scratch"]), stop=stop, agent=str(given.get("agent") or ""),
                      task=given.get("task"), settings=given.get("settings") or {},
                      grants=tuple(given.get("grants") or ()),
                      workspace=Path(given["workspace"]) if given.get("workspace") else None,
                      llm=channel.ask_model if given.get("llm") else None)
    try:
        return {"result": tool.handler(ctx, request.get("args") or {})}
    except InterruptedError:
        return {"error": "stopped", "kind": "interrupted"}
    except (NeedsPerson, Finished) as exc:  # the agent's own verbs: a skill has no business with them
        return {"error": f"{type(exc).__name__} is not a skill's to raise", "kind": "tool"}
    except ToolError as exc:
        return {"error": str(exc), "kind": "tool"}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "kind": "raised"}


def main() -> int:
    private = os.dup(1)
    os.dup2(2, 1)  # the skill's prints must not be taken for answers
    sys.stdout = sys.stderr
    channel = _Channel(os.fdopen(private, "w", encoding="utf-8"), sys.stdin)
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        request = json.loads(sys.stdin.readline())
        answer = outcome(request, channel, stop)
    except BaseException as exc:  # the skill's import failed here, or it exited: said, never a traceback up
        where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        line = f" (line {where[0].lineno})" if where else ""
        answer = {"error": f"{type(exc).__name__}: {exc}{line}", "kind": "raised"}
    try:
        json.dumps(answer, default=str)
    except (TypeError, ValueError):  # a result that refers to itself
        answer = {"result": str(answer.get("result"))}
    channel.send(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
