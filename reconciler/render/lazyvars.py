"""Variables that reference variables (reconciler.yaml ``templates.variables: templated``, the
default with the Ansible dialect), resolved as Ansible does: lazily, per node.

A value (a string, or strings nested in lists and mappings) holding ``{{`` or ``{%`` is kept in
the context as ``Pending``; it is rendered only when a template reads it (``LazyContext``), in
the reading template's sandbox (same dialect, same limits, a missing name an error), against the
node's context: every variable after the precedence of ``variables.context`` is applied, so a
group's value may read a node's own. A string that is one expression (``"{{ servers }}"``) gives
its value as it is (a list stays a list); any other gives a string.

Each value is rendered once per service's context, and once per node when it read only what
every service of the node reads alike (the node's variables and own names: ``Resolver.shared``).
A value that read a secret marks the secret files read again each time it is read from a cache,
so a file or runtime string using it is a secret one however often it is read.

A failure is a ``VarError`` naming the variable's FILE:LINE and the chain from the template that
read it: ``services/x/templates/y.j2:3 -> url (inventory.yaml:2) -> undefined 'fqdn'``; a cycle
(``a: "{{ b }}"``, ``b: "{{ a }}"``) at the variable that closes it. A value that fails is an
undefined one that raises its error where it is used, as ansible-core 2.19's markers do: Jinja
resolves every name a template mentions as it starts, and a branch not taken must not fail
(``| default(...)`` and ``is defined`` see it as undefined). ``hostvars[peer].x`` renders the
peer's value in the peer's context (without service defaults or secrets, as ``hostvars`` has them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import jinja2
import jinja2.runtime
from jinja2 import nodes
from jinja2.utils import missing

from reconciler.core.errors import RenderError, RenderLimit
from reconciler.core.memo import ByIdentity
from reconciler.render.facts import FactsView
from reconciler.render.sandbox import Sandbox, budget_now
from reconciler.render.secrets import SecretUnreadable
from reconciler.repo.definitions import DeploymentRepo, ServiceDef

RESOLVER = " resolver"  # the context's Resolver, under a key no template can name (a space)
_UNDEFINED = re.compile(r"'(.+)' is undefined")
_NOT_PER_NODE = frozenset({"lookup", "query", "q", "service", "service_version"})  # differ per service


def templated(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping) and not isinstance(value, FactsView):  # facts: never templates
        return any(templated(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(templated(v) for v in value)
    return False


class Pending:
    """A value not rendered yet; in the context only, never where a template sees it."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw


