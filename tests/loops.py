"""A TaskLoop made from options given by name, as the tests give them: each to the part it belongs to."""

from __future__ import annotations

import dataclasses
from typing import Any

from hermes_sup.agents.loop import Brief, Limits, Models, TaskLoop, Workplace


def task_loop(*, task: dict[str, Any], ctx: Any, toolbox: Any, **options: Any) -> TaskLoop:
    parts = {}
    for part in (Models, Brief, Limits, Workplace):
        parts[part] = {f.name: options.pop(f.name) for f in dataclasses.fields(part) if f.name in options}
    if options:
        raise TypeError(f"no part of a TaskLoop takes {sorted(options)}")
    return TaskLoop(task, ctx, toolbox, Models(**parts[Models]), Workplace(**parts[Workplace]),
                    brief=Brief(**parts[Brief]), limits=Limits(**parts[Limits]))
