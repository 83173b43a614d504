"""The dashboard's picture: one built and serialized per change for every stream client, a slow client
given only the newest, and each column's cards cut to the page's limit with its count whole (its
streams pulled by hand on a real board, its API over HTTP, its page in a real Chromium)."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import find_workspace
from hermes_sup.supervisor.dashboard.app import Dashboard, Server, Settings

from .conftest import wait_until
from .test_dashboard import Stream, browser, card_in, init, served  # noqa: F401 (fixtures)

PULL = 30.0  # seconds a stream may take to give its next chunk before the test fails


class Client:
    """One client of the hub's stream, pulled by the test: between two pulls it is a client whose
    connection takes nothing (a slow one), for as long as the test likes."""

    def __init__(self, stream: AsyncIterator[bytes]) -> None:
        self.stream = stream

    async def frame(self) -> tuple[dict[str, str], list[bytes]]:
        """The next frame with an event, and the very chunks it came in (each frame ends a chunk)."""
        while True:
            chunks: list[bytes] = []
            while not chunks or not chunks[-1].endswith(b"\n\n"):
                chunks.append(await asyncio.wait_for(self.stream.__anext__(), PULL))
            fields = dict(line.split(": ", 1) for line in b"".join(chunks).decode().split("\n")
                          if line and not line.startswith(":") and ": " in line)
            if "event" in fields:
                return fields, chunks

    async def snapshot(self, wanted: Callable[[dict[str, Any]], bool] = lambda picture: True,
                       ) -> tuple[list[dict[str, str]], bytes]:
        """Frames up to the first picture `wanted` accepts (that one last), and the largest chunk
        of that picture's frame: the one holding its JSON."""
        frames = []
        while True:
            fields, chunks = await self.frame()
            frames.append(fields)
            if fields["event"] == "snapshot" and wanted(json.loads(fields["data"])):
                return frames, max(chunks, key=len)

    async def close(self) -> None:
        await self.stream.aclose()  # type: ignore[attr-defined]


