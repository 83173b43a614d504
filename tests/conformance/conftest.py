"""Fixtures of the conformance suite: `backend` and `store` are parametrized by backend kind, and a
test marked `requires(CAPABILITY)` is skipped for a backend without that capability."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .backends import BACKENDS, Backend, Store, selected_kinds

WORKER = Path(__file__).resolve().parent / "worker.py"
ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(capability): run only on backends that have it (see backends.py)")


@pytest.fixture(params=selected_kinds())
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    chosen = BACKENDS[request.param]
    marker = request.node.get_closest_marker("requires")
    if marker is not None:
        missing = [cap for cap in marker.args if cap not in chosen.capabilities]
        if missing:
            pytest.skip(f"the {chosen.kind} backend has no {', '.join(missing)}")
    if chosen.prepare is not None:
        chosen.prepare(request, monkeypatch)
    return chosen


@pytest.fixture
def store(backend: Backend, tmp_path: Path) -> Iterator[Store]:
    opened = backend.build(tmp_path)
    yield opened
    opened.close()


class Workers:
    """Starts tests/conformance/worker.py processes; kills and reaps whatever is left at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        proc = subprocess.Popen([sys.executable, str(WORKER), *args], env=full_env, **kwargs)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def workers() -> Iterator[Workers]:
    started = Workers()
    yield started
    started.cleanup()
