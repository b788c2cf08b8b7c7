"""A node's facts as its templates read them: ``facts`` (and ``ansible_facts`` in the Ansible
dialect, also as ``hostvars[node].ansible_facts``, where kolla's ``kolla_address`` looks).

Where they come from is the caller's: on the node, what it gathered this pass
(``node.facts``); in a review, what the node last published in its note, else none. The
inventory wins over both: a node variable ``facts:`` (or ``ansible_facts:``) is what its
templates read on the node and in review alike, so the two render the same bytes. Facts known
from nowhere are an error when a template reads them, never an empty value.

``NodeFacts`` remembers whether a template read them, and which of the node's gathered facts
it was handed (``reads``: a key, an interface; ``core.model.facts.subjects``): the agent
re-gathers on an idle poll only when the slice it runs read them, and renders again only when
one of those changed (a VM's tap device appearing changes nothing a template read of the
hostname).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from reconciler.core.errors import RenderError
from reconciler.core.model.facts import ALL, INTERFACES, Facts, subjects


class NodeFacts:
    """One node's facts for its renders, and whether one read them. ``source``: where they
    come from, as a review says it ("gathered", "published at ...", "none")."""

    def __init__(self, facts: Facts | None, source: str = "gathered") -> None:
        self.facts = facts
        self.source = source
        self.read = False
        self.reads: set[str] = set()  # what of ``facts`` a template was handed (not of stand-ins)


class FactsView(Mapping[str, Any]):
    """``facts`` (or ``ansible_facts``) in a template: noting that it was read; with no facts
    known, an error naming the node and what would give them."""

    def __init__(self, node: str, holder: NodeFacts, name: str, values: Mapping[str, Any] | None,
                 tracked: bool = True) -> None:
        self._node, self._holder, self._name, self._values = node, holder, name, values
        self._tracked = tracked and holder.facts is not None  # the node's own facts, not stand-ins

    def _seen(self, *read: str) -> Mapping[str, Any]:
        self._holder.read = True
        if self._tracked:
            self._holder.reads.update(read)
        if self._values is None:
            raise RenderError(f"node {self._node}: {self._name} are not known here ({self._holder.source}): the node "
                              f"publishes them in its note once it ran; in review, a node variable "
                              f"'{self._name}' is the stand-in")
        return self._values

    @property
    def known(self) -> bool:
        return self._values is not None

    def __getitem__(self, key: str) -> Any:
        if not self._tracked:
            return self._seen()[key]
        assert self._holder.facts is not None
        value = self._seen(*subjects(self._holder.facts, key, self._name))[key]
        if self._name == "facts" and key == INTERFACES:  # each interface read as it is handed out
            return _Interfaces(self._holder, value)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._seen(ALL))

    def __len__(self) -> int:
        return len(self._seen(ALL))

    def __repr__(self) -> str:
        return repr(dict(self._seen(ALL)))


class _Interfaces(Mapping[str, Any]):
    """``facts.interfaces``: noting which interface a template looks at ("if NAME", found or
    not), and that it went through the list of them ("interfaces")."""

    def __init__(self, holder: NodeFacts, values: Mapping[str, Any]) -> None:
        self._holder, self._values = holder, values

    def __getitem__(self, name: str) -> Any:
        self._holder.reads.add(f"if {name}")
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        self._holder.reads.add(INTERFACES)
        return iter(self._values)

    def __len__(self) -> int:
        self._holder.reads.add(INTERFACES)
        return len(self._values)

    def __repr__(self) -> str:
        self._holder.reads.add(ALL)
        return repr(dict(self._values))


def views(node: str, holder: NodeFacts | None, node_vars: Mapping[str, Any], dialect: str) -> dict[str, Any]:
    """The names the render sets for the node's facts: ``facts``, and in the Ansible dialect
    ``ansible_facts``, each unless the inventory sets it (then its value stands)."""
    holder = holder or NodeFacts(None, "none published, no stand-in")
    facts = holder.facts
    out: dict[str, Any] = {}
    names = {"facts": facts.template() if facts else None}
    if dialect == "ansible":
        names["ansible_facts"] = facts.ansible() if facts else None
    for name, values in names.items():
        if name not in node_vars:
            out[name] = FactsView(node, holder, name, values)
        elif isinstance(node_vars[name], Mapping):  # the inventory's stand-ins: their reads noted all the same
            holder.source = "the inventory's stand-ins"
            out[name] = FactsView(node, holder, name, node_vars[name], tracked=False)
    return out


def with_own(hostvars: Mapping[str, Mapping[str, Any]], node: str,
             own: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    """``hostvars`` with the node's own ``ansible_facts`` in its entry (as Ansible's has them);
    other nodes' are their inventory's stand-ins only, on the node and in review alike. Facts
    known from nowhere are not put there: ``kolla_address`` then reads ``<iface>_address``."""
    view = own.get("ansible_facts")
    if not isinstance(view, FactsView) or not view.known or node not in hostvars:
        return hostvars
    return {**hostvars, node: {**hostvars[node], "ansible_facts": own["ansible_facts"]}}
