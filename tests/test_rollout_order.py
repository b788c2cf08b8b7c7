"""The rollout decision as data: the plan, the notes, the clock in; go, wait or halt out."""

from __future__ import annotations

from reconciler.fleet.rollout import FleetView, Note, Rollout, begun, decide, early, plan_rollout, sentinel

NODES = [f"cmp{i}" for i in range(1, 9)] + ["ctl1", "ctl2", "ctl3"]
GROUPS = {"controllers": ["ctl1", "ctl2", "ctl3"], "computes": [f"cmp{i}" for i in range(1, 9)]}
SETTINGS = {"rollout": {"waves": [
    {"name": "canary", "nodes": ["ctl1"], "soak": 600},
    {"name": "controllers", "group": "controllers"},
    {"name": "computes", "group": "computes", "batch": "25%"},
]}}


def plan() -> Rollout:
    return plan_rollout(SETTINGS, NODES, lambda g: GROUPS[g])


def applied(*nodes: str, commit: str = "c1", time: str = "2026-11-21T10:00:00Z") -> dict[str, tuple[Note, ...]]:
    return {n: (Note(n, commit, "applied", time),) for n in nodes}


def at(text: str) -> float:
    from datetime import UTC, datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_waves_batches_and_the_rest() -> None:
    r = plan()
    assert [(w.name, w.nodes, w.batch) for w in r.waves] == [
        ("canary", ("ctl1",), 1), ("controllers", ("ctl2", "ctl3"), 2),
        ("computes", tuple(f"cmp{i}" for i in range(1, 9)), 2)]
    assert [m for _, m in r.batches()][2:] == [("cmp1", "cmp2"), ("cmp3", "cmp4"), ("cmp5", "cmp6"), ("cmp7", "cmp8")]


def test_soak_holds_the_next_wave_then_lets_it_go() -> None:
    fleet = FleetView(applied("ctl1"))
    held = decide(plan(), "ctl2", "c1", fleet, at("2026-11-21T10:05:00Z"))
    assert not held.go and held.reason == "soaking after wave canary until 10:10:00Z"
    assert decide(plan(), "ctl2", "c1", fleet, at("2026-11-21T10:10:01Z")).go


def test_a_batch_waits_for_earlier_batches_only() -> None:
    fleet = FleetView(applied("ctl1", "ctl2", "ctl3", "cmp1"))
    now = at("2026-11-21T12:00:00Z")
    assert decide(plan(), "cmp2", "c1", fleet, now).go  # same batch as cmp1
    wait = decide(plan(), "cmp3", "c1", fleet, now)
    assert not wait.go and wait.waiting_for == ("cmp2",)


def test_a_descendant_applied_counts_and_a_failure_halts_the_others() -> None:
    fleet = FleetView({**applied("ctl1", commit="c2"), "ctl2": (Note("ctl2", "c1", "failed", "", "identity", "boom"),)},
                      descends=lambda a, b: (a, b) == ("c2", "c1"))
    assert fleet.reached("ctl1", "c1") is not None
    halted = decide(plan(), "cmp5", "c1", fleet, at("2026-11-22T00:00:00Z"))
    assert halted.halted and halted.reason == "halted: ctl2 failed c1 (identity): boom"
    assert not decide(plan(), "ctl2", "c1", fleet, 0).halted  # the failing node itself is not halted by itself


def test_no_plan_means_go() -> None:
    assert decide(plan_rollout({}, NODES, lambda g: []), "cmp1", "c1", FleetView(), 0).go


def test_a_waiting_node_reads_the_batches_before_it_and_its_own_and_no_later_one() -> None:
    """The notes a node's verdict depends on: its turn on earlier batches, a halt on those and on
    the peers of its own batch that run beside it; a later batch has not started."""
    r = plan()
    assert r.watched("ctl1") == ()
    assert r.watched("cmp3") == ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2", "cmp4")
    # what it reads is enough: a same-batch peer's failure halts it
    peer_failed = FleetView({"cmp4": (Note("cmp4", "c1", "failed", "", "compute-agent", "boom"),),
                             **applied("ctl1", "ctl2", "ctl3", "cmp1", "cmp2")})
    seen = FleetView({n: peer_failed.notes[n] for n in r.watched("cmp3") if n in peer_failed.notes})
    assert decide(r, "cmp3", "c1", seen, at("2026-11-22T00:00:00Z")).halted


