"""What the terminal's sandbox adds to a command, by hand: `python bench/sandbox_bench.py [--rounds N]`.

The same `terminal` call (`true`, then a short pipeline) through the tool, under `sandbox: none`,
`bubblewrap` and `landlock`, the modes interleaved round by round so that the machine's load falls on
each alike; reported: the median milliseconds of each and its ratio to `none` in the same run.
Figures go to stdout and bench/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hermes_sup.agents import builtins, sandbox  # noqa: E402, F401 - registers the built-in tools
from hermes_sup.agents.tools import Toolbox, ToolContext  # noqa: E402

MODES = ("none", "bubblewrap", "landlock")
COMMANDS = {"true": "true", "pipeline": "ls / | sort | head -3 > listing.txt && wc -l < listing.txt"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    modes = [m for m in MODES if m == "none" or _available(m)]
    box = Toolbox(grants=("shell",))
    times: dict[tuple[str, str], list[float]] = {(m, c): [] for m in modes for c in COMMANDS}
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        task = ws / "runs" / "tasks" / "t" / "work"
        task.mkdir(parents=True)
        contexts = {m: ToolContext(scratch=task, stop=threading.Event(), settings={"sandbox": m}, grants=("shell",),
                                   workspace=ws) for m in modes}
        for _ in range(args.rounds):
            for name, command in COMMANDS.items():
                for mode in modes:
                    started = time.perf_counter()
                    box.call(contexts[mode], "terminal", {"command": command})
                    times[(mode, name)].append((time.perf_counter() - started) * 1000)
    rows = {}
    print(f"terminal call, median ms over {args.rounds} rounds (ratio to sandbox: none)")
    print("| command | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for name in COMMANDS:
        base = statistics.median(times[("none", name)])
        cells = []
        for mode in modes:
            median = statistics.median(times[(mode, name)])
            rows[f"{name}/{mode}"] = {"median_ms": round(median, 2), "ratio": round(median / base, 2)}
            cells.append(f"{median:.1f} ({median / base:.1f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    out = ROOT / "bench" / "results" / "sandbox.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "results": rows}, indent=1) + "\n")
    return 0


def _available(mode: str) -> bool:
    try:
        return sandbox.how(mode)[0] == mode
    except sandbox.SandboxRefused as exc:
        print(f"{mode}: left out: {exc}", file=sys.stderr)
        return False


if __name__ == "__main__":
    sys.exit(main())
