"""`diff` of a large fleet in worker processes (issue 17) says exactly what one process says:
the same diffs in the same order, and the same first error, located, when a node fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.core.errors import BadInput
from reconciler.repo.definitions import DeploymentRepo
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree
from reconciler.review import diff as review
from reconciler.review.diff import PARALLEL_FROM, diff_repos
from reconciler.review.report import markdown

A, B = "a" * 40, "b" * 40
NODES = 2 * PARALLEL_FROM + 3  # enough for two workers
TEMPLATE = "[DEFAULT]\nhost = {{ node }}\nregion = {{ region }}\nport = {{ port }}\n" \
           "[peers]\nmembers = {{ groups[role] | join(',') }}\n"


def fleet(root: Path, *, region: str = "One", broken: str = "") -> DeploymentRepo:
    """NODES nodes in two roles running three services; ``broken``: a node whose vars lack ``port``."""
    inv = [f"vars: {{region: {region}}}", "groups:",
           "  web: {services: [api, cache, proxy], vars: {role: web}}",
           "  db: {services: [api, cache], vars: {role: db}}", "nodes:"]
    for n in range(NODES):
        port = "" if f"node{n:03d}" == broken else f"port: {9000 + n}"
        inv.append(f"  node{n:03d}: {{groups: [{'web' if n % 3 else 'db'}], vars: {{{port}}}}}")
    files = {"reconciler.yaml": "format: 1\nname: fleet\n", "inventory.yaml": "\n".join(inv) + "\n"}
    for name in ("api", "cache", "proxy"):
        files[f"services/{name}/service.yaml"] = (
            f"runtime: {{command: [{name}, --config, {name}.conf]}}\n"
            f"files: [{{path: {name}.conf, template: {name}.conf.j2}}]\n"
            "on_change:\n  - {file: '*.conf', keys: [DEFAULT.region], action: reload}\n")
        files[f"services/{name}/templates/{name}.conf.j2"] = TEMPLATE
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return load_repo(DirTree(root))


def test_a_region_change_diffed_by_two_workers_is_the_single_process_diff(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ra, rb = fleet(tmp_path / "a"), fleet(tmp_path / "b", region="Two")
    alone = diff_repos(ra, A, rb, B, jobs=1)
    seen = tmp_path / "pids"  # written by whichever process diffs each node
    diff_node = review._diff_node

    def counted(r: review._Review, node: str) -> review.NodeDiff:
        with seen.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return diff_node(r, node)

    monkeypatch.setattr(review, "_diff_node", counted)  # forked workers inherit the patch
    spread = diff_repos(ra, A, rb, B, jobs=2)
    monkeypatch.undo()
    pids = seen.read_text().split()
    assert len(pids) == NODES and str(os.getpid()) not in pids  # every node diffed in a worker
    assert [d.node for d in spread] == sorted(ra.nodes)
    assert [d.to_dict() for d in spread] == [d.to_dict() for d in alone]
    assert markdown(spread, A, B) == markdown(alone, A, B)
    reloads = {(a.service, str(a.kind)) for d in spread for a in d.plan.changes}
    assert reloads == {("api", "reload"), ("cache", "reload"), ("proxy", "reload")}
    assert all(len(d.files) == (3 if int(d.node[4:]) % 3 else 2) for d in spread)


def test_a_node_that_fails_to_render_in_a_worker_is_the_same_located_error(tmp_path: Path) -> None:
    ra = fleet(tmp_path / "a")
    rb = fleet(tmp_path / "b", region="Two", broken=f"node{NODES - 2:03d}")
    errors = []
    for jobs in (1, 2):
        with pytest.raises(BadInput) as caught:
            diff_repos(ra, A, rb, B, jobs=jobs)
        errors.append(caught.value)
    alone, spread = errors
    assert type(spread) is type(alone)
    assert str(spread) == str(alone)
    assert f"node{NODES - 2:03d}" in str(spread) and "'port' is undefined" in str(spread)
    # Named in the commit that fails to render, as git names a file in one.
    assert (spread.file, spread.line) == (alone.file, alone.line) == (f"{B[:12]}:services/api/templates/api.conf.j2", 4)
