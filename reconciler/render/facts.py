"""A node's facts as its templates read them: ``facts`` (and ``ansible_facts`` in the Ansible
dialect, also as ``hostvars[node].ansible_facts``, where kolla's ``kolla_address`` looks).

Where they come from is the caller's: on the node, what it gathered this pass
(``node.facts``); in a review, what the node last published in its note, else none. The
inventory wins over both: a node variable ``facts:`` (or ``ansible_facts:``) is what its
templates read on the node and in review alike, so the two render the same bytes. Facts known
from nowhere are an error when a template reads them, never an empty value.

``NodeFacts`` remembers whether a template read them: the agent re-gathers on an idle poll
only when the slice it runs did (a change of facts that no template reads changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from reconciler.core.errors import RenderError
from reconciler.core.model.facts import Facts


class NodeFacts:
    """One node's facts for its renders, and whether one read them. ``source``: where they
    come from, as a review says it ("gathered", "published at ...", "none")."""

    def __init__(self, facts: Facts | None, source: str = "gathered") -> None:
        self.facts = facts
        self.source = source
        self.read = False


class FactsView(Mapping[str, Any]):
    """``facts`` (or ``ansible_facts``) in a template: noting that it was read; with no facts
    known, an error naming the node and what would give them."""

    def __init__(self, node: str, holder: NodeFacts, name: str, values: Mapping[str, Any] | None) -> None:
        self._node, self._holder, self._name, self._values = node, holder, name, values

    def _seen(self) -> Mapping[str, Any]:
        self._holder.read = True
        if self._values is None:
            raise RenderError(f"node {self._node}: {self._name} are not known here ({self._holder.source}): the node "
                              f"publishes them in its note once it ran; in review, a node variable "
                              f"'{self._name}' is the stand-in")
        return self._values

    @property
    def known(self) -> bool:
        return self._values is not None

    def __getitem__(self, key: str) -> Any:
        return self._seen()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._seen())

    def __len__(self) -> int:
        return len(self._seen())

    def __repr__(self) -> str:
        return repr(dict(self._seen()))


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
            out[name] = FactsView(node, holder, name, node_vars[name])
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
