"""What tracing costs an agent per model call, tool call and task attempt (median, on vs off, same run).

By hand: `python bench/telemetry_bench.py`.

The hooks the loop calls (agents/telemetry.py) are timed as the loop calls them, after each call's
record is written: off is the no-op object an unconfigured agent holds, on is the real SDK exporting
over OTLP/HTTP to a receiver in this process on 127.0.0.1 (its batches leave on the SDK's own
thread, so what the agent pays is building and ending the span). Rounds alternate on and off.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.agents import telemetry  # noqa: E402
from hermes_sup.agents.providers import Attempt  # noqa: E402
from hermes_sup.agents.translate import Completion, Usage  # noqa: E402

ROUNDS = 30
CALLS = 200  # per round and kind: a round's time over its calls is one sample


class Sink(BaseHTTPRequestHandler):
    received = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Sink.received += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def per_call(action: Any, count: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(count):
        action()
    return (time.perf_counter_ns() - started) / count / 1000  # microseconds


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    on = telemetry.Telemetry.from_settings({"otlp_endpoint": url}, {}, agent="bench", workspace="/bench")
    off = telemetry.Telemetry.from_settings(None, {}, agent="bench", workspace="/bench")
    record = {"provider": "p", "model": "m", "outcome": "ok", "tokens_in": 1200, "tokens_out": 80,
              "cost_usd": 0.0012, "latency_s": 0.8}
    attempt = Attempt("p", "m", "ok", 0.8, Completion({"role": "assistant", "content": "answer"}, "stop",
                                                      Usage(1200, 80), "m"))
    task = {"id": "bench-task", "title": "A task to measure", "claims": 1, "attempts": 1,
            "created_at": "2026-01-01T00:00:00Z"}
    samples: dict[tuple[str, str], list[float]] = {}
    for index in range(ROUNDS):
        for name, tracing in ((("on", on), ("off", off)) if index % 2 else (("off", off), ("on", on))):
            with tracing.task_span(task):
                samples.setdefault(("model call", name), []).append(
                    per_call(lambda t=tracing: t.model_call(record, attempt), CALLS))
                samples.setdefault(("tool call", name), []).append(
                    per_call(lambda t=tracing: t.tool_call("read_file", "call_1", "ok", 0.004), CALLS))

            def attempt_span(t: Any = tracing) -> None:
                with t.task_span(task):
                    pass

            samples.setdefault(("task attempt", name), []).append(per_call(attempt_span, CALLS // 4))
        # A round makes spans far faster than an agent does: let the batches leave before the next,
        # so what is measured is the agent's side, not a full queue's (dropped, and counted).
        on.provider.force_flush()  # type: ignore[attr-defined]
    on.close()
    server.shutdown()
    print(f"tracing cost per hook, median of {ROUNDS} rounds of {CALLS} calls (microseconds a call)")
    print(f"{'hook':<14}{'off':>10}{'on':>10}{'on - off':>12}")
    for kind in ("model call", "tool call", "task attempt"):
        off_us, on_us = statistics.median(samples[(kind, "off")]), statistics.median(samples[(kind, "on")])
        print(f"{kind:<14}{off_us:>10.2f}{on_us:>10.2f}{on_us - off_us:>12.2f}")
    print(f"spans exported: {on.exported}, dropped: {on.dropped} ({Sink.received} requests to the receiver)")


if __name__ == "__main__":
    main()
