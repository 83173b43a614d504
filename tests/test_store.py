"""The board protocol, the factory that opens a board from hermes.yaml, and that callers use nothing else."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hermes_sup.kanban import backends
from hermes_sup.kanban.backends import BoardConfigError, check_board_config, check_host, open_board, register
from hermes_sup.kanban.board import Board
from hermes_sup.kanban.store import BoardStore
from hermes_sup.supervisor.cli import main
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent
# Every package that uses a board without being one: they reach it through the protocol alone.
CALLERS = ("supervisor", "agents")
# The names a caller's board goes by (a variable, an attribute, a parameter).
BOARD_NAMES = {"board"}


def protocol_members() -> dict[str, object]:
    members = {}
    for name, value in vars(BoardStore).items():
        if name.startswith("_") and name not in ("__enter__", "__exit__"):
            continue
        members[name] = value
    for name in getattr(BoardStore, "__annotations__", {}):
        members.setdefault(name, None)
    return members


def test_protocol_documents_every_verb():
    for name, value in protocol_members().items():
        if callable(value) and name not in ("__enter__", "__exit__"):
            assert (value.__doc__ or "").strip(), f"BoardStore.{name} has no documentation"


def test_file_board_implements_every_protocol_verb_with_a_compatible_signature():
    for name, value in protocol_members().items():
        if value is None:
            continue  # an attribute each board sets when opened: see test_a_file_board_is_a_board_store
        assert hasattr(Board, name), f"Board lacks {name}"
        if not inspect.isfunction(value):
            continue
        implemented = getattr(Board, name)
        assert inspect.isfunction(implemented), f"Board.{name} is not a method"
        wanted = inspect.signature(value).parameters
        have = inspect.signature(implemented).parameters
        for param in wanted.values():
            assert param.name in have, f"Board.{name} lacks parameter {param.name}"
            got = have[param.name]
            assert got.kind == param.kind, f"Board.{name}({param.name}) is {got.kind}, the protocol says {param.kind}"
            assert got.default == param.default, f"Board.{name}({param.name}) defaults to {got.default!r}"
        for extra in set(have) - set(wanted):
            assert have[extra].default is not inspect.Parameter.empty or have[extra].kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD), \
                f"Board.{name} requires {extra}, which the protocol does not pass"


def test_a_file_board_is_a_board_store(tmp_path):
    with open_board(tmp_path) as board:
        assert isinstance(board, BoardStore)
        for name in ("root", "problems", "signal"):
            assert hasattr(board, name)


def _sources() -> list[tuple[Path, ast.Module]]:
    found = []
    for package in CALLERS:
        for path in sorted((REPO / package).rglob("*.py")):
            found.append((path, ast.parse(path.read_text(), filename=str(path))))
    return found


# The builtins that reach an attribute by a name in a string.
REFLECTION = {"getattr", "hasattr", "setattr", "delattr"}


def _is_board(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in BOARD_NAMES) or \
        (isinstance(node, ast.Attribute) and node.attr in BOARD_NAMES)


def test_nothing_outside_kanban_constructs_the_file_board_or_reaches_past_the_protocol():
    assert reaches_past_the_protocol(_sources()) == []


def reaches_past_the_protocol(sources: list[tuple[Path, ast.Module]]) -> list[str]:
    """Where the callers' modules construct the file board or use a board beyond the protocol."""
    members = set(protocol_members())
    problems = []
    for path, tree in sources:
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hermes_sup.kanban") and (
                    node.module == "hermes_sup.kanban.board" or any(alias.name == "Board" for alias in node.names)):
                problems.append(f"{where}:{node.lineno} imports the file Board")
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Name) and func.id == "Board") or \
                        (isinstance(func, ast.Attribute) and func.attr == "Board"):
                    problems.append(f"{where}:{node.lineno} constructs Board")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION \
                    and node.args and _is_board(node.args[0]):
                # A name in a string is an attribute all the same: getattr(board, "x") is board.x.
                named = node.args[1] if len(node.args) > 1 else None
                if not (isinstance(named, ast.Constant) and isinstance(named.value, str)):
                    problems.append(f"{where}:{node.lineno} reaches the board by a computed name ({node.func.id})")
                elif named.value.startswith("_") or named.value not in members:
                    problems.append(f"{where}:{node.lineno} uses board.{named.value} through {node.func.id}, "
                                    "which is no protocol verb")
            if isinstance(node, ast.Attribute) and _is_board(node.value):
                if node.attr.startswith("_"):
                    problems.append(f"{where}:{node.lineno} touches the private board.{node.attr}")
                elif node.attr not in members:
                    problems.append(f"{where}:{node.lineno} uses board.{node.attr}, which is no protocol verb")
    return problems