def marked(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each templated one ``Pending``."""
    return {k: Pending(v) if templated(v) else v for k, v in values.items()}


class VarError(RenderError):
    """A variable that could not be rendered: ``links``, the variables from the one a template
    read down to the one that failed, each ``name (FILE:LINE)``; ``tail``, why it failed; at
    FILE:LINE of the one that failed (of a cycle, the one that closes it)."""

    def __init__(self, links: list[str], tail: str, file: str, line: int | None) -> None:
        self.links, self.tail = links, tail
        super().__init__(" -> ".join([*links, tail]), file=file, line=line)

    def under(self, link: str) -> VarError:
        return VarError([link, *self.links], self.tail, self.file or "", self.line)

    def chain(self, reader: str) -> str:
        return " -> ".join([reader, *self.links, self.tail])


def _undefined(error: VarError) -> jinja2.Undefined:
    """A StrictUndefined that raises ``error`` (a fresh copy each time) wherever it is used."""
    def fail(_message: str) -> VarError:
        return VarError(error.links, error.tail, error.file or "", error.line)

    return _Failed(hint=error.tail, exc=cast(type[jinja2.exceptions.TemplateRuntimeError], fail))


class _Failed(jinja2.StrictUndefined):
    """A failed value; inside a list or mapping that is printed whole, printing it fails too
    (a StrictUndefined's repr would print ``Undefined``)."""

    __slots__ = ()
    __repr__ = jinja2.StrictUndefined._fail_with_undefined_error


class LazyContext(jinja2.runtime.Context):
    """Jinja's context, rendering a ``Pending`` value when it is read (and telling the resolver
    what a value being rendered reads). Copies of the context (an include, a macro) keep the
    markers and the resolver: they resolve alike."""

    def resolve_or_missing(self, key: str) -> Any:
        if key in self.vars:
            return self.vars[key]
        parent = self.parent
        value = parent.get(key, missing)
        resolver = parent.get(RESOLVER)
        if resolver is not None:
            if resolver.stack:
                resolver.note(key)
            if type(value) is Pending:
                return resolver.resolve(key, value, self.environment)
        return value


_COMPILED: ByIdentity[tuple[bool, jinja2.Template]] = ByIdentity(65536)


def _compiled(env: jinja2.Environment, text: str) -> tuple[bool, jinja2.Template]:
    """(whether ``text`` is one expression, its template): a one-expression string compiles to
    an assignment of its value (read back as it is), any other to a template that prints."""
    key = (id(env), text)
    hit = _COMPILED.get(key)
    if hit is None:
        body = env.parse(text).body
        single = (len(body) == 1 and isinstance(body[0], nodes.Output) and len(body[0].nodes) == 1
                  and not isinstance(body[0].nodes[0], nodes.TemplateData) and text.startswith("{{")
                  and text.endswith("}}"))
        if single:
            tpl = env.compile_expression(text[2:-2].strip("-+"), undefined_to_none=False)._template
        else:
            tpl = env.from_string(text)
        hit = _COMPILED.put(key, (single, tpl), env)
    return hit


class Resolver:
    """The variables of one context (a service on a node, or a peer as hostvars shows it).
    ``ctx``: the context itself (markers and all); ``origin``: a variable's FILE:LINE;
    ``per_node``: whether a name reads the same for every service of the node; ``shared``: the
    node's cache of values that read only such names (None: this context has pinned values)."""

    def __init__(self, ctx: dict[str, Any], origin: Callable[[str], tuple[str, int | None]],
                 per_node: Callable[[str], bool], shared: dict[str, tuple[Any, frozenset[str]]] | None,
                 label: str = "") -> None:
        self.ctx, self.origin, self.per_node, self.shared, self.label = ctx, origin, per_node, shared, label
        self.cache: dict[str, tuple[Any, frozenset[str], bool]] = {}
        self.stack: list[list[Any]] = []  # [name, per node so far] of each value being rendered

    def note(self, key: str) -> None:
        if not self.per_node(key):
            for frame in self.stack:
                frame[1] = False

    def _link(self, name: str) -> str:
        file, line = self.origin(name)
        return f"{self.label}{name} ({file}:{line})" if line else f"{self.label}{name} ({file})"

    def _touch(self, files: frozenset[str]) -> None:
        view = self.ctx.get("secrets")
        if files and view is not None:
            view._touched |= files  # the view's mark: what the file or string being rendered read

    def resolve(self, name: str, pending: Pending, env: jinja2.Environment) -> Any:
        hit = self.cache.get(name)
        # A service's own default (service_uwsgi_config_port: "{{ keystone_port }}") is that
        # service's even when it reads only node variables: never from or into the node's cache.
        own = self.per_node(name)
        if hit is None and own and self.shared is not None and name in self.shared:
            value, files = self.shared[name]
            hit = self.cache[name] = (value, files, True)
        if hit is not None:
            self._touch(hit[1])
            if not hit[2]:
                self.note("service")
            return hit[0]
        if any(frame[0] == name for frame in self.stack):
            names = [f[0] for f in self.stack]
            loop = " -> ".join([*names[names.index(name):], name])
            file, line = self.origin(self.stack[-1][0])
            raise VarError([], f"{self.label}{name}: the variables refer to each other in a cycle ({loop})", file,
                           line)
        view = self.ctx.get("secrets")
        before = view._touched if view is not None else set()
        if view is not None:
            view._touched = set()
        frame: list[Any] = [name, own]
        self.stack.append(frame)
        try:
            value = self._value(name, pending.raw, env)
        finally:
            self.stack.pop()
            files = frozenset(view._touched) if view is not None else frozenset()
            if view is not None:
                view._touched = before | files
        self.cache[name] = (value, files, bool(frame[1]))
        if frame[1] and self.shared is not None:
            self.shared[name] = (value, files)
        elif not frame[1]:
            self.note("service")  # what read this value reads per service too
        return value

    def _value(self, name: str, raw: Any, env: jinja2.Environment) -> Any:
        """The value, or an undefined one that raises the error where it is used: Jinja
        resolves every name a template mentions as it starts, so a branch not taken must not
        fail (ansible-core 2.19 defers the error alike, with its markers)."""
        try:
            return self._render(raw, env, name)
        except VarError as exc:
            error = exc.under(self._link(name))
        except jinja2.UndefinedError as exc:
            found = _UNDEFINED.fullmatch(exc.message or "")
            error = self._error(name, f"undefined {found.group(1)!r}" if found else str(exc.message))
        except RenderLimit:
            raise
        except SecretUnreadable as exc:  # as it is: the agent tells it from a mistake by its type
            unreadable = exc  # ``exc`` is unbound after the block
            return jinja2.StrictUndefined(hint=str(exc), exc=cast(type[jinja2.exceptions.TemplateRuntimeError],
                                                                  lambda _message: unreadable))
        except jinja2.TemplateSyntaxError as exc:
            error = self._error(name, f"template syntax error: {exc.message}")
        except jinja2.exceptions.SecurityError as exc:
            error = self._error(name, f"unsafe template: {exc}")
        except RenderError as exc:
            error = self._error(name, str(exc).split(": ", 1)[1] if exc.file else str(exc))
        except Exception as exc:  # what an expression raises (1/0, a filter's refusal)
            error = self._error(name, f"{type(exc).__name__}: {exc}")
        return _undefined(error)

    def _error(self, name: str, tail: str) -> VarError:
        file, line = self.origin(name)
        return VarError([self._link(name)], tail, file, line)

    def _render(self, raw: Any, env: jinja2.Environment, name: str) -> Any:
        # An element of a list or mapping that fails is undefined where it is read, not the
        # whole value (ansible-core 2.19 renders a container's elements as they are read):
        # kolla's neutron_services['neutron-server'].wsgi is there even where another entry's
        # volumes read a fact the node does not have.
        if isinstance(raw, str):
            return self._string(raw, env) if "{{" in raw or "{%" in raw else raw
        if isinstance(raw, Mapping):
            return {k: self._value(name, v, env) if templated(v) else v for k, v in raw.items()}
        if isinstance(raw, list | tuple):
            return [self._value(name, v, env) if templated(v) else v for v in raw]
        return raw

    def _string(self, text: str, env: jinja2.Environment) -> Any:
        single, tpl = _compiled(env, text)
        context = env.context_class(env, self.ctx, tpl.name, tpl.blocks)
        chunks = list(tpl.root_render_func(context))
        if single:
            value = context.vars["result"]
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()  # the name and the chain to it, as printing it would
            return value
        out = "".join(chunks)
        budget = budget_now()
        if budget is not None:
            budget.value(len(out))
        return out


class PeerVars(Mapping[str, Any]):
    """``hostvars[peer]``: the peer's variables, a templated one rendered in the peer's context."""

    def __init__(self, values: Mapping[str, Any], resolver: Callable[[], Resolver], env: Sandbox) -> None:
        self._values, self._resolver, self._env = values, resolver, env

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        if templated(value):
            return self._resolver().resolve(key, Pending(value), self._env)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr({k: self[k] for k in self._values})


class LazyHostvars(Mapping[str, PeerVars]):
    """``hostvars``: node name -> ``PeerVars``, each made when first read."""

    def __init__(self, raw: Mapping[str, Mapping[str, Any]], peer: Callable[[str], PeerVars]) -> None:
        self._raw, self._peer = raw, peer

    def __getitem__(self, node: str) -> PeerVars:
        if node not in self._raw:
            raise KeyError(node)
        return self._peer(node)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"<hostvars: {len(self._raw)} nodes>"


# What ``variables.context`` builds on in a repo with templated variables.

_GLOBALS = frozenset(jinja2.defaults.DEFAULT_NAMESPACE)
_DEFAULTS: ByIdentity[tuple[str, ...]] = ByIdentity(4096)
_PEERS: ByIdentity[Resolver] = ByIdentity(65536)


def _templated_defaults(svc: ServiceDef) -> tuple[str, ...]:
    hit = _DEFAULTS.get(id(svc))
    if hit is None:
        hit = _DEFAULTS.put(id(svc), tuple(k for k, v in svc.defaults.items() if templated(v)), svc)
    return hit


def _origin(repo: DeploymentRepo, node: str, svc: ServiceDef | None) -> Callable[[str], tuple[str, int | None]]:
    """Where the value a name has on ``node`` is written, by the precedence of ``node_vars``."""
    def origin(name: str) -> tuple[str, int | None]:
        nd, lines = repo.node(node), repo.inventory_lines
        if name in nd.vars:
            return "inventory.yaml", lines.get(("nodes", node, "vars", name))
        for group in reversed(nd.groups):
            if name in repo.groups[group].vars:
                return "inventory.yaml", lines.get(("groups", group, "vars", name))
        if name in repo.vars:
            return "inventory.yaml", lines.get(("vars", name))
        if svc is not None and name in svc.defaults:
            return svc.file, svc.lines.get(f"defaults/{name}")
        return "inventory.yaml", None

    return origin


def lazy_context(repo: DeploymentRepo, node: str, svc: ServiceDef, ctx: dict[str, Any], node_vars: Mapping[str, Any],
                 own: Mapping[str, Any], shared: dict[str, Any], pinned: Mapping[str, Any] | None) -> None:
    """Make ``ctx`` (a service's context on ``node``, built over ``node_vars``, already marked)
    resolve its templated values: its templated defaults marked, and its resolver."""
    for key in _templated_defaults(svc):
        if ctx.get(key) is svc.defaults[key]:  # the default is what the context holds
            ctx[key] = Pending(svc.defaults[key])

    def per_node(key: str) -> bool:
        if key in node_vars or key in own or key == "inventory_hostname":
            return key not in _NOT_PER_NODE
        return key in _GLOBALS and key not in svc.defaults

    ctx[RESOLVER] = Resolver(ctx, _origin(repo, node, svc), per_node, None if pinned else shared)


def lazy_hostvars(repo: DeploymentRepo, raw: Mapping[str, Mapping[str, Any]]) -> LazyHostvars:
    made: dict[str, PeerVars] = {}

    def peer(node: str) -> PeerVars:
        if node not in made:
            made[node] = PeerVars(raw[node], lambda: _peer(repo, node), _peer_env(repo.template_dialect))
        return made[node]

    return LazyHostvars(raw, peer)


_PEER_ENVS: dict[str, Sandbox] = {}
# How a sandbox is made: set by ``environment``, which imports this module (never the reverse).
make_environment: Callable[[str], Sandbox] | None = None


def _peer_env(dialect: str) -> Sandbox:
    """The sandbox a peer's values render in: the dialect's, with no template to include."""
    if dialect not in _PEER_ENVS:
        assert make_environment is not None, "reconciler.render.environment sets it when imported"
        _PEER_ENVS[dialect] = make_environment(dialect)
    return _PEER_ENVS[dialect]


def _peer(repo: DeploymentRepo, node: str) -> Resolver:
    """The resolver of ``node``'s variables as ``hostvars`` shows them to any node."""
    hit = _PEERS.get((id(repo), node))
    if hit is None:
        placement = repo.planes[node]
        groups, hostvars = repo.peers(node)
        ctx = {**_peer_env(repo.template_dialect).globals, **marked(repo.node_vars(node)), "node": node,
               "release": placement.release, "pending_release": placement.pending, "groups": groups,
               "hostvars": lazy_hostvars(repo, hostvars)}
        if repo.template_dialect == "ansible":
            ctx["inventory_hostname"] = node
        hit = ctx[RESOLVER] = Resolver(ctx, _origin(repo, node, None), lambda _key: True, None,
                                       f"hostvars[{node!r}].")
        _PEERS.put((id(repo), node), hit, repo)
    return hit
