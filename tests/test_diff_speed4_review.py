"""Review of issue 40's quick plan path (``review.applied._quickly``): what it keeps must not
outlive what the planner reads fresh on each call."""

from __future__ import annotations

from reconciler.core.model import ActionKind, Desired, DesiredService, FileSpec, Runtime
from reconciler.drivers import kinds
from reconciler.plan.planner import plan
from reconciler.review.applied import as_applied, planned


def _node(node: str, commit: str, level: int, runtime: Runtime) -> Desired:
    conf = FileSpec("s.conf", 0o644, f"[DEFAULT]\nnode = {node}\nlevel = {level}\n".encode())
    return Desired(node, commit, (DesiredService("svc", runtime, (conf,)),))


def _fleet_plans(commit_a: str, driver: str) -> list[tuple[str, str, str]]:
    """Each of three nodes of one shape, A -> B (a changed key no rule explains): the review's
    action and the planner's against A as applied."""
    runtime = Runtime(driver, ("svc",))  # one object on every node, as render makes it
    out = []
    for node in ("n1", "n2", "n3"):
        da, db = _node(node, commit_a, 1, runtime), _node(node, "b" * 40, 2, runtime)
        reviewed = planned(da, db)[0].actions[0]
        expected = plan(db, as_applied(da)).actions[0]
        out.append((node, f"{reviewed.kind}: {reviewed.reason}", f"{expected.kind}: {expected.reason}"))
    return out


def test_a_driver_kind_registered_again_gives_its_new_default_on_every_node() -> None:
    """A kind re-registered in the same process (a plugin reloaded, a test's fixture) with
    another ``config_change``: every node of the next diff plans a change no rule explains with
    the kind's default as it is now, as the planner does, not the one the first diff met."""
    name = "rp4-kind"
    kinds.register(kinds.Kind(name, name, lambda ctx, root: None, config_change=ActionKind.REBOOT))  # type: ignore[arg-type,return-value]
    try:
        assert all(got == want for _, got, want in _fleet_plans("a" * 40, name))
    finally:
        kinds.unregister(name)
    kinds.register(kinds.Kind(name, name, lambda ctx, root: None, config_change=ActionKind.RELOAD))  # type: ignore[arg-type,return-value]
    try:
        plans = _fleet_plans("c" * 40, name)  # another A: another shape, the first node planned whole
    finally:
        kinds.unregister(name)
    assert [got for _, got, _ in plans] == [want for _, _, want in plans], plans
