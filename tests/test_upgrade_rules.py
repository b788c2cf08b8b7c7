"""The barrier rule, on its own: whatever the fleet's notes say, step k+1 of a service may start
only when step k is done (or skipped) on every node that runs it, and after a once step only
when the one node that runs it noted it done."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.model import Scope
from reconciler.repo.steps import Stage, Step, StepAction
from reconciler.upgrades.rules import Upgrade, barrier, bases, version_changed

if TYPE_CHECKING:
    from reconciler.repo.definitions import DeploymentRepo, ServiceDef

NODES = ("ctl1", "ctl2", "ctl3")
STEPS = (Step("pin", StepAction.PIN, values={"rpc": "1"}), Step("stop", StepAction.STOP),
         Step("db-sync", StepAction.COMMAND, Scope.ONCE, command="true"), Step("start", StepAction.START))
UP = Upgrade("identity", "1", "2", STEPS, (), NODES, needed=True)
COMPUTE = Upgrade("compute", "1", "2", (STEPS[0], STEPS[1], STEPS[3]), ("identity",), ("cmp1", "cmp2"), needed=True)
STATUS = st.sampled_from(["", "started", "done", "skipped", "failed", "undone"])


@given(st.dictionaries(st.tuples(st.sampled_from(NODES), st.sampled_from([s.name for s in STEPS])), STATUS),
       st.integers(min_value=1, max_value=len(STEPS) - 1))
def test_a_step_starts_only_when_the_step_before_it_passed_where_it_must(
    noted: dict[tuple[str, str], str], k: int
) -> None:
    progress = {n: {("identity", step): s for (m, step), s in noted.items() if m == n and s} for n in NODES}
    gate = barrier(UP, k, progress, {"identity": UP})
    prev = STEPS[k - 1]
    if prev.scope is Scope.ONCE:
        assert gate.go == (noted.get(("ctl1", prev.name)) == "done")
    else:
        assert gate.go == all(noted.get((n, prev.name)) in ("done", "skipped") for n in NODES)
    assert set(gate.waiting_for) <= set(NODES)


def test_upgrade_after_holds_the_first_step_until_the_other_service_is_upgraded_everywhere() -> None:
    everyone = {"identity": UP, "compute": COMPUTE}
    almost = {n: {("identity", s.name): "done" for s in STEPS} for n in NODES}
    almost["ctl3"][("identity", "start")] = "started"
    held = barrier(COMPUTE, 0, almost, everyone)
    assert not held.go and held.waiting_for == ("ctl3",)
    assert held.reason == "waiting at barrier compute/pin (after identity): for ctl3"
    almost["ctl3"][("identity", "start")] = "done"
    assert barrier(COMPUTE, 0, almost, everyone).go
    # A service this commit does not upgrade holds nothing back.
    assert barrier(COMPUTE, 0, {}, {"compute": COMPUTE}).go


FLEET = ("ctl1", "ctl2", "cmp1", "cmp2")
STAGES = {"controlplane": Stage("controlplane", frozenset({"ctl1", "ctl2"})),
          "computes": Stage("computes", frozenset({"cmp1", "cmp2"}))}


def at(stage: str | None) -> DeploymentRepo:
    """A commit's repo as far as stages go: its `stages` and its `rollout.stage`."""
    return cast("DeploymentRepo", SimpleNamespace(settings={"rollout": {"stage": stage}} if stage else {},
                                                  stages=STAGES))


@given(st.lists(st.sampled_from([None, "controlplane", "computes"]), min_size=1, max_size=8))
def test_a_nodes_base_is_the_nearest_ancestor_that_took_it_in(history: list[str | None]) -> None:
    """``history``: the stage of the parent, the grandparent, ...; the walk reads no further
    than it must."""
    read: list[int] = []

    def ancestors() -> Iterator[tuple[str, DeploymentRepo]]:
        for i, stage in enumerate(history):
            read.append(i)
            yield f"c{i}", at(stage)

    found = bases(FLEET, ancestors())
    for node in FLEET:
        took_in = [i for i, s in enumerate(history) if s is None or node in STAGES[s].nodes]
        assert found[node][0] == f"c{took_in[0] if took_in else len(history) - 1}", (node, history)
    needed = max(min((i for i, s in enumerate(history) if s is None or n in STAGES[s].nodes),
                      default=len(history) - 1) for n in FLEET)
    assert read == list(range(needed + 1))


def test_naming_a_version_for_the_first_time_is_not_an_upgrade() -> None:
    def svc(version: str = "", image: str = "") -> ServiceDef:
        return cast("ServiceDef", SimpleNamespace(version=version, container={"image": image} if image else {}))

    assert not version_changed(svc(image="db:1"), svc("1", "db:1"))  # a version named: nothing new runs
    assert version_changed(svc("1", "db:1"), svc("2", "db:1"))
    assert version_changed(svc("1", "db:1"), svc("1", "db:2"))
    assert not version_changed(svc("1"), svc("1"))
    assert not version_changed(svc("1"), svc())  # a version dropped: nothing new either
