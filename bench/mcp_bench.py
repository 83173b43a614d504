"""What the agent's MCP plumbing adds to a call, by hand: `python bench/mcp_bench.py [--rounds N]`.

The same tool of the same server (mcp-server-time's get_current_time, over stdio, unconfined so only
the plumbing differs) called by the SDK's own ClientSession in one asyncio task, and through the
agent's Hub (agents/mcpservers.py: a call from the agent's thread onto the loop's thread, its result
made text), the two interleaved round by round. Reported: the median milliseconds of each and the
Hub's ratio to the SDK's in the same run; and a stdio server started confined (bubblewrap) against
unconfined, the median of its first tool list. Figures go to stdout and bench/results/mcp.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.agents.mcpservers import Hub  # noqa: E402
from hermes_sup.agents.terminal import clean_env, command_for  # noqa: E402

SERVER = str(Path(sys.executable).parent / "mcp-server-time")
ARGS = {"timezone": "UTC"}


def plain(name: str, spec: dict) -> tuple[list[str], dict[str, str]]:
    return [spec["command"]], clean_env(os.environ)


def confined(folder: Path):
    def command(name: str, spec: dict) -> tuple[list[str], dict[str, str]]:
        return command_for({"sandbox": "bubblewrap"}, ("shell",), folder / "ws", folder, folder, clean_env(os.environ),
                           [spec["command"]])
    return command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    hub = Hub({"time": {"command": SERVER}}, plain).start()
    hub.wait_ready(60)
    stop = threading.Event()
    sdk: list[float] = []
    ours: list[float] = []

    async def direct() -> None:
        async with stdio_client(StdioServerParameters(command=SERVER, env=clean_env(os.environ))) as (r, w), \
                ClientSession(r, w) as session:
            await session.initialize()
            for _ in range(args.rounds):
                started = time.perf_counter()
                await session.call_tool("get_current_time", ARGS)
                sdk.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await asyncio.to_thread(hub.call, "time", "get_current_time", ARGS, stop)
                ours.append((time.perf_counter() - started) * 1000)

    asyncio.run(direct())
    hub.close()
    starts: dict[str, list[float]] = {"unconfined": [], "bubblewrap": []}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.starts):
            for kind, command in (("unconfined", plain), ("bubblewrap", confined(Path(tmp)))):
                started = time.perf_counter()
                one = Hub({"time": {"command": SERVER}}, command).start()
                one.wait_ready(60)
                starts[kind].append((time.perf_counter() - started) * 1000)
                assert one.servers["time"].session is not None, one.servers["time"].error
                one.close()
    base = statistics.median(sdk)
    result = {"rounds": args.rounds, "sdk_ms": round(base, 3), "hub_ms": round(statistics.median(ours), 3),
              "hub_vs_sdk": round(statistics.median(ours) / base, 2),
              "start_unconfined_ms": round(statistics.median(starts["unconfined"]), 1),
              "start_bubblewrap_ms": round(statistics.median(starts["bubblewrap"]), 1)}
    print(f"a call, median over {args.rounds}: the SDK alone {result['sdk_ms']} ms, through the Hub "
          f"{result['hub_ms']} ms ({result['hub_vs_sdk']}x)")
    print(f"a server's start to its tool list, median of {args.starts}: unconfined {result['start_unconfined_ms']} ms, "
          f"under bubblewrap {result['start_bubblewrap_ms']} ms")
    out = ROOT / "bench" / "results" / "mcp.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
