"""Agent runtime benchmarks, run by hand: `python bench/runtime_bench.py`.

1. Cold start: spawn `python -m hermes_sup.agents run` to its first heartbeat (READY on the notify socket),
   with an openai provider, an anthropic provider, or none configured (20 runs each).
2. Loop overhead per turn: a 10-turn task against the scripted server on 127.0.0.1 (real openai
   SDK), minus the time the server spent answering, per turn.
3. Prompt stability: over that task, the share of each request's input (tools, then messages)
   that repeats the previous request byte for byte from the start: what a prefix cache reuses.
4. Shared across agents: two agents of one entry, one of which has saved a memory entry, each starts
   a task; their first prompts rendered as a Hermes/Qwen2.5 chat template puts them together (the
   system message, then the tool definitions, then the rest), and how much of them is the same from
   the start, in tokens (characters / 4): what a server's prefix cache shares between them.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.agents import builtins  # noqa: E402, F401 - registers the built-in tools
from hermes_sup.agents.loop import Brief, Models, TaskLoop, Workplace  # noqa: E402
from hermes_sup.agents.memory import Memories  # noqa: E402
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig  # noqa: E402
from hermes_sup.agents.tools import Toolbox, ToolContext  # noqa: E402

from tests.llm_server import ScriptedLLM, openai_reply  # noqa: E402

PROVIDERS = {
    "none": {},
    "openai": {"providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}},
               "tiers": {"standard": ["p"], "cheap": ["p"]}},
    "anthropic": {"providers": {"p": {"kind": "anthropic", "model": "c", "api_key_env": "BENCH_FAKE_KEY"}},
                  "tiers": {"standard": ["p"], "cheap": ["p"]}},
}


def cold_start(kind: str, runs: int, base: Path) -> list[float]:
    from hermes_sup.kanban import Board

    Board(base / "kanban").close()
    times = []
    for index in range(runs):
        sock_path = base / f"n{kind}{index}.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.bind(str(sock_path))
        server.settimeout(10)
        workdir = base / f"agent-{kind}-{index}"
        workdir.mkdir()
        config = {"name": "bench", "heartbeat_timeout": 60, "llm": PROVIDERS[kind], "tier": "standard"}
        env = {**os.environ, "HERMES_SUP_AGENT": json.dumps(config), "HERMES_SUP_WORKSPACE": str(base),
               "HERMES_SUP_NOTIFY": str(sock_path), "BENCH_FAKE_KEY": "x"}
        for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"):
            env.pop(key, None)
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents", "run"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                if b"READY=1" in server.recv(4096):
                    times.append(time.perf_counter() - started)
                    break
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            server.close()
    return times


def loop_overhead(turns: int, base: Path) -> tuple[list[float], float]:
    with ScriptedLLM() as llm:
        # Distinct calls: ten identical calls with identical results would (rightly) be stopped as stuck.
        replies = [openai_reply(tool_calls=[("wait", {"seconds": i / 1e6})], prompt=100 + 40 * i)
                   for i in range(turns - 1)]
        llm.script("openai", *replies, openai_reply("done"))
        scratch = base / "loop" / "scratch"
        scratch.mkdir(parents=True)
        ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=Memories(base / "loop"))
        provider = OpenAIProvider(ProviderConfig(name="s", kind="openai", model="m", base_url=f"{llm.url}/v1"))
        provider._connect()  # the SDK import is start-up, not a turn
        loop = TaskLoop({"id": "bench", "title": "ten turns"}, ctx, Toolbox(), Models([provider]),
                        Workplace(base / "loop"))
        original = llm.httpd.RequestHandlerClass.do_POST
        server_time: list[float] = []

        def timed(handler):
            start = time.perf_counter()
            original(handler)
            server_time.append(time.perf_counter() - start)

        llm.httpd.RequestHandlerClass.do_POST = timed
        started = time.perf_counter()
        outcome = loop.run()
        total = time.perf_counter() - started
        assert outcome.kind == "done", outcome
        per_turn = (total - sum(server_time)) / turns
        # In the order providers put a prompt together (tools, then the messages from the system
        # prompt on), which is what their prefix caches match.
        bodies = [json.dumps(r["body"].get("tools")) + json.dumps(r["body"]["messages"]) for r in llm.requests]
    shares, reused, total = [], 0, 0
    for previous, current in itertools.pairwise(bodies):
        prefix = os.path.commonprefix([previous, current])  # noqa: RUF071 - a byte prefix is what caches reuse
        shares.append(len(prefix) / len(current))
        reused, total = reused + len(prefix), total + len(current)
    return [*shares, reused / total], per_turn


def rendered(body: dict) -> str:
    """A request as a Hermes/Qwen2.5 chat template renders it: the system message, the tools right
    after it, then the other messages."""
    system, *rest = body["messages"]
    return (f"<|im_start|>system\n{system['content']}\n\n# Tools\n{json.dumps(body.get('tools'))}<|im_end|>\n"
            + "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in rest))


def shared_across_agents(base: Path) -> tuple[int, int]:
    """Tokens (characters / 4) two agents' first prompts share from the start, and of the second's."""
    with ScriptedLLM() as llm:
        llm.script("openai", openai_reply("a"), openai_reply("b"))
        for name, memory in (("worker-1", None), ("worker-2", "The user prefers short answers in French.")):
            scratch = base / name / "scratch"
            scratch.mkdir(parents=True)
            ctx = ToolContext(scratch=scratch, stop=threading.Event(), memory=Memories(base / name))
            if memory:
                ctx.memory.change("add", content=memory)
            provider = OpenAIProvider(ProviderConfig(name="s", kind="openai", model="m", base_url=f"{llm.url}/v1"))
            TaskLoop({"id": f"t-{name}", "title": f"A task for {name}"}, ctx, Toolbox(), Models([provider]),
                     Workplace(base / name, name), brief=Brief("You are a worker.")).run()
        first, second = (rendered(request["body"]) for request in llm.requests)
    return len(os.path.commonprefix([first, second])) // 4, len(second) // 4  # noqa: RUF071 - bytes, as caches


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="hermes-rtbench-"))
    report: dict[str, object] = {"when": time.strftime("%Y-%m-%d %H:%M:%S")}
    for kind in PROVIDERS:
        times = cold_start(kind, 20, base)
        report[f"cold_start_{kind}_ms"] = {"median": 1000 * statistics.median(times), "max": 1000 * max(times)}
        print(f"cold start to first heartbeat, provider {kind}: median {1000 * statistics.median(times):.0f} ms "
              f"(max {1000 * max(times):.0f} ms, 20 runs)")
    overheads = []
    for _round in range(5):
        shares, per_turn = loop_overhead(10, base / f"r{_round}")
        overheads.append(per_turn)
    report["loop_overhead_ms_per_turn"] = 1000 * statistics.median(overheads)
    overall, shares = shares[-1], shares[:-1]
    report["stable_prefix_share"] = {"overall": overall, "median": statistics.median(shares), "min": min(shares)}
    print(f"loop overhead per turn, server time excluded: median {1000 * statistics.median(overheads):.2f} ms "
          f"over 5 runs of a 10-turn task")
    print(f"input that repeats the previous request from its start: {overall:.1%} over turns 2 to 10 "
          f"(per turn: median {statistics.median(shares):.1%}, lowest {min(shares):.1%})")
    shared, whole = shared_across_agents(base / "shared")
    report["shared_prefix_two_agents_tokens"] = {"shared": shared, "of": whole}
    print(f"two agents of one entry, one with a memory entry: their first prompts share {shared:,} of {whole:,} "
          f"tokens from the start ({shared / whole:.0%})")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"runtime-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
