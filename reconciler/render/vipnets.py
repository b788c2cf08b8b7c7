"""The VIP networks as each node's services render them. Pure.

``repo.checks.check_planes`` judges the network names as a service writes them; a name written
through a variable (``networks: [mgmt, "{{ vip_net }}"]``, the way every other runtime field is
written) is only known rendered, on a node, and may render differently on each node (a site's
VIP network, a plane's). For such a repo this checks the same two things on the rendered names:

- every network of ``vip.networks`` is one some service renders to on some node (a typo in the
  variable, or in the list, would leave the VIP network to nobody);
- no VIP network is rendered by services of attached nodes of two releases at once (both planes
  would answer on the same virtual IPs).

Each problem is said as ``check_planes`` says it, with the node where it matters. Whoever takes
a repo as a whole runs it after ``load_repo``: ``validate``, a review, the render command, and
the agent before it renders its own slice (a node must refuse such a commit as it refuses one
whose names are written out).
"""

from __future__ import annotations

from reconciler.core.errors import BadInput
from reconciler.core.yamlfile import Problem, RepoProblems
from reconciler.render.node import network_names
from reconciler.render.variables import NodeShare, node_share
from reconciler.repo.checks import templated, two_releases, unnamed, written_networks
from reconciler.repo.definitions import DeploymentRepo


def check_vip_networks(repo: DeploymentRepo) -> list[Problem]:
    """The problems of the VIP networks as rendered (none to look for in a repo without VIP
    networks, or whose network names are all written out: ``check_planes`` judged those)."""
    nets = repo.vip_networks
    if not nets:
        return []
    names = written_networks(repo)
    variable = frozenset(s for s, texts in names.items() if any(templated(t) for t in texts))
    if not variable:
        return []
    planes = repo.planes
    missing = set(nets) - {t for texts in names.values() for t in texts if not templated(t)}
    # Nodes of more than one release attached: which VIP network each renders must be known.
    pairs = len({planes[n].plane for n in repo.nodes if planes[n].attached}) > 1
    on: dict[str, dict[str, list[str]]] = {}  # VIP network -> release -> its attached nodes on it
    example = ""  # what a templated name renders to, said when a VIP network is named by none
    unknown = False  # a node whose names did not render: no VIP network is said to be named by none
    for node in sorted(repo.nodes):
        if not missing and not pairs:
            break  # every VIP network is named, and one release is attached: nothing left to find
        nd = repo.node(node)
        # Every service its groups give it: a VIP service off the live plane names its network too.
        given = {s for g in nd.groups for s in repo.groups[g].services if s in repo.services}
        runs = frozenset(repo.services_of(node))
        share: NodeShare | None = None
        rendered: set[str] = set()
        for s in sorted(given):
            if s in variable:
                try:
                    share = share or node_share(repo, node)
                    out = network_names(repo, node, repo.services[s], share)
                except BadInput:
                    # The node's own render says what is wrong (a template, a secret two of its
                    # files define): said there, once, and never a refusal of the other nodes.
                    unknown = True
                    continue
                if not example:
                    example = f" (on node {node}, {s}'s networks render to {', '.join(map(repr, out))})"
            else:
                out = names[s]
            missing -= set(out)
            if s in runs:
                rendered.update(out)
        if planes[node].attached:
            for net in sorted(rendered & nets):
                on.setdefault(net, {}).setdefault(planes[node].plane, []).append(node)
    problems = [] if unknown else [unnamed(net, example) for net in sorted(missing)]
    lines = {n: d.line for n, d in repo.nodes.items()}
    problems += [two_releases(net, on[net], lines) for net in sorted(on) if len(on[net]) > 1]
    return problems


def checked(repo: DeploymentRepo) -> DeploymentRepo:
    """``repo``, or ``RepoProblems`` (INVALID_REPO) as ``load_repo`` refuses a name written out."""
    problems = check_vip_networks(repo)
    if problems:
        raise RepoProblems(problems)
    return repo