def test_the_guard_sees_what_it_forbids():
    # The AST test above would pass on code it cannot see; show that it flags each kind of reach.
    tree = ast.parse("from hermes_sup.kanban import Board\nb = Board('x')\nboard._locked()\nself.board.fs_type\n")
    attrs = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and _is_board(node.value)]
    assert sorted(attrs) == ["_locked", "fs_type"]
    assert "fs_type" not in protocol_members()


def test_the_guard_sees_a_name_in_a_string():
    # getattr(board, "x") evades the attribute check: the guard reads the string too.
    source = ('getattr(board, "fs_type", None)\nhasattr(self.board, "_lock")\ngetattr(board, name)\n'
              'getattr(board, "journal_rows")\ngetattr(other, "x")\n')
    problems = reaches_past_the_protocol([(REPO / "agents" / "reach.py", ast.parse(source))])
    assert problems == ["agents/reach.py:1 uses board.fs_type through getattr, which is no protocol verb",
                        "agents/reach.py:2 uses board._lock through hasattr, which is no protocol verb",
                        "agents/reach.py:3 reaches the board by a computed name (getattr)"]


def test_the_file_board_keeps_no_journal_rows(tmp_path):
    with Board(tmp_path / "kanban") as board:
        assert board.journal_rows("t-1", "llm") is None
        assert board.journal_rows("t-1", "message", agents=["w1"], name="t-1.jsonl") is None


# The packages that use the board: the board never imports them (kanban -> agents would invert the layers).
ABOVE_KANBAN = ("hermes_sup.agents", "hermes_sup.supervisor")