def test_a_waiting_node_reads_the_batch_before_it_and_all_before_only_when_that_is_done() -> None:
    r = plan()
    assert r.frontier("cmp5") == ("cmp3", "cmp4")  # not ctl1, ctl2, ctl3, cmp1, cmp2, nor its peer cmp6
    assert set(r.watched("cmp5")) == {"ctl1", "ctl2", "ctl3", "cmp1", "cmp2", "cmp3", "cmp4", "cmp6"}
    assert r.frontier("ctl1") == r.watched("ctl1") == ()
    assert r.frontier("ctl2") == ("ctl1",)
    now = at("2026-11-21T12:00:00Z")
    wait = early(r, "cmp5", "c1", FleetView(applied("cmp3")))
    assert wait is not None and not wait.go and wait.waiting_for == ("cmp4",)
    # The batch before has applied: the frontier can say no more; every node before is read, and decide says.
    assert early(r, "cmp5", "c1", FleetView(applied("cmp3", "cmp4"))) is None
    assert decide(r, "cmp5", "c1", FleetView(applied("cmp3", "cmp4")), now).waiting_for == ("ctl1", "ctl2", "ctl3",
                                                                                            "cmp1", "cmp2")


def test_while_the_batch_before_has_not_begun_one_node_of_it_stands_for_it() -> None:
    r = plan()
    nobody = FleetView(applied("ctl1", "ctl2", "ctl3"))  # the computes have not begun c1
    watch = sentinel(r, "cmp5", "c1", nobody)
    assert watch == "cmp4"  # crc32 of the name: the same one every poll, in every process
    # Waiting nodes spread their reads over the batch before rather than all reading one ref.
    first, second = [f"a{i:02d}" for i in range(20)], [f"b{i:02d}" for i in range(20)]
    two = plan_rollout({"rollout": {"waves": [{"nodes": ["a*"]}, {"nodes": ["b*"]}]}}, first + second, lambda g: [])
    watched = [sentinel(two, n, "c1", FleetView()) for n in second]
    assert set(watched) <= set(first) and len(set(watched)) >= 10
    # Anything of c1 from that batch, or a later commit applied, and it has begun: no sentinel.
    other = "cmp4" if watch == "cmp3" else "cmp3"
    for moved in (FleetView(applied(other)),
                  FleetView({other: (Note(other, "c1", "failed", "", "db", "down"),)}),
                  FleetView({other: (Note(other, "c1", "halted", "", "", "halted: ctl2 failed c1"),)}),
                  FleetView(applied(other, commit="c2"), descends=lambda a, b: (a, b) == ("c2", "c1"))):
        assert begun(moved, other, "c1") and sentinel(r, "cmp5", "c1", moved) is None
    # An older commit's note is not this one begun.
    assert not begun(FleetView(applied(other, commit="c0")), other, "c1")
    # The first batch waits on nobody: nothing to watch.
    assert sentinel(r, "ctl1", "c1", FleetView()) is None


def test_a_halt_travels_batch_by_batch_with_the_first_failure_named() -> None:
    r = plan()
    failed = FleetView({"cmp3": (Note("cmp3", "c1", "failed", "", "identity", "boom"),)})
    said = early(r, "cmp5", "c1", failed)
    assert said is not None and said.halted and said.reason == "halted: cmp3 failed c1 (identity): boom"
    # cmp7 reads cmp5 and cmp6, halted by cmp3: it halts with the same words, not "waiting"
    halted = FleetView({"cmp5": (Note("cmp5", "c1", "halted", "", "", said.reason),)})
    passed_on = early(r, "cmp7", "c1", halted)
    assert passed_on is not None and passed_on.halted and passed_on.reason == said.reason
    # A peer's failure halts its batch as well (they run side by side): the peer began, so the
    # batch before is done, and the read of everything before and beside says so; a later batch's does not
    beside = FleetView({"cmp6": (Note("cmp6", "c1", "failed", "", "db", "down"),),
                        **applied("ctl1", "ctl2", "ctl3", "cmp1", "cmp2", "cmp3", "cmp4")})
    assert early(r, "cmp5", "c1", beside) is None
    assert decide(r, "cmp5", "c1", beside, at("2026-11-22T00:00:00Z")).halted
    later = FleetView({"cmp7": (Note("cmp7", "c1", "failed", "", "db", "down"),)})
    assert (not_mine := early(r, "cmp5", "c1", later)) is not None and not not_mine.halted
