"""What the terminal's sandbox adds to a command, by hand: `python bench/sandbox_bench.py [--rounds N]`.

The same `terminal` call (`true`, then a short pipeline) through the tool, under `sandbox: none`,
`bubblewrap` and `landlock`, and the same skill call (the bundled `json_query`, which runs in a
process of its own under each mode) beside that tool's function called in this process, the modes
interleaved round by round so that the machine's load falls on each alike; reported: the median
milliseconds of each and its ratio to `none` in the same run.
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
from hermes_sup.agents.skills import BUNDLED, Skills  # noqa: E402
from hermes_sup.agents.tools import Toolbox, ToolContext, collecting  # noqa: E402

MODES = ("none", "bubblewrap", "landlock")
COMMANDS = {"true": "true", "pipeline": "ls / | sort | head -3 > listing.txt && wc -l < listing.txt"}
SKILL_CALL = ("json_query", {"path": "data.json", "query": "a.b"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    modes = [m for m in MODES if m == "none" or _available(m)]
    box = Toolbox(grants=("shell",))
    names = [*COMMANDS, "skill"]
    times: dict[tuple[str, str], list[float]] = {(m, c): [] for m in modes for c in names}
    in_process: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        task = ws / "runs" / "tasks" / "t" / "work"
        task.mkdir(parents=True)
        (task / "data.json").write_text('{"a": {"b": [1, 2, 3]}}')
        contexts = {m: ToolContext(scratch=task, stop=threading.Event(), settings={"sandbox": m}, grants=("shell",),
                                   workspace=ws) for m in modes}
        skills = Toolbox(grants=("fs.read",), extra=Skills(ws).tools_for({"data_tools"})[0])
        with collecting() as found:  # the same tool's function, called here: what a call cost before
            exec(compile((BUNDLED / "data_tools.py").read_text(), "data_tools.py", "exec"), {"__name__": "data_tools"})
        direct = Toolbox(grants=("fs.read",), extra={tool.name: tool for tool in found})
        for _ in range(args.rounds):
            for name in names:
                for mode in modes:
                    started = time.perf_counter()
                    if name == "skill":
                        skills.call(contexts[mode], *SKILL_CALL)
                    else:
                        box.call(contexts[mode], "terminal", {"command": COMMANDS[name]})
                    times[(mode, name)].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            direct.call(contexts["none"], *SKILL_CALL)
            in_process.append((time.perf_counter() - started) * 1000)
    rows = {}
    print(f"terminal call and skill call, median ms over {args.rounds} rounds (ratio to sandbox: none)")
    print("| command | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for name in names:
        base = statistics.median(times[("none", name)])
        cells = []
        for mode in modes:
            median = statistics.median(times[(mode, name)])
            rows[f"{name}/{mode}"] = {"median_ms": round(median, 2), "ratio": round(median / base, 2)}
            cells.append(f"{median:.1f} ({median / base:.1f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    rows["skill/in-process"] = {"median_ms": round(statistics.median(in_process), 3)}
    print(f"the skill's function called in the agent's process (before): {statistics.median(in_process):.2f} ms")
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
