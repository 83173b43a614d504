"""Fixtures of the conformance suite: `backend` and `store` are parametrized by backend kind, and a
test marked `requires(CAPABILITY)` is skipped for a backend without that capability."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import Spawner
from .backends import BACKENDS, Backend, Store, selected_kinds

WORKER = Path(__file__).resolve().parent / "worker.py"


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


class Workers(Spawner):
    """Starts tests/conformance/worker.py processes; kills and reaps whatever is left at teardown."""

    def __init__(self) -> None:
        super().__init__(WORKER)

    def start(self, *args: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen[bytes]:
        return self(*args, env=env, **kwargs)


@pytest.fixture
def workers() -> Iterator[Workers]:
    started = Workers()
    yield started
    started.cleanup()
