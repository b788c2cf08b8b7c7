"""YAML that remembers where each value came from, so every error can say file:line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer

from reconciler.core.errors import BadInput, YamlLimit
from reconciler.core.limits import LIMITS
from reconciler.core.yamlfast import INT, NOT_PLAIN, bounded_int, build

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the repo, located; ``reason`` when it is more than a plain mistake
    (a limit, a symlink), so the reason code of the whole load says so."""

    file: str
    line: int | None
    message: str
    reason: str | None = None

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
        super().__init__(first.message + suffix, file=first.file, line=first.line, reason=first.reason)


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


class _CountingLoader(yaml.SafeLoader):
    """Stops composing a document once it holds more than ``max_nodes`` nodes, so a huge file
    is refused before it is all in memory."""

    def __init__(self, text: str, file: str, max_nodes: int) -> None:
        super().__init__(text)
        self.file, self.max_nodes, self.composed = file, max_nodes, 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self.composed += 1
        if self.composed > self.max_nodes:
            raise YamlLimit(f"YAML has more than {self.max_nodes} nodes", file=self.file,
                            line=self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
        return Composer.compose_node(self, parent, index)  # type: ignore[no-untyped-call,no-any-return]


_CountingLoader.add_constructor(INT, bounded_int)


def _c_safe_loader() -> type | None:
    """libyaml's loader, its integers bounded as the fast path's are; None without libyaml."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None

    class _CSafeLoader(yaml.CSafeLoader):  # type: ignore[misc,name-defined,unused-ignore]
        pass

    _CSafeLoader.add_constructor(INT, bounded_int)
    return _CSafeLoader


def _counting_c_loader() -> type | None:
    """``_CountingLoader`` over libyaml's scanner and parser (most of the time a big file takes:
    a 10,000-node inventory's), composing in Python as it counts; None without libyaml."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    from yaml._yaml import CParser  # type: ignore[import-not-found,unused-ignore]
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    class _CCountingLoader(CParser, Composer, SafeConstructor, Resolver):  # type: ignore[misc]
        def __init__(self, text: str, file: str, max_nodes: int) -> None:
            CParser.__init__(self, text)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self.file, self.max_nodes, self.composed = file, max_nodes, 0

        # The composer's own, in Python: libyaml's would compose the whole document uncounted.
        get_single_node, check_node, get_node = Composer.get_single_node, Composer.check_node, Composer.get_node
        compose_node = _CountingLoader.compose_node

    _CCountingLoader.add_constructor(INT, bounded_int)
    return _CCountingLoader


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expansion(root: yaml.Node, max_nodes: int, file: str) -> None:
    """Refuse a document whose aliases expand past ``max_nodes``: whoever walks the loaded data
    (schema checks, templates, line maps) pays the expanded size, not the composed one. An alias
    resolves to the very node of its anchor, so sizes are memoised by node and this costs as
    much as composing did."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        if isinstance(node, yaml.ScalarNode):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise YamlLimit("YAML alias refers to its own anchor", file=file, line=node.start_mark.line + 1)
        open_.add(id(node))
        total = 1
        for child in _children(node):
            total += size(child)
            if total > max_nodes:
                break  # already too big: the rest need not be counted
        open_.discard(id(node))
        sizes[id(node)] = total
        return total

    node = root
    if size(node) <= max_nodes:
        return
    # Name the collection where the count tips over: descend while one child alone is too big.
    while True:
        running, inner = 1, None
        for child in _children(node):
            if size(child) > max_nodes:
                inner = child
                break
            running += size(child)
            if running > max_nodes:
                break
        if inner is None:
            break
        node = inner
    raise YamlLimit(f"YAML expands to more than {max_nodes} nodes (aliases count at their expanded size)",
                    file=file, line=node.start_mark.line + 1)


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int], file: str, seen: set[int]) -> None:
    lines[path] = node.start_mark.line + 1
    if id(node) in seen:
        return  # an alias: its anchor was walked (and checked) once; paths below it use this line
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            kline = key_node.start_mark.line + 1
            if key in keys:
                raise BadInput(
                    f"duplicate key {key!r} (first at line {keys[key]})", file=file, line=kline
                )
            keys[key] = kline
            _walk(value_node, (*path, key), lines, file, seen)
            # A key's own line reads better in errors than its value's (block values start below).
            lines[(*path, key)] = kline
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines, file, seen)


@contextmanager
def _as_bad_input(file: str) -> Iterator[None]:
    """What reading YAML raises, as the one-line error (with its line where known) a user sees."""
    try:
        yield
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


def _construct(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.Node, file: str) -> Any:
    """The document of ``node``; a value Python cannot build is said at its line."""
    try:
        return loader.construct_document(node)
    except (ValueError, LookupError, AttributeError) as exc:  # a scalar its tag cannot build: PyYAML's own errors
        located = _unconstructable(loader, node, file)
        if located is None:
            raise
        raise located from exc


def _load(text: bytes, file: str, max_nodes: int, *, lines: dict[Path_, int] | None, plain: bool = True) -> Any:
    """Compose (bounded); a plain document built in one walk (``yamlfast``; ``plain=False``:
    never, the careful path the tests hold it to); else check the expansion, map lines (when
    asked), construct."""
    with _as_bad_input(file):
        decoded = text.decode("utf-8")
        # A YAML node takes at least one character ("{a,b}": five nodes in five), so a text of
        # fewer than max_nodes / 2 characters cannot compose past the bound: libyaml's composer
        # (ten times faster) is safe for it; a bigger text is counted as it is composed.
        counting = _COUNTING_C or _CountingLoader
        loader: yaml.SafeLoader | yaml.CSafeLoader = (
            _C_SAFE(decoded) if _C_SAFE is not None and (
                len(decoded) * 2 < max_nodes or _few_events(decoded, max_nodes))
            else counting(decoded, file, max_nodes))
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            data = build(loader, node, decoded, max_nodes, lines) if plain else NOT_PLAIN
            if data is not NOT_PLAIN:
                return data
            if lines:
                lines.clear()
            _check_expansion(node, max_nodes, file)
            if lines is not None:
                _walk(node, (), lines, file, set())
            return _construct(loader, node, file)
        finally:
            loader.dispose()  # type: ignore[no-untyped-call]


_COUNTING_C = _counting_c_loader()
_C_SAFE = _c_safe_loader()


def _few_events(text: str, max_nodes: int) -> bool:
    """Does libyaml parse ``text`` into at most ``max_nodes`` events? Each node composed is one
    event (a scalar, an alias, a collection's start), so then libyaml's composer cannot pass the
    bound either. Counted in C, nothing built (10 ms for a 10,000-node inventory, whose counting
    compose in Python took 0.1 s more than libyaml's). A text libyaml cannot parse: False, and
    the counting loader says what it always said, in its order."""
    from yaml._yaml import CParser  # type: ignore[import-not-found,unused-ignore]

    try:
        return int(CParser(text).raw_parse()) <= max_nodes
    except yaml.YAMLError:
        return False


def _unconstructable(loader: yaml.SafeLoader | yaml.CSafeLoader, root: yaml.Node, file: str) -> BadInput | None:
    """The first scalar, in document order, whose value Python cannot build (an integer past
    ``sys.get_int_max_str_digits``, a date like 2026-13-01, ``!!bool 1``), as a located error.
    Searched for only once construction failed: the constructor raises a bare ValueError (or
    KeyError, IndexError, AttributeError for a text its explicit tag cannot read) that says neither."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if not isinstance(node, yaml.ScalarNode):
            stack.extend(reversed(_children(node)))
            continue
        build = loader.yaml_constructors.get(node.tag)
        try:
            if build is not None:
                build(loader, node)
        except ValueError as exc:
            what = "number too large" if node.tag == INT else f"{node.value[:40]!r}: {exc}"
            return BadInput(what, file=file, line=node.start_mark.line + 1)
        except (LookupError, AttributeError):  # ``!!bool 1``, an empty ``!!int``: no message of PyYAML's worth showing
            what = f"{node.value[:40]!r} is not a {node.tag.replace('tag:yaml.org,2002:', '!!')}"
            return BadInput(what, file=file, line=node.start_mark.line + 1)
    return None


def load_yaml(text: bytes, file: str, max_nodes: int = LIMITS.yaml_nodes) -> YamlDoc:
    """A repo or config file: duplicate keys refused, every value's line remembered, and no more
    than ``max_nodes`` nodes (see ``Limits.yaml_nodes``)."""
    lines: dict[Path_, int] = {}
    data = _load(text, file, max_nodes, lines=lines)
    return YamlDoc(file=file, data=data, lines=lines)


def safe_load(text: bytes, file: str, max_nodes: int = LIMITS.yaml_nodes) -> Any:
    """Like ``yaml.safe_load`` (a later duplicate key wins) but bounded like ``load_yaml``: for
    YAML that is data to compare or peek into, not a repo file to report on line by line."""
    return _load(text, file, max_nodes, lines=None)


def safe_load_all(text: bytes, file: str, max_nodes: int = LIMITS.yaml_nodes) -> list[Any]:
    """Every document of a ``---``-separated stream (a SOPS file may hold several), bounded
    like ``safe_load``: ``max_nodes`` counts all the documents together, aliases expanded."""
    with _as_bad_input(file):
        decoded = text.decode("utf-8")
        loader = _CountingLoader(decoded, file, max_nodes)
        try:
            nodes: list[yaml.Node] = []
            while loader.check_node():  # type: ignore[no-untyped-call]
                node = loader.get_node()  # type: ignore[no-untyped-call]
                if node is not None:
                    nodes.append(node)
            if nodes:
                # one bound for the whole stream: a document per alias bomb must not multiply it
                _check_expansion(yaml.SequenceNode("tag:yaml.org,2002:seq", nodes, nodes[0].start_mark),
                                 max_nodes, file)
            return [_construct(loader, node, file) for node in nodes]
        finally:
            loader.dispose()  # type: ignore[no-untyped-call]


@cache
def schema(name: str) -> dict[str, Any]:
    # Read beside the package where it is installed as files (pip's way; importlib.resources
    # costs a change's first pass 1.5 ms of imports), through importlib.resources elsewhere.
    beside = Path(__file__).resolve().parent.parent / "schema" / f"{name}.schema.json"
    if beside.is_file():
        text = beside.read_text()
    else:
        from importlib import resources

        text = resources.files("reconciler").joinpath("schema", f"{name}.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def check_schema(doc: YamlDoc, name: str) -> list[Problem]:
    from reconciler.core.schemacompile import valid  # only where a commit is loaded, as jsonschema was

    if valid(doc.data, schema(name)):  # the common case, without jsonschema's 60 ms of imports (issue 40)
        return []
    import jsonschema  # heavy; only for a document that may be invalid: it says what is wrong

    validator = jsonschema.Draft202012Validator(schema(name))
    problems = []
    for err in validator.iter_errors(doc.data):
        path = tuple(err.absolute_path)
        where = "/".join(str(p) for p in path)
        for at, message in _unknown_keys(err, path) or [(path, _short(err))]:
            problems.append(Problem(doc.file, doc.line(at), f"{where}: {message}" if where else message))
    return problems


def _unknown_keys(err: Any, path: Path_) -> list[tuple[Path_, str]]:
    """Each unknown key of a mapping on its own line (not its mapping's: a typo deep in a long
    inventory is found where it was made), with the name it is nearest to."""
    if err.validator != "additionalProperties" or not isinstance(err.instance, dict):
        return []
    known, patterns = err.schema.get("properties", {}), err.schema.get("patternProperties", {})
    unknown = [str(k) for k in err.instance if k not in known and not any(re.search(p, str(k)) for p in patterns)]
    return [((*path, k), f"unknown key {k!r}{near(k, known)}") for k in unknown]


def near(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name nearest a mistyped one, or nothing."""
    import difflib

    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


def _short(err: Any) -> str:
    if err.validator == "additionalProperties":
        return str(err.message).replace("Additional properties are not allowed ", "unknown key ")
    if err.validator == "oneOf" and err.schema_path and "files" in str(err.schema_path):
        return "a file needs exactly one of 'template' or 'source'"
    return str(err.message)
