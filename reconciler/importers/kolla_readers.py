"""Which nodes read which secret: for the import's split of passwords.yml into one SOPS file per
set of reader nodes (``kolla_split``). Computed from the repo the import wrote, as a node's
render would read it, never from a table of kolla's names.

A node reads ``secrets.X`` when a file template of one of its services reads it: in the
template's own text, in a template it includes, or through the variables it reads, however
deep (kolla's ``nova_cell_rpc_password`` -> ``om_rpc_password`` -> ``rabbitmq_password`` ->
``"{{ secrets.rabbitmq_password }}"``), each variable taken as that node and service see it
(the node's variables over the service's defaults, ``render.variables``).

The answer may say more than a render reads, never less: a node that renders a file reading a
secret it cannot decrypt stops there. So a branch is left out only where its test is decided at
import, for that node and service (``{% if not service_name.startswith('nova-compute') %}``
around nova.conf's ``[database]``, ``{% if enable_barbican | bool %}``): every name it reads
resolved (``kolla_resolve``, strings inside lists and mappings included), none that a template
sets itself, none from facts, peers or secrets. Anything else is read as if every branch were
taken. A computed include reads every template of the service; ``secrets`` read other than by
a constant key, or a variable read by a computed name (``lookup('vars', x)``, ``vars[x]``),
reads every secret. A filter that reads variables by name from the context reads those
(``_by_name``).
"""

from __future__ import annotations

import copy
import functools
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
from jinja2 import meta, nodes

from reconciler.importers.kolla_resolve import Resolver, Unresolved, to_bool
from reconciler.render.inputs import strings_in
from reconciler.render.lazyvars import templated
from reconciler.repo.definitions import DeploymentRepo, ServiceDef

EVERY = "*"  # in a node's reads: every secret (no password is named so)
_UNKNOWN = object()
_NOT_KNOWN = ("hostvars", "secrets", "release", "pending_release", "service_version", "facts")