def todo(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda picture: picture["board"]["counts"]["todo"] == count


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    """The dashboard's state over a fresh workspace, its streams driven without a server."""
    dash = Dashboard(find_workspace(init(tmp_path / "ws")), Settings(port=0))
    yield dash
    dash.board.close()
    dash.spend.close()


def counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """How many times `owner.name` is called from now on (it still does its work)."""
    calls = [0]
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_stream_clients_share_one_picture_built_and_serialized_once(dashboard: Dashboard,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client serialized its own copy of the picture and looked at the picture's key itself:
    with 20 clients on a board of 3,000 tasks the server grew by hundreds of MB."""
    hub = dashboard.hub
    keys = counting(monkeypatch, hub, "_key")
    count = 8

    async def run() -> None:
        clients = [Client(hub.stream(None)) for _ in range(count)]
        try:
            first = [(await client.snapshot())[1] for client in clients]
            assert hub.builds == 1
            assert all(data is first[0] for data in first), "one serialized picture, the same bytes for every client"
            assert keys[0] <= 2, f"the key looked at {keys[0]} times for {count} clients: once per look, not per client"
            with Board(dashboard.ws.root / "kanban") as board:
                await asyncio.to_thread(board.add, {"id": "one", "title": "One", "role": "nobody"}, by="cli")
            second = [(await client.snapshot(todo(1)))[1] for client in clients]
            assert all(data is second[0] for data in second)
            assert hub.builds in (2, 3)  # as many builds as changes seen (see test_dashboard), whatever the clients
        finally:
            for client in clients:
                await client.close()

    asyncio.run(run())
    assert hub.clients == 0


def test_a_slow_client_gets_only_the_newest_picture(dashboard: Dashboard) -> None:
    """A client that takes nothing while the board moves five times is given, once it reads again,
    every event it missed and then the newest picture alone: none of those in between was kept
    for it, and the one it gets is the one the others got."""
    hub = dashboard.hub

    async def run() -> None:
        fast, slow = Client(hub.stream(None)), Client(hub.stream(None))
        try:
            await fast.snapshot()
            await slow.snapshot()
            with Board(dashboard.ws.root / "kanban") as board:
                for number in range(5):
                    await asyncio.to_thread(board.add, {"id": f"t{number}", "title": "T", "role": "nobody"}, by="cli")
                    _frames, newest = await fast.snapshot(todo(number + 1))  # the others' picture moved on
            frames, data = await slow.snapshot()
            assert [json.loads(f["data"])["task"] for f in frames if f["event"] == "event"] == \
                [f"t{number}" for number in range(5)]
            assert [f["event"] for f in frames].count("snapshot") == 1
            assert json.loads(frames[-1]["data"])["board"]["counts"]["todo"] == 5, "the newest picture"
            assert data is newest, "the very picture the fast client got: nothing was built or kept for the slow one"
        finally:
            await fast.close()
            await slow.close()

    asyncio.run(run())


def get_json(port: int, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_each_column_ships_its_first_cards_and_counts_them_all(served: tuple[Path, Server],  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a board with more tasks than a column shows, each column ships COLUMN_LIMIT cards, the
    next to move in todo (claim order) and the newest finished in done, with the column's whole
    count; the picture reads the board's listing fields, not every task whole."""
    ws, server = served
    limit = 100  # the documented default
    with Board(ws / "kanban") as board:
        for number in range(limit + 30):
            board.add({"id": f"todo-{number:03}", "title": "Waiting", "role": "nobody", "priority": number % 3},
                      by="cli")
        for number in range(limit + 10):
            board.add({"id": f"done-{number:03}", "title": "Finished", "role": "nobody"}, by="cli")
            board.move(f"done-{number:03}", "done", by="cli")
        claim_order = [doc["id"] for doc in board.list("todo").tasks]
    whole = counting(monkeypatch, server.dashboard.board, "list")
    status, picture = get_json(server.port, "/api/snapshot")
    assert status == 200
    columns, counts = picture["board"]["columns"], picture["board"]["counts"]
    assert counts["todo"] == limit + 30 and counts["done"] == limit + 10
    assert [item["id"] for item in columns["todo"]] == claim_order[:limit]
    assert [item["id"] for item in columns["done"]] == [f"done-{n:03}" for n in range(limit + 9, 9, -1)]
    assert all(item["waiting"] for item in columns["todo"])  # why each shipped card waits ("no agent has role")
    assert whole[0] == 0, "the picture is built from list_fields"
    stream = Stream(server.port)
    try:
        shipped = json.loads(stream.until(lambda f: f["event"] == "snapshot")[-1]["data"])["board"]
    finally:
        stream.close()
    assert [len(shipped["columns"][s]) for s in ("todo", "done")] == [limit, limit]
    assert shipped["counts"] == counts


def test_the_picture_reads_the_other_hosts_once(dashboard: Dashboard, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture's key read the hosts' heartbeats, then its build read them all again."""
    reads = counting(monkeypatch, dashboard.board, "host_agents")
    dashboard.hub.picture()
    assert dashboard.hub.builds == 1 and reads[0] == 1


def test_the_page_shows_each_columns_count_and_a_drawer_past_the_limit(browser, tmp_path: Path) -> None:  # noqa: F811
    """Each column says how many of its cards it shows; a drawer open on a task that leaves the
    shipped cards still follows it (it reads the task by its id)."""
    from playwright.sync_api import expect

    ws = init(tmp_path / "ws")
    server = Server(find_workspace(ws), Settings(host="127.0.0.1", port=0, column_limit=2))
    server.start_thread()
    context = browser.new_context()
    try:
        wait_until(lambda: server.server.started, timeout=30)
        with Board(ws / "kanban") as board:
            for number in range(3):
                board.add({"id": f"t{number}", "title": f"Task {number}", "role": "nobody"}, by="cli")
            for name in ("b1", "b2"):  # blocked, and before t0 in claim order (a higher priority)
                board.add({"id": name, "title": name, "role": "nobody", "priority": 5}, by="cli")
                board.move(name, "blocked", by="cli")
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"http://127.0.0.1:{server.port}/")
            todo_column = page.locator("#board .column[data-status='todo']")
            expect(todo_column.locator(".card")).to_have_count(2, timeout=30_000)
            expect(todo_column.locator(".more")).to_have_text("showing 2 of 3")
            expect(page.locator("#board .column[data-status='done'] .more")).to_have_count(0)
            card_in(page, "todo", "t0").click()
            expect(page.locator("#d-id")).to_have_text("t0", timeout=30_000)
            for name in ("hi1", "hi2"):  # t0 falls out of the cards todo ships
                board.add({"id": name, "title": name, "role": "nobody", "priority": 9}, by="cli")
            expect(card_in(page, "todo", "hi2")).to_be_visible(timeout=30_000)
            expect(card_in(page, "todo", "t0")).to_have_count(0)
            expect(todo_column.locator(".more")).to_have_text("showing 2 of 5")
            board.move("t0", "blocked", by="cli")  # an event of the open task: the drawer reads it again
            expect(page.locator("#d-status")).to_have_text("blocked", timeout=30_000)
            expect(page.locator("#board .column[data-status='blocked'] .more")).to_have_text("showing 2 of 3")
            expect(card_in(page, "blocked", "t0")).to_have_count(0)
            expect(page.locator("#d-title")).to_have_text("Task 0")
            assert problems == []
    finally:
        context.close()
        server.stop()
