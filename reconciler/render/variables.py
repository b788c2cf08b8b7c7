"""What a template reads: the context of a service's render on one node, and the node's
secrets as templates see them (``SecretView``).

Context of every template, runtime string and health target:

- every variable, precedence low to high: the service's ``defaults``, the repo's ``vars``, the
  node's groups' ``vars`` (in the order the node lists its groups), the node's own ``vars``;
- ``node`` (this node's name), ``service`` (this service's name), ``release`` (the node's own,
  else the inventory's), ``pending_release`` (the release it is being deployed as, or "");
- ``groups``: group name -> sorted member node names;
- ``hostvars``: node name -> that node's variables (without service defaults);
  both only of the nodes of its own plane when it, or they, are split off (an isolated node, the
  old plane after a cutover: see ``repo.planes``);
- ``inventory_hostname`` (the node's name, as Ansible calls it), in the Ansible template dialect
  only (reconciler.yaml ``templates.dialect``);
- ``facts`` (and ``ansible_facts`` in the Ansible dialect): the node's facts, gathered on the node,
  its last published ones in review; a node variable of that name wins (see ``facts``);
- with templated variables (reconciler.yaml ``templates.variables``), a value holding ``{{`` or
  ``{%`` rendered when read, against this context (see ``lazyvars``);
- ``secrets``: name -> value, from the ``secrets/*.yaml`` files this node can decrypt (the
  agent's identity; see ``secrets``). Without a key (review, validate) the values are markers
  ``<secret NAME HASH>``, for the files encrypted to the node's ``age_recipient`` variable.

The commit id is deliberately not in the context: a slice must change only when its inputs do.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.errors import RenderError
from reconciler.render.facts import NodeFacts, views, with_own
from reconciler.render.secrets import SecretUnreadable, file_key, named_values, placeholders
from reconciler.repo.definitions import DeploymentRepo, ServiceDef
from reconciler.repo.sops import recipient_id


class SecretView(Mapping[str, Any]):
    """``secrets`` in a template: the node's secrets by name. It notes that it was read (the
    file being rendered is then a secret file), and a name this node cannot read is an error
    naming the file that defines it, never an empty value."""

    def __init__(self, node: str, values: Mapping[str, Any], origin: Mapping[str, str], elsewhere: Mapping[str, str],
                 why: str, hash_keys: Mapping[str, bytes]) -> None:
        self._node = node
        self._values = dict(values)
        self._origin = dict(origin)  # name -> the file defining it
        self._elsewhere = dict(elsewhere)  # name -> the file defining it, which this node cannot read
        self._why = why
        self._hash_keys = dict(hash_keys)  # file -> its Opened.hash_key (on the node only)
        # Private (the sandbox refuses ``_`` names): a template cannot read the values as a set,
        # nor clear the mark of the file it is printing. ``_touched``: the files read since the mark.
        self._touched: set[str] = set()
        # Every value as text, per file, to recognise it in what is rendered.
        self._texts = {path: frozenset(text for _, text in named_values({n: v for n, v in self._values.items()
                                                                          if self._origin[n] == path}))
                       for path in sorted(set(self._origin.values()))}

    def __getitem__(self, name: str) -> Any:
        if name in self._values:
            self._touched.add(self._origin[name])
            return self._values[name]
        if name in self._elsewhere:
            raise SecretUnreadable(f"secrets.{name} is in {self._elsewhere[name]}, which node {self._node} cannot "
                                   f"decrypt ({self._why})")
        raise RenderError(f"secrets.{name}: no such secret in secrets/*.yaml")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __iter__(self) -> Iterator[str]:
        self._touched.update(self._origin.values())
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<secrets: {len(self._values)} names>"  # what {{ secrets }} prints: never the values


def unmark(view: SecretView) -> None:
    """Forget what was read: the next string or file rendered starts unmarked. A function, not a
    method: a template could call a method of the view it reads."""
    view._touched = set()


def holds_secret(view: SecretView, text: str | bytes) -> frozenset[str]:
    """The secret files whose values what was just rendered read, or holds as they are: none
    for a text with no secret in it."""
    if not view._texts:
        return frozenset(view._touched)
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return frozenset(view._touched | {path for path, texts in view._texts.items() if any(t in text for t in texts)})


def holds_any_secret(view: SecretView, texts: Iterable[str]) -> bool:
    """Whether one of ``texts`` holds one of the view's values as it is; False at once for a
    view with none (most nodes), without looking."""
    return bool(view._texts) and any(holds_secret(view, text) for text in texts)


def secret_file_key(view: SecretView, used: frozenset[str]) -> bytes:
    """The key a secret file's hash is keyed with: from the files it holds values of (b"" in a
    reviewer's render, where it holds markers)."""
    return file_key([view._hash_keys[p] for p in sorted(used) if p in view._hash_keys])