class _AnyName(dict[str, Any]):
    """Every filter or test name parses: which names a text reads does not depend on them."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, str)


_PARSER = jinja2.Environment()
_PARSER.filters = _AnyName(_PARSER.filters)
_PARSER.tests = _AnyName(_PARSER.tests)


@functools.lru_cache(maxsize=65536)
def _parse(text: str) -> tuple[nodes.Template, frozenset[str]] | None:
    """The text's syntax tree and the names it sets itself (``set``, loop and macro names);
    None when it does not parse (the render reports it)."""
    try:
        ast = _PARSER.parse(text)
    except jinja2.TemplateSyntaxError:
        return None
    return ast, frozenset(n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param"))


class _Decider(Resolver):
    """``kolla_resolve``'s resolver, typed as the render types a templated variable (one
    expression: its value as it is; any other text: a string, never read back as a literal), a
    list or mapping resolved whole (a string inside one that is still a template would read as
    the text ``"{{ enable_nova }}"``), and a name a template sets itself never taken from the
    variables."""

    def __init__(self, variables: Mapping[str, Any]) -> None:
        super().__init__(variables)
        self.blocked: frozenset[str] = frozenset()
        self.whole: dict[str, Any] = {}

    def name(self, name: str, extra: Mapping[str, Any] | None = None) -> Any:
        if name in self.blocked:
            raise Unresolved(f"{name} is set by the template")
        if self.variables.get(name) is _UNKNOWN:
            raise Unresolved(f"{name} is the render's own")
        if name not in self.whole:
            self.whole[name] = self._deep(super().name(name, extra))
        return self.whole[name]

    def _deep(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.expr(value) if templated(value) else value
        if isinstance(value, Mapping):
            return {k: self._deep(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._deep(v) for v in value]
        return value

    def expr(self, text: str, extra: Mapping[str, Any] | None = None) -> Any:
        compiled = _text(text)
        if compiled is None:
            raise Unresolved("not known at import")
        run, names = compiled
        try:
            return run(self._context(names))
        except _FAILED as exc:
            raise Unresolved(f"{type(exc).__name__}: {exc}") from None

    def _context(self, names: frozenset[str]) -> dict[str, Any]:
        return {n: self._lookup if n == "lookup" else self.name(n) for n in sorted(names)}

    def decide(self, test: nodes.Node, blocked: frozenset[str]) -> bool | None:
        """The test's truth for this node and service (Jinja's, as ``{% if %}`` takes it); None
        when it is not known at import."""
        compiled = _test(test)
        if compiled is None:
            return None
        run, names = compiled
        self.blocked = blocked
        try:
            return bool(run(self._context(names)))
        except (Unresolved, *_FAILED):
            return None
        finally:
            self.blocked = frozenset()


# What evaluating a template at import may raise besides ``Unresolved``: it is then not known.
_FAILED = (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError)
_Run = tuple[Callable[[dict[str, Any]], Any], frozenset[str]]  # render with a context; the names it reads


@functools.cache
def _envs() -> tuple[jinja2.Environment, jinja2.Environment]:
    """Jinja's native environment (an expression's value) and its text one, with the filters
    ``kolla_resolve`` knows: any other filter is not known at import."""
    from jinja2.nativetypes import NativeEnvironment

    native = NativeEnvironment(undefined=jinja2.StrictUndefined)
    text = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for env in (native, text):
        env.filters.update(bool=to_bool, ternary=lambda v, a, b, n=None: a if to_bool(v) else b)
    return native, text


def _names(env: jinja2.Environment, ast: nodes.Template) -> frozenset[str]:
    return frozenset(n for n in meta.find_undeclared_variables(ast) if n not in env.globals or n == "lookup")


@functools.lru_cache(maxsize=65536)
def _text(text: str) -> _Run | None:
    """A templated variable's value as the render types it: one expression, its value as it is;
    any other text, a string (never read back as a Python literal). None: not compilable here."""
    native, plain = _envs()
    try:
        ast = native.parse(text)
        body = ast.body
        if (len(body) == 1 and isinstance(body[0], nodes.Output) and len(body[0].nodes) == 1
                and not isinstance(body[0].nodes[0], nodes.TemplateData) and text.startswith("{{")
                and text.endswith("}}")):
            expression = native.compile_expression(text[2:-2].strip("-+"), undefined_to_none=False)
            return (lambda ctx: expression(**ctx)), _names(native, ast)
        return plain.from_string(text).render, _names(plain, ast)
    except jinja2.TemplateError:
        return None


_TESTS: dict[int, tuple[nodes.Node, _Run | None]] = {}  # by the identity of a cached tree's test (kept)


def _test(test: nodes.Node) -> _Run | None:
    """An ``if``'s test compiled to 1 or 0 (Jinja's truth, never a string read as a literal)."""
    hit = _TESTS.get(id(test))
    if hit is None or hit[0] is not test:
        native, _ = _envs()
        run: _Run | None = None
        try:
            # A copy: the parsed tree is shared (cached), and compiling sets its environment.
            truth = nodes.CondExpr(copy.deepcopy(test), nodes.Const(1), nodes.Const(0), lineno=1)
            tpl = nodes.Template([nodes.Output([truth], lineno=1)], lineno=1)
            tpl.set_environment(native)
            run = native.from_string(tpl).render, _names(native, tpl)
        except jinja2.TemplateError:
            pass
        if len(_TESTS) > 65536:
            _TESTS.clear()
        hit = _TESTS[id(test)] = (test, run)
    return hit[1]


class _Reads:
    """What one service's files read on one node."""

    def __init__(self, node: str, node_vars: dict[str, Any], svc: ServiceDef, groups: Mapping[str, Any]) -> None:
        self.svc = svc
        # The render's own names (render.variables.context) over the variables; those it sets
        # from what the node publishes or from peers are never known here.
        self.own: dict[str, Any] = {"inventory_hostname": node, "node": node, "service": svc.name,
                                    "groups": groups, **{n: _UNKNOWN for n in _NOT_KNOWN}}
        self.values: Mapping[str, Any] = ChainMap(self.own, node_vars, dict(svc.defaults))
        self.decider = _Decider(self.values)
        self.secrets: set[str] = set()
        self.names: set[str] = set()  # the variables walked
        self.included: set[str] = set()
        parsed = [_parse(t) for t in svc.templates.values()]
        # An include sees the includer's names: a name any template sets is set for all.
        self.set_here = frozenset(n for p in parsed if p is not None for n in p[1])

    def file(self, template: str) -> None:
        """A template of the service's own, by its name there (as an include names it)."""
        self.text(self.svc.template_path(template))

    def text(self, path: str) -> None:
        """A template or an override file a ``merge`` renders, by its repo path."""
        if path in self.included or path not in self.svc.templates:
            return
        self.included.add(path)
        parsed = _parse(self.svc.templates[path])
        if parsed is not None:
            self._walk(parsed[0], self.set_here)

    def _every_template(self) -> None:
        own = self.svc.template_path("")
        for path in self.svc.templates:
            if path.startswith(own):
                self.text(path)

    def _name(self, name: str) -> None:
        if name in self.names or name in self.own:
            return
        self.names.add(name)
        value = self.values.get(name)
        for text in strings_in(value):
            parsed = _parse(text) if templated(text) else None
            if parsed is not None:
                self._walk(parsed[0], parsed[1])

    def _walk(self, node: nodes.Node, blocked: frozenset[str]) -> None:
        if isinstance(node, nodes.If):
            for branch in (node, *node.elif_):
                self._walk(branch.test, blocked)
                verdict = self.decider.decide(branch.test, blocked)
                if verdict is False:
                    continue
                for child in branch.body:
                    self._walk(child, blocked)
                if verdict:
                    return
            for child in node.else_:
                self._walk(child, blocked)
            return
        if isinstance(node, nodes.CondExpr):
            self._walk(node.test, blocked)
            verdict = self.decider.decide(node.test, blocked)
            if verdict is not False:
                self._walk(node.expr1, blocked)
            if verdict is not True and node.expr2 is not None:
                self._walk(node.expr2, blocked)
            return
        if isinstance(node, nodes.Getattr | nodes.Getitem) and isinstance(node.node, nodes.Name) \
                and node.node.name == "secrets":
            key = node.attr if isinstance(node, nodes.Getattr) else _const(node.arg)
            self.secrets.add(key if key is not None else EVERY)
            if isinstance(node, nodes.Getitem):
                self._walk(node.arg, blocked)
            return
        if isinstance(node, nodes.Name) and node.ctx == "load":
            if node.name == "secrets" or node.name == "vars":
                self.secrets.add(EVERY)  # the whole view, or any variable by a computed name
            else:  # a name the template sets may still be read from the variables where it is not set
                self._name(node.name)
        elif isinstance(node, nodes.Filter | nodes.Test) and node.name in _by_name():
            for read in sorted(_by_name()[node.name]):
                self._name(read)
        elif isinstance(node, nodes.Include | nodes.Import | nodes.FromImport | nodes.Extends):
            included = _const(node.template)
            self.file(included) if included is not None else self._every_template()
        elif isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and \
                node.node.name in ("lookup", "query", "q") and node.args:
            kind, term = _const(node.args[0]), _const(node.args[1]) if len(node.args) > 1 else None
            if kind in ("vars", "ansible.builtin.vars"):
                self._name(term) if term is not None else self.secrets.add(EVERY)
            elif kind in ("template", "ansible.builtin.template"):
                self._every_template()
        for child in node.iter_child_nodes():
            self._walk(child, blocked)


