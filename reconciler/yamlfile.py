"""YAML that remembers where each value came from, so every error can say file:line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from .errors import BadInput

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the repo, located."""

    file: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


class RepoProblems(BadInput):
    """All the problems found in one pass; the message is the first, with a count."""

    reason = "INVALID_REPO"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line or 0, p.message))
        first = self.problems[0]
        more = len(self.problems) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        super().__init__(first.message + suffix, file=first.file, line=first.line)


@dataclass(frozen=True)
class YamlDoc:
    file: str
    data: Any
    lines: dict[Path_, int]

    def line(self, path: Path_) -> int | None:
        """Line of the value at ``path``, or of its nearest parent that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            kline = key_node.start_mark.line + 1
            if key in seen:
                raise BadInput(
                    f"duplicate key {key!r} (first at line {seen[key]})", file=file, line=kline
                )
            seen[key] = kline
            _walk(value_node, (*path, key), lines, file)
            # A key's own line reads better in errors than its value's (block values start below).
            lines[(*path, key)] = kline
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines, file)


def load_yaml(text: bytes, file: str) -> YamlDoc:
    try:
        loader = yaml.SafeLoader(text.decode("utf-8"))
        try:
            node = loader.get_single_node()
            lines: dict[Path_, int] = {}
            if node is not None:
                _walk(node, (), lines, file)
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError as exc:
        raise BadInput("not UTF-8 text", file=file) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "invalid YAML"
        raise BadInput(f"invalid YAML: {what}", file=file, line=line) from exc
    except yaml.YAMLError as exc:
        raise BadInput(f"invalid YAML: {exc}", file=file) from exc
    except RecursionError as exc:
        raise BadInput("YAML nested too deeply", file=file) from exc
    return YamlDoc(file=file, data=data, lines=lines)


@cache
def schema(name: str) -> dict[str, Any]:
    text = resources.files("reconciler").joinpath("schema", f"{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def check_schema(doc: YamlDoc, name: str) -> list[Problem]:
    import jsonschema  # heavy; only needed when a commit is loaded, never on a no-op poll

    validator = jsonschema.Draft202012Validator(schema(name))
    problems = []
    for err in validator.iter_errors(doc.data):
        path = tuple(err.absolute_path)
        where = "/".join(str(p) for p in path)
        message = _short(err)
        problems.append(Problem(doc.file, doc.line(path), f"{where}: {message}" if where else message))
    return problems


def _short(err: Any) -> str:
    if err.validator == "additionalProperties":
        return str(err.message).replace("Additional properties are not allowed ", "unknown key ")
    if err.validator == "oneOf" and err.schema_path and "files" in str(err.schema_path):
        return "a file needs exactly one of 'template' or 'source'"
    return str(err.message)
