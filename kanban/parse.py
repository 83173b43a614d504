"""Turning the bytes of a dropped file into task fields (pure; no filesystem access).

Formats by extension: .json, .yaml/.yml, .md (optional YAML front matter, then first line = title),
.txt (first line = title, the rest = body). Errors say where and what, the way a person fixes them.

Every file is hostile until parsed: both loaders give only plain JSON data (text, numbers, true/false,
null, lists, objects), refuse nesting deeper than MAX_DEPTH before any recursion, refuse integers too
long to print, and the YAML loader refuses aliases (a billion laughs, a self-reference) and the types
JSON cannot hold (dates, sets, binary), so what parses here can always be written as a task.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.resolver import Resolver

from .task import MAX_BYTES, MAX_DEPTH, MAX_INT_DIGITS, TaskError

__all__ = ["EXTENSIONS", "MAX_BYTES", "decode_text", "load_json", "load_yaml", "parse_task_file"]

EXTENSIONS = (".json", ".yaml", ".yml", ".md", ".txt")
# A JSON string once its escaped backslashes and quotes are gone: no backslash is left to
# backtrack over, so an unterminated one costs one pass, not one per later quote.
_JSON_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def decode_text(data: bytes) -> str:
    if len(data) > MAX_BYTES:
        raise TaskError(f"file is {len(data)} bytes; the limit for a task file is {MAX_BYTES} bytes (1 MiB)")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise TaskError(f"file is binary, not text (a NUL byte at offset {nul})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"file is not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start})") from exc
    return text.removeprefix("\ufeff")


def _json_too_deep(text: str) -> bool:
    """Whether `text` nests deeper than MAX_DEPTH: json.loads recurses once per level, so this is
    checked first, in a few linear passes. Escapes pair from the left, as JSON reads them."""
    bare = _JSON_STRING.sub("", text.replace("\\\\", "").replace('\\"', ""))
    depth = 0
    for char in _NOT_BRACKET.sub("", bare):
        depth += 1 if char in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _json_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise TaskError(f"an integer of {len(digits.lstrip('-'))} digits; a task's integers have at most "
                        f"{MAX_INT_DIGITS} digits")
    return int(digits)


def _json_constant(name: str) -> Any:
    raise TaskError(f"{name} is not a finite number; JSON has no {name}")


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise TaskError(f"{text[:40]} is not a finite number")
    return value


def load_json(text: str) -> Any:
    """Plain data from JSON text; TaskError saying where and what if it is not."""
    if _json_too_deep(text):
        raise TaskError(f"the data is nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        raise TaskError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    except RecursionError:  # a nesting the pre-scan missed must still not end the process
        raise TaskError(f"the data is nested more than {MAX_DEPTH} levels deep") from None


if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _Loader(Composer, CParser, SafeConstructor, Resolver):
        """libyaml's parser, for speed (pure Python takes seconds per MiB of YAML, which an agent's
        ingest waits out), with Python's composer: libyaml's own recurses without a limit and
        crashes the process (a segfault at 100,000 levels)."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            Composer.__init__(self)
else:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader  # type: ignore[misc]  # one name, one of two classes: mypy sees only the first


class PlainLoader(_Loader):
    """YAML to plain JSON data only: no aliases (a billion laughs, a self-reference), no nesting past
    `max_depth` (the composer recurses once per level), no duplicate keys (a second one would
    silently replace the first), no dates, sets or binary. hermes.yaml's loader builds on it."""

    source = "a task file"  # for messages: where aliases are not allowed
    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        _Loader.__init__(self, stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ComposerError(
                None, None, f"aliases (*{event.anchor}) are not allowed in {self.source}; write the value out",
                event.start_mark)
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= self.max_depth:
            raise ComposerError(
                None, None, f"the data is nested more than {self.max_depth} levels deep",
                self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_plain_mapping(self, node: MappingNode) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # an unhashable key is refused by construct_mapping, with its line
            key = self.construct_object(key_node)
            if key in seen:
                raise ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key]}); a second one would "
                                "silently replace the first", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return self.construct_mapping(node, deep=True)


def _refuse(what: str, *, quoted_is_text: bool = False) -> Any:
    def construct(loader: SafeConstructor, node: Node) -> Any:
        if quoted_is_text and isinstance(node, ScalarNode):
            problem = f"{what} ({node.value[:40]}) is not plain data; put it in quotes to keep it as text"
        else:
            problem = (f"{what} is not plain data; a task holds only text, numbers, true/false, null, lists "
                       "and objects")
        raise ConstructorError(None, None, problem, node.start_mark)
    return construct