@functools.cache
def _by_name() -> dict[str, frozenset[str]]:
    """The dialect's filters that read variables from the context by name, not only what the
    template passes them (so the template shows nothing of it), with the variables each reads:
    ``database_shards_info`` reads the deployment's database passwords (``render.kolla_filters``).
    ``kolla_address`` reads peers' variables through ``hostvars``, which hold no secret."""
    from reconciler.render.kolla_filters import _PASSWORDS

    return {"database_shards_info": frozenset(_PASSWORDS)}


def _const(node: nodes.Node) -> str | None:
    return node.value if isinstance(node, nodes.Const) and isinstance(node.value, str) else None


def service_reads(node: str, node_vars: dict[str, Any], svc: ServiceDef, groups: Mapping[str, Any]) -> frozenset[str]:
    """The secrets ``svc``'s files may read on ``node`` (``EVERY``: all). ``groups``: as the
    node's templates see them (``DeploymentRepo.peers``)."""
    reads = _Reads(node, node_vars, svc, groups)
    for decl in svc.files_in_order:
        if decl.template is not None:
            reads.file(decl.template)
        if decl.merge is not None:  # the override files it may merge, rendered alike (render.merge)
            for path in svc.templates:
                if not path.startswith(svc.template_path("")):
                    reads.text(path)
    return frozenset(reads.secrets)


def secret_readers(repo: DeploymentRepo, names: frozenset[str]) -> dict[str, frozenset[str]]:
    """Each of ``names`` -> the nodes whose renders may read it (none: no enabled service does).
    About 30 ms a node for kolla's multinode (the texts parse and the tests compile once)."""
    readers: dict[str, set[str]] = {n: set() for n in names}
    for node in repo.nodes:
        node_vars, groups = repo.node_vars(node), repo.peers(node)[0]
        reads = frozenset().union(*(service_reads(node, node_vars, repo.services[s], groups)
                                    for s in repo.services_of(node)))
        for name in names if EVERY in reads else reads & names:
            readers[name].add(node)
    return {n: frozenset(r) for n, r in readers.items()}