def _imported(path: Path, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import in a module of the hermes_sup package, relative ones resolved,
    those inside functions included."""
    package = ["hermes_sup", *path.relative_to(REPO).parent.parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{module}.{alias.name}" if not node.module else module) for alias in node.names]
    return found


def _reaches_above(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in ABOVE_KANBAN)


def test_the_board_never_imports_the_agents_or_the_supervisor():
    problems = []
    for path in sorted((REPO / "kanban").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        problems += [f"{path.relative_to(REPO)}:{line} imports {module}" for line, module in _imported(path, tree)
                     if _reaches_above(module)]
    assert problems == []


def test_the_layer_guard_sees_every_form_of_import():
    path = REPO / "kanban" / "pg" / "store.py"
    tree = ast.parse("import hermes_sup.agents.loop\nfrom ...agents import journal\nfrom ...supervisor.cli import x\n"
                     "def f():\n    from hermes_sup.agents.journal import J\nfrom ..journal import Journal\n"
                     "from . import sql\n")
    reached = sorted((line, module) for line, module in _imported(path, tree) if _reaches_above(module))
    assert reached == [(1, "hermes_sup.agents.loop"), (2, "hermes_sup.agents"), (3, "hermes_sup.supervisor.cli"),
                       (5, "hermes_sup.agents.journal")]
    assert dict(_imported(path, tree))[6] == "hermes_sup.kanban.journal"
    assert dict(_imported(path, tree))[7] == "hermes_sup.kanban.pg.sql"


# -- the factory --------------------------------------------------------------------------------------


def test_default_section_opens_the_file_board_in_kanban(tmp_path):
    with open_board(tmp_path, None) as board:
        assert isinstance(board, Board)
        assert board.root == (tmp_path / "kanban").absolute()
        doc = board.add({"title": "x"})
    with open_board(tmp_path, {"backend": "files"}) as again:
        assert again.get(doc["id"])["title"] == "x"


def test_a_backend_is_one_registration(tmp_path, monkeypatch):
    opened = []

    def opener(folder, section, *, lock_timeout, host):
        opened.append((folder, dict(section), lock_timeout, host))
        return Board(folder, lock_timeout=lock_timeout)

    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setitem(backends.SECTION_KEYS, "memo", ("backend",))
    register("memo", opener)
    open_board(tmp_path, {"backend": "memo"}, lock_timeout=3.0, host="box-1").close()
    assert opened == [(tmp_path / "kanban", {"backend": "memo"}, 3.0, "box-1")]


def test_a_backend_not_installed_is_a_config_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "_REGISTRY", {k: v for k, v in backends._REGISTRY.items() if k != "postgres"})
    monkeypatch.setitem(backends.PLUGINS, "postgres", "hermes_sup.kanban.no_such_backend_module")
    with pytest.raises(BoardConfigError, match="'postgres' is not installed"):
        open_board(tmp_path, {"backend": "postgres", "dsn_env": "PG_DSN"})


@pytest.mark.parametrize("section, message", [
    ("postgres", "must be a mapping"),
    ({"backend": "sqlite"}, "not a board backend"),
    ({"backend": 3}, "not a board backend"),
    ({"backend": "files", "dsn_env": "X"}, "unknown key 'board.dsn_env'"),
    ({"backend": "postgres", "dsn": "postgres://u:secret@h/db"}, "unknown key 'board.dsn'"),
    ({"backend": "postgres", "dsn_env": "postgres://u:secret@h/db"}, "must name an environment variable"),
    ({"backend": "postgres", "host_timeout": 0}, "host_timeout must be"),
    ({"backend": "postgres", "host_timeout": True}, "host_timeout must be"),
    ({"backend": "postgres", "host_timeout": float("nan")}, "host_timeout must be"),
])
def test_board_section_checks(section, message):
    with pytest.raises(BoardConfigError, match=message) as caught:
        check_board_config(section)
    assert "secret" not in str(caught.value)


def test_board_section_defaults():
    assert check_board_config(None) == {"backend": "files"}
    assert check_board_config({"backend": "postgres"}) == {"backend": "postgres", "dsn_env": "HERMES_SUP_PG_DSN",
                                                           "host_timeout": 30.0}
    assert check_host(None) is None and check_host("build-box-1") == "build-box-1"
    with pytest.raises(BoardConfigError):
        check_host("../x")


# -- hermes.yaml and the commands ----------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    result = CliRunner().invoke(main, ["init", str(tmp_path / "ws")])
    assert result.exit_code == 0, result.output
    return tmp_path / "ws"


def _configure(ws: Path, extra: str) -> None:
    config = ws / "hermes.yaml"
    config.write_text(config.read_text() + extra)


def test_hermes_yaml_accepts_and_checks_board_and_host(ws):
    _configure(ws, "board:\n  backend: postgres\n  dsn_env: MY_PG\nhost: build-box-1\n")
    config = load_config(ws / "hermes.yaml")
    assert config["board"] == {"backend": "postgres", "dsn_env": "MY_PG"} and config["host"] == "build-box-1"
    assert load_config(ws / "hermes.yaml")["board"] == config["board"]  # as written: defaults are the backend's


def test_hermes_yaml_board_error_names_file_and_line(ws):
    lines = len((ws / "hermes.yaml").read_text().splitlines())
    _configure(ws, "board:\n  backend: sqlite\n")
    with pytest.raises(ConfigError, match=rf"hermes.yaml:{lines + 2}: board.backend 'sqlite'"):
        load_config(ws / "hermes.yaml")


@pytest.mark.parametrize("command", [["up"], ["doctor"], ["task", "add", "x"], ["board"]])
def test_a_backend_not_installed_exits_2_with_a_clear_error(ws, monkeypatch, command):
    # Imported first: `doctor` imports it for the budget ledger, and a first import registers the
    # backend again, into the registry patched below (the test failed when run on its own).
    import hermes_sup.kanban.pg  # noqa: F401
    monkeypatch.setattr(backends, "_REGISTRY", {k: v for k, v in backends._REGISTRY.items() if k != "postgres"})
    monkeypatch.setitem(backends.PLUGINS, "postgres", "hermes_sup.kanban.no_such_backend_module")
    _configure(ws, "board:\n  backend: postgres\n")
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        result = CliRunner().invoke(main, ["-w", str(ws), *command])
    finally:
        os.umask(umask)  # `up` narrows this process's umask before it opens the board
    assert result.exit_code == 2, result.output
    assert "board backend 'postgres' is not installed" in result.output
    assert "Traceback" not in result.output
    assert not (ws / "runs" / "supervisor.json").exists()


def test_every_board_module_is_small_documented_and_on_the_readme_map():
    # The map was the README's "Architecture"; it is the docs' page of that name now.
    architecture = (REPO / "docs" / "explanation" / "architecture.md").read_text()
    for path in sorted((REPO / "kanban").glob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        assert ast.get_docstring(tree), f"kanban/{path.name} has no docstring"
        assert len(text.splitlines()) <= 400, f"kanban/{path.name} has {len(text.splitlines())} lines"
        if path.name != "__init__.py":
            assert f"| `{path.name}` |" in architecture, f"kanban/{path.name} is not on the architecture page's map"


def test_the_agents_never_import_the_supervisor():
    """The runtime sits below the supervisor: the supervisor starts agents and imports their names
    (AGENT_ENV, ORPHANED), never the other way (an agent importing the supervisor would drag the
    process supervisor, the CLI and the dashboard into every agent)."""
    problems = []
    for path in sorted((REPO / "agents").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        problems += [f"{path.relative_to(REPO)}:{line} imports {module}" for line, module in _imported(path, tree)
                     if module == "hermes_sup.supervisor" or module.startswith("hermes_sup.supervisor.")]
    assert problems == []