def _yaml_int(loader: SafeConstructor, node: Node) -> int:
    digits = len(str(node.value).lstrip("+-").replace("_", ""))
    if digits > MAX_INT_DIGITS:
        raise ConstructorError(None, None, f"an integer of {digits} digits; integers here have at most "
                                           f"{MAX_INT_DIGITS} digits", node.start_mark)
    return loader.construct_yaml_int(node)


def _yaml_float(loader: SafeConstructor, node: Node) -> float:
    value = loader.construct_yaml_float(node)
    if not math.isfinite(value):
        raise ConstructorError(None, None, f"{node.value} is not a finite number", node.start_mark)
    return value


PlainLoader.add_constructor("tag:yaml.org,2002:map",
                            lambda loader, node: loader.construct_plain_mapping(node))
PlainLoader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
PlainLoader.add_constructor("tag:yaml.org,2002:float", _yaml_float)
PlainLoader.add_constructor("tag:yaml.org,2002:timestamp", _refuse("a date or time", quoted_is_text=True))
for _tag in ("set", "binary", "omap", "pairs"):
    PlainLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse(f"a YAML !!{_tag}"))


def load_yaml(text: str) -> Any:
    """Plain data from YAML text; raises yaml.YAMLError saying where and what."""
    loader = PlainLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class PlainYamlError(ValueError):
    """A file of YAML that is not YAML, or not plain data: which file, the line (if known) and the problem."""

    def __init__(self, source: str, problem: str, line: int | None = None) -> None:
        self.source, self.problem, self.line = source, problem, line
        super().__init__(f"{source} is not valid YAML{self.where}: {problem}")

    @property
    def where(self) -> str:
        return f" at line {self.line}" if self.line is not None else ""


def load_plain(text: str, source: str) -> Any:
    """Plain data from the YAML text of `source` (its name, for messages: "config.yaml"); every way
    it can fail (bad YAML, an alias, a date, too deep, too long an integer) is a PlainYamlError."""
    loader = PlainLoader(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlainYamlError(source, problem, mark.line + 1 if mark is not None else None) from None
    except (ValueError, RecursionError, OverflowError) as exc:
        raise PlainYamlError(source, str(exc)) from None
    finally:
        loader.dispose()


def _yaml_mapping(text: str, what: str, line_offset: int = 0) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if mark is not None:
            raise TaskError(
                f"invalid YAML{what} at line {mark.line + 1 + line_offset}, column {mark.column + 1}: {problem}"
            ) from exc
        raise TaskError(f"invalid YAML{what}: {problem}") from exc


def _title_and_body(text: str) -> dict[str, Any]:
    lines = text.splitlines()
    # One pass to the first non-blank line: popping blank lines off the front one at a time is
    # quadratic, a minute for a file of a million newlines.
    first = next((index for index, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return {}
    title = lines[first].strip().lstrip("#").strip()
    body = "\n".join(lines[first + 1:]).strip("\n")
    return {"title": title, "body": body}


def parse_markdown(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    rest = text
    lines = text.splitlines(keepends=True)
    if lines and lines[0].strip() == "---":
        for end in range(1, len(lines)):
            if lines[end].strip() in ("---", "..."):
                front = _yaml_mapping("".join(lines[1:end]), " front matter", line_offset=1)
                if front is None:
                    front = {}
                if not isinstance(front, dict):
                    raise TaskError("YAML front matter must be a mapping of fields")
                fields.update(front)
                rest = "".join(lines[end + 1:])
                break
        else:
            raise TaskError("YAML front matter opened with '---' on line 1 is never closed")
    if "title" in fields:
        body = rest.strip("\n")
        if body and "body" not in fields:
            fields["body"] = body
        return fields
    for key, value in _title_and_body(rest).items():
        fields.setdefault(key, value)
    return fields


def parse_task_file(name: str, data: bytes) -> dict[str, Any]:
    """The raw fields of a dropped file named `name`; raises TaskError with the reason."""
    lower = name.lower()
    if not lower.endswith(EXTENSIONS):
        raise TaskError(f"unsupported file type '{name}'; a task file ends in {', '.join(EXTENSIONS)}")
    text = decode_text(data)
    if lower.endswith(".json"):
        if not text.strip():
            raise TaskError("file is empty")
        raw = load_json(text)
    elif lower.endswith((".yaml", ".yml")):
        if not text.strip():
            raise TaskError("file is empty")
        raw = _yaml_mapping(text, "")
    elif lower.endswith(".md"):
        raw = parse_markdown(text)
    else:
        raw = _title_and_body(text)
    if not isinstance(raw, dict):
        kind = "list" if isinstance(raw, list) else type(raw).__name__
        raise TaskError(f"a task file must hold one object (a mapping of fields), not a {kind}")
    return raw
