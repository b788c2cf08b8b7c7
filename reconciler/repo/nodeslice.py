"""The repo as one node reads it (issue 40): which services it reads in full, and what it
reads of the others (``load_repo(tree, node=...)``). A node checks what it reads; ``validate``
and the review check everything, and the nodes that run a service refuse it when it is broken.
"""

from __future__ import annotations

from typing import Any

from reconciler.core.yamlfile import YamlDoc
from reconciler.drivers.kinds import ceiling
from reconciler.repo.definitions import ServiceDef
from reconciler.repo.steps import parse_steps


def slice_of(node: str | None, settings: YamlDoc | None, inventory: YamlDoc | None) -> set[str] | None:
    """The services ``node`` runs (by its groups), whose every part it reads; None: it reads
    every service in full (no node given: validate, the review; a node the inventory does not
    name, or that does not parse; VIP networks, whose check reads every service's networks)."""
    if node is None or settings is None or inventory is None or settings.data.get("vip"):
        return None
    nd = inventory.data["nodes"].get(node)
    if nd is None:
        return None
    groups = inventory.data["groups"]
    return {str(s) for g in nd["groups"] if g in groups for s in groups[g].get("services", ())}


def read_of_others(data: Any) -> Any:
    """What a node reads of a service it does not run: its version and image (what an upgrade
    compares) and its upgrade steps and their order (a barrier or a post step waits on them).
    Checked against the same schema: a key the schema checks there is checked as in full."""
    if not isinstance(data, dict):
        return data  # no mapping: refused as a whole, as in full
    out = {k: data[k] for k in ("version", "upgrade", "upgrade_after") if k in data}
    runtime = data.get("runtime")
    if runtime is not None:
        out["runtime"] = {"image": runtime["image"]} if isinstance(runtime, dict) and "image" in runtime else (
            {} if isinstance(runtime, dict) else runtime)
    return out


def other_service(name: str, file: str, doc: YamlDoc) -> ServiceDef:
    """A service this node does not run, as far as it reads it (``read_of_others``)."""
    data = doc.data
    steps = parse_steps(data.get("upgrade", ()))
    return ServiceDef(
        name=name, file=file, driver=None, depends_on=(), command=(), env={},
        container=dict(data.get("runtime", {})), drift="correct", on_change=(), reload={},
        escalate_to=ceiling(None), drain="", manual=False, undrain="", files=(), health={}, defaults={},
        templates={}, sources={}, version=str(data.get("version", "")), upgrade=steps,
        upgrade_after=tuple(str(a) for a in data.get("upgrade_after", ())),
        lines={"runtime": doc.line(("runtime",)), "upgrade_after": doc.line(("upgrade_after",)),
               "upgrade": doc.line(("upgrade",))},
    )