def secret_view(repo: DeploymentRepo, node: str) -> SecretView:
    """The secrets this node reads: the files it decrypted (on the node), or without a key the
    files encrypted to its ``age_recipient`` (a reviewer's render: markers, not values)."""
    hash_keys: dict[str, bytes] = {}
    if repo.unlocked is not None:
        readable: dict[str, Mapping[str, Any]] = {p: f.values for p, f in repo.unlocked.items()}
        hash_keys = {p: f.hash_key for p, f in repo.unlocked.items()}
        why = ("no age identity is configured on it: secrets.age_identity or --age-identity" if repo.no_identity
               else "its age key is not among the file's recipients")
    else:
        mine = repo.node_vars(node).get("age_recipient") or ()
        # an ssh public key is compared without its comment, as the file's recipients are
        mine = {recipient_id(str(r)) for r in ([mine] if isinstance(mine, str) else mine)}
        readable = {p: placeholders(f) for p, f in repo.secret_files.items() if mine & set(f.recipients)}
        why = ("the file is not encrypted to its age_recipient" if mine else
               "it has no age_recipient variable in the inventory")
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for path in sorted(readable):
        for name, value in readable[path].items():
            if name in origin:
                raise RenderError(f"node {node}: secrets.{name} is defined in {origin[name]} and {path}, "
                                  "both readable by this node", file=path)
            values[name], origin[name] = value, path
    elsewhere = {name: path for path, f in sorted(repo.secret_files.items()) if path not in readable
                 for name in f.names if name not in origin}
    return SecretView(node, values, origin, elsewhere, why, hash_keys)


@dataclass(frozen=True)
class NodeShare:
    """What every service of one node reads alike, computed once per node, not once per service
    (at 30 services a node, most of a render's own cost)."""

    vars: Mapping[str, Any]
    services: frozenset[str]
    secrets: SecretView
    release: str
    pending: str
    attached: bool
    groups: Mapping[str, list[str]]
    hostvars: Mapping[str, Mapping[str, Any]]
    node: str
    # With templated variables (``lazyvars``): the values rendered that every service of the node
    # reads alike, so each renders once per node.
    resolved: dict[str, Any] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)  # ``facts``/``ansible_facts`` (``render.facts``)

    @functools.cached_property
    def own(self) -> Mapping[str, Any]:
        """What the render sets for the node itself, over every variable."""
        return {"node": self.node, "release": self.release, "pending_release": self.pending, "groups": self.groups,
                "hostvars": self.hostvars, "secrets": self.secrets, **self.facts}

    @functools.cached_property
    def view(self) -> Mapping[str, Any]:
        """The node's variables and ``own`` over them: a service's context is its defaults,
        this, and its own name and version."""
        return {**self.vars, **self.own}


def node_share(repo: DeploymentRepo, node: str, facts: NodeFacts | None = None) -> NodeShare:
    """``facts``: the node's (gathered on it, published in review); None: none known."""
    placement = repo.planes[node]
    groups, peers = repo.peers(node)
    hostvars: Mapping[str, Mapping[str, Any]] = peers
    values: Mapping[str, Any] = repo.node_vars(node)
    seen = views(node, facts, values, repo.template_dialect)
    hostvars = with_own(hostvars, node, seen)
    if repo.template_variables:  # templated values kept as they are, rendered when read
        from reconciler.render.lazyvars import lazy_hostvars, marked

        values, hostvars = marked(values), lazy_hostvars(repo, hostvars)
    return NodeShare(values, frozenset(repo.services_of(node)), secret_view(repo, node),
                     placement.release, placement.pending, placement.attached, groups, hostvars, node, facts=seen)


def context(repo: DeploymentRepo, node: str, svc: ServiceDef, pinned: Mapping[str, Any] | None = None,
            share: NodeShare | None = None, under: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``pinned``: variables an upgrade step holds at a value on this node (over everything but
    the render's own names). ``under``: names everything else is over (the sandbox's globals)."""
    share = share or node_share(repo, node)
    if pinned:
        ctx = {**(under or {}), **svc.defaults, **share.vars, **pinned, **share.own, "service": svc.name,
               "service_version": svc.version}
    else:
        ctx = {**(under or {}), **svc.defaults, **share.view, "service": svc.name, "service_version": svc.version}
    if repo.template_dialect == "ansible":
        ctx["inventory_hostname"] = node  # a magic variable in Ansible: no inventory value overrides it
    if repo.template_variables:
        from reconciler.render.lazyvars import lazy_context

        lazy_context(repo, node, svc, ctx, share.vars, share.own, share.resolved, pinned)
    return ctx
