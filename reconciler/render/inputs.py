"""What a service's render reads, and whether any of it changed between two commits. Pure.

``reconciler diff`` at fleet scale renders every node's services at two commits; most of them
come out the same. A service's render for a node is a function of (see ``render``):

- the service's definition: its service.yaml and every file under its ``templates/`` and
  ``files/`` (an include, import or extends reads only its own service's templates, so all of
  them stand in for "the templates it includes", however the name is computed), with the
  override files its ``merge`` entries may read and the variables their paths name;
- the variables its templates and inline strings name (``jinja2.meta``: exactly the names the
  compiled code resolves from the context), each with its value for the node: the node's
  variables over the service's defaults; ``release``; of ``hostvars``, the keys read as
  ``hostvars[<any node>].<key>`` (``port_base`` of every node: which peer a template picks is
  computed, the key is not), of ``groups`` the groups read by name (``groups.controllers``);
  either compared whole when a template uses it any other way (a loop over ``hostvars``,
  ``groups[role]``, ``hostvars[peer].items()``);
- the node's secrets view (its files' markers or values decide which files are secret files,
  even for a template that never names ``secrets``);
- the node's own settings the render reads: its driver for the service, ``manual``, the
  services it runs (``depends_on`` is filtered by them), the repo's ``defaults`` and limits;
- its placement (release, pending release, mode, VIP attachment): while two control planes run
  side by side, every service of every node is rendered (peers differ per node).

With templated variables (reconciler.yaml ``templates.variables``), a name is read also through
the variables, defaults and peers' variables whose values name it, however deep: a variable
that changed counts for every one whose value reaches it (``_reached``), and a peer's templated
variable is compared as the whole of ``hostvars`` (it may read any of the peer's).

Two values are the same only when they print the same: same types (``1`` is not ``True``) and
same key order (a template may loop over a mapping), compared recursively.
When all of that is the same at both commits the render is too, so ``diff`` need not run it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import meta, nodes

from reconciler.core.errors import ReconcilerError
from reconciler.core.memo import ByIdentity
from reconciler.render.lazyvars import templated
from reconciler.render.variables import secret_view
from reconciler.repo.definitions import DeploymentRepo, ServiceDef

# Names the render sets itself (see ``render.context``), compared as described above.
_OWN = frozenset({"node", "service", "service_version", "release", "pending_release", "groups", "hostvars",
                  "secrets"})
_MISSING = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})


def same(a: Any, b: Any) -> bool:
    """Equal as a template sees it: same type, same keys in the same order, recursively."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) in _SCALARS:  # most values: no ABC check on the way to ==
        return bool(a == b)
    if isinstance(a, Mapping):
        return len(a) == len(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    try:
        return bool(a == b)
    except Exception:  # a value with no sane equality: say it changed, the render will tell
        return False


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a variable's value, however deep (what may be a template)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings_in(v)


class _AnyFilter(dict[str, Any]):
    """Every filter or test name known to the parser: which names a template reads does not
    depend on the dialect's filters (``find_undeclared_variables`` compiles, and an unknown
    filter would make every Ansible-dialect template "reads anything", rendered at every diff)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, str)


_PARSER = jinja2.Environment()  # parses only; the syntax is the sandbox's (same default delimiters)
_PARSER.filters = _AnyFilter(_PARSER.filters)
_PARSER.tests = _AnyFilter(_PARSER.tests)
# Reads a variable by a computed name: which one is not in the text.
_LOOKUP_VARS = re.compile(r"\b(?:lookup|query|q)\(\s*['\"](?:ansible\.builtin\.)?vars['\"]")
# kolla's ``kolla_address`` reads hostvars[node].<network>_interface, <network>_address_family,
# ansible_facts and <interface>_address without the template naming any of them.
_READS_HOSTVARS = ("kolla_address",)


@functools.lru_cache(maxsize=65536)
def _names_in(text: str) -> frozenset[str] | None:
    """The names a templated value reads; None when it does not parse or reads a variable by a
    computed name (it reads anything)."""
    try:
        found = meta.find_undeclared_variables(_PARSER.parse(text))
    except jinja2.TemplateSyntaxError:
        return None
    if _LOOKUP_VARS.search(text):
        return None
    return frozenset(found | {"hostvars"}) if any(f in text for f in _READS_HOSTVARS) else frozenset(found)


def _refs(value: Any) -> frozenset[str] | None:
    found: set[str] = set()
    for text in strings_in(value):
        if "{{" in text or "{%" in text:
            names = _names_in(text)
            if names is None:
                return None
            found |= names
    return frozenset(found)


def _reached(changed: set[str], layers: Iterable[Mapping[str, Any]]) -> set[str]:
    """``changed`` and every variable of ``layers`` whose templated value reads one of them,
    directly or through others."""
    readers: dict[str, set[str]] = {}
    out = set(changed)
    for layer in layers:
        for name, value in layer.items():
            if templated(value):
                refs = _refs(value)
                if refs is None:
                    out.add(name)
                for ref in refs or ():
                    readers.setdefault(ref, set()).add(name)
    todo = list(out)
    while todo:
        for reader in readers.get(todo.pop(), ()):
            if reader not in out:
                out.add(reader)
                todo.append(reader)
    return out


class _Whole(Exception):
    """A template uses ``hostvars`` or ``groups`` as a whole (loops over it, passes it on)."""


@dataclasses.dataclass(frozen=True)
class Reads:
    """What a service's render reads from its context."""

    names: frozenset[str]  # every name resolved
    # The variables read as hostvars[<any node>].<key>: None when hostvars is used otherwise.
    hostvars: frozenset[str] | None
    groups: frozenset[str] | None  # the groups read as groups.<name> / groups['name'], likewise


def _key(lookup: nodes.Node) -> str | None:
    """The constant key of ``x.key`` or ``x['key']``; None for a computed one."""
    if isinstance(lookup, nodes.Getattr):
        return lookup.attr
    if isinstance(lookup, nodes.Getitem) and isinstance(lookup.arg, nodes.Const) and isinstance(lookup.arg.value, str):
        return lookup.arg.value
    return None


def _lookups(ast: nodes.Node, name: str, depth: int) -> set[str]:
    """The constant keys read at ``depth`` below ``name``: ``hostvars[peer].port_base`` is
    port_base at depth 2, ``groups.controllers`` is controllers at depth 1. Any other use of
    ``name`` (a loop over it, a computed key at that depth, a dict method such as ``.items``,
    an assignment to the name) raises ``_Whole``."""
    keys: set[str] = set()

    def visit(node: nodes.Node, parents: tuple[nodes.Node, ...]) -> None:
        if isinstance(node, nodes.Name) and node.name == name:
            chain = [node, *parents[:depth]]
            if node.ctx != "load" or len(chain) <= depth or not all(
                    isinstance(up, nodes.Getattr | nodes.Getitem) and getattr(up, "node", None) is below
                    for below, up in zip(chain, chain[1:], strict=False)):
                raise _Whole
            key = _key(chain[depth])
            if key is None or hasattr(dict, key):  # hostvars[x].items() reads everything
                raise _Whole
            keys.add(key)
            return
        for child in node.iter_child_nodes():
            visit(child, (node, *parents))

    visit(ast, ())
    return keys


def _reads_of(asts: list[nodes.Template]) -> Reads:
    found: set[str] = set()
    for ast in asts:
        found |= meta.find_undeclared_variables(ast)
    parts: dict[str, frozenset[str] | None] = {}
    if any(f.name in _READS_HOSTVARS for ast in asts for f in ast.find_all(nodes.Filter)):
        return Reads(frozenset(found | {"hostvars"}), None, _groups(asts))  # hostvars whole: see _READS_HOSTVARS
    for name, depth in (("hostvars", 2), ("groups", 1)):
        try:
            parts[name] = frozenset(k for ast in asts for k in _lookups(ast, name, depth))
        except _Whole:
            parts[name] = None
    return Reads(frozenset(found), parts["hostvars"], parts["groups"])


def _groups(asts: list[nodes.Template]) -> frozenset[str] | None:
    try:
        return frozenset(k for ast in asts for k in _lookups(ast, "groups", 1))
    except _Whole:
        return None


def names_read(svc: ServiceDef) -> Reads | None:
    """Every context name the service's templates and inline strings resolve, and what they read
    of hostvars and groups; None when one does not parse (then it is rendered, and the render
    reports the error as it always did). Parsed once per service definition (by identity)."""
    hit = _READS.get(id(svc))
    if hit is None:
        hit = _READS.put(id(svc), (_names_read(svc),), svc)
    return hit[0]


_READS: ByIdentity[tuple[Reads | None]] = ByIdentity(4096)


def _names_read(svc: ServiceDef) -> Reads | None:
    texts = [*svc.templates.values(), *(s for s in strings_in(
        [svc.command, svc.env, svc.health, svc.container, svc.drain, svc.undrain]) if "{" in s),
             *(s for f in svc.files if f.merge for s in f.merge.sources if "{" in s)]  # a merge's paths
    if any(_LOOKUP_VARS.search(text) for text in texts):
        return None
    try:
        return _reads_of([_PARSER.parse(text) for text in texts])
    except jinja2.TemplateSyntaxError:
        return None


class Inputs:
    """The services of a node whose inputs differ between ``a`` and ``b`` (both loaded repos)."""

    def __init__(self, a: DeploymentRepo, b: DeploymentRepo) -> None:
        self.a, self.b = a, b
        self._services: dict[str, Reads | None] = {}  # same definition: what it reads
        self._whole: dict[str, bool] = {}
        self._hostvar: dict[str, bool] = {}
        self._group: dict[str, bool] = {}
        self._global: dict[str, Reads | None] = {}
        self._by_shape: dict[tuple[tuple[str, ...], frozenset[str]], frozenset[str]] = {}
        # What every render reads besides its names: the health timeout default, the driver
        # default and the limits.
        self.repo_same = same(a.settings.get("defaults"), b.settings.get("defaults")) and same(a.limits, b.limits)
        self.secrets_same = same(a.unlocked, b.unlocked) and same(dict(a.secret_files), dict(b.secret_files))
        self.templated = a.template_variables or b.template_variables

    def _names(self, name: str) -> Reads | None:
        """Names read by service ``name`` if its definition is the same at both commits."""
        if name not in self._services:
            sa, sb = self.a.services.get(name), self.b.services.get(name)
            self._services[name] = names_read(sb) if sa is not None and sb is not None and same(sa, sb) else None
        return self._services[name]

    def _whole_same(self, what: str) -> bool:
        if what not in self._whole:
            self._whole[what] = same(getattr(self.a, what), getattr(self.b, what))
        return self._whole[what]

    def _hostvar_same(self, key: str) -> bool:
        """hostvars[n][key] the same for every node n (and the same nodes, in the same order)."""
        if key not in self._hostvar:
            ha, hb = self.a.hostvars, self.b.hostvars
            self._hostvar[key] = list(ha) == list(hb) and all(
                same(ha[n].get(key, _MISSING), hb[n].get(key, _MISSING)) for n in ha)
            if self._hostvar[key] and self.templated and any(templated(ha[n].get(key)) for n in ha):
                self._hostvar[key] = self._whole_same("hostvars")  # rendered with the peer's variables
        return self._hostvar[key]

    def _group_same(self, group: str) -> bool:
        if group not in self._group:
            self._group[group] = same(self.a.group_members.get(group, _MISSING),
                                      self.b.group_members.get(group, _MISSING))
        return self._group[group]

    def _reads_same(self, reads: Reads, n: str) -> bool:
        """One of the render's own names (see ``render.context``) the same at both commits."""
        if n == "release":
            return self._whole_same("release")
        if n == "hostvars":
            if reads.hostvars is None:
                return self._whole_same("hostvars")
            return all(self._hostvar_same(k) for k in reads.hostvars)
        if n == "groups":
            if reads.groups is None:
                return self._whole_same("group_members")
            return all(self._group_same(g) for g in reads.groups)
        return True  # node, service, service_version (in the definition), secrets (per node)

    def _secrets_of_node_same(self, node: str, vars_a: Mapping[str, Any], vars_b: Mapping[str, Any]) -> bool:
        if not self.a.secret_files and not self.b.secret_files and self.a.unlocked is None and self.b.unlocked is None:
            return True
        if self.secrets_same and self.a.unlocked is None:
            # A reviewer's view is decided by the files and the node's age_recipient alone.
            return same(vars_a.get("age_recipient"), vars_b.get("age_recipient"))
        try:
            va, vb = secret_view(self.a, node), secret_view(self.b, node)
        except ReconcilerError:
            return False  # rendered, so the error is the render's
        return same(va._values, vb._values) and same(va._elsewhere, vb._elsewhere)

    def _service_same(self, name: str) -> Reads | None:
        """What service ``name`` reads, when its definition and everything it reads beyond the
        node's own variables are the same at both commits; else None (render it everywhere)."""
        if name not in self._global:
            reads = self._names(name)
            ok = reads is not None and all(self._reads_same(reads, n) for n in reads.names & _OWN)
            self._global[name] = reads if ok else None
        return self._global[name]

    def changed(self, node: str) -> frozenset[str]:
        """The services of ``node`` (at either commit) that must be rendered at both: every one
        whose inputs differ, or that the node runs at one commit only."""
        a, b = self.a, self.b
        mine_a = a.services_of(node) if node in a.nodes else ()
        mine_b = b.services_of(node) if node in b.nodes else ()
        everything = frozenset(mine_a) | frozenset(mine_b)
        if (not self.repo_same or mine_a != mine_b or node not in a.nodes or node not in b.nodes
                or a.node(node).manual != b.node(node).manual or a.node(node).driver != b.node(node).driver):
            return everything  # the driver: a service's own is in its definition, the default above
        if a.planes.active or b.planes.active or a.planes[node] != b.planes[node]:
            # Two planes: peers and VIP networks are per node (see ``repo.planes``); rendered
            # whole while the fleet runs them side by side.
            return everything
        vars_a, vars_b = a.hostvars[node], b.hostvars[node]  # its variables, merged once per repo
        if not self._secrets_of_node_same(node, vars_a, vars_b):
            return everything
        # A name in neither is the service's default at both (the definition is the same); one
        # in only one of them is counted changed, whatever the default says.
        differ = {n for n in vars_a.keys() | vars_b.keys()
                  if not same(vars_a.get(n, _MISSING), vars_b.get(n, _MISSING))} - _OWN
        if not self.templated:
            # The answer reads only the services and the names that differ: the nodes of a group
            # whose own variables did not change share it, worked out once.
            key = (mine_b, frozenset(differ))
            hit = self._by_shape.get(key)
            if hit is None:
                hit = self._by_shape[key] = frozenset(
                    name for name in mine_b if (reads := self._service_same(name)) is None
                    or not differ.isdisjoint(reads.names))
            return hit
        # What a templated value may read besides variables, where it changed.
        own = {n for n, what in (("hostvars", "hostvars"), ("groups", "group_members"), ("release", "release"))
               if not self._whole_same(what)}
        differ = _reached(differ | own, (vars_a, vars_b))
        out = set()
        for name in mine_b:
            reads = self._service_same(name)
            reached = differ
            if reads is not None and b.services[name].defaults:
                reached = _reached(differ, (b.services[name].defaults,))  # its defaults are the same at both
            if reads is None or not (reached - _OWN).isdisjoint(reads.names):
                out.add(name)
        return frozenset(out)
