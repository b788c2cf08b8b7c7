"""Services that do not depend on each other go through a sliding window of ``max_parallel``
slots: a service starts as soon as one of the slots frees, not once the slowest of a batch is
healthy; what depends on another still waits for it, and a failure still stops what had not
started yet.

Each service writes when it starts and when its health check runs to one shared file, under its
own name (its own records, never a wall-clock bound): a service's hold is the span from its first
check to its last.

History (one node)::

    C1 every service deployed --- C2 every service changed (one of them breaks)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, SigningKey
from test_faults import processes_of
from test_parallel_starts import holds, most_at_once, sleepers

from reconciler.agent import Agent


def services(tmp_path: Path, key: SigningKey, held: dict[str, float],
             depends: dict[str, list[str]] | None = None) -> tuple[Deployment, Path]:
    """One node running ``held``'s services, each held healthy for its own time."""
    return sleepers(tmp_path, key, list(held), hold=held, depends=depends)


def test_a_service_starts_as_soon_as_a_slot_frees_not_when_the_slowest_of_its_batch_is_healthy(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # Two slots; a holds long, the others briefly.
    dep, checks = services(tmp_path, merge_key, {"a": 2.5, "b": 0.2, "c": 0.2, "d": 0.2})
    node = agents("n1", dep.url, max_parallel=2)

    result = node.reconcile_once()

    assert result.exit_code == 0 and result.report is not None and str(result.report.state) == "applied"
    assert sorted(processes_of(node.cfg.state_dir)) == ["a", "b", "c", "d"]
    spans = holds(checks)
    # c takes b's slot once b is healthy, d takes c's: both while a still holds ...
    assert spans["b"][1] <= spans["c"][0] and spans["c"][1] <= spans["d"][0], spans
    assert spans["d"][0] < spans["a"][1], spans
    # ... and never more than two at once.
    assert most_at_once(spans) == 2, spans


def test_a_dependent_waits_for_what_it_needs_while_independent_services_pass_it(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    # b needs a (slow); c and d need nothing and come after b in the plan.
    dep, checks = services(tmp_path, merge_key, {"a": 2.0, "b": 0.2, "c": 0.2, "d": 0.2}, depends={"b": ["a"]})
    node = agents("n1", dep.url, max_parallel=2)

    assert node.reconcile_once().exit_code == 0

    spans = holds(checks)
    assert spans["a"][1] < spans["b"][0], spans  # only once a was healthy for its whole hold
    # c and d did not wait behind b for a: they used the free slot meanwhile.
    assert spans["c"][0] < spans["a"][1] and spans["d"][0] < spans["a"][1], spans
    assert most_at_once(spans) == 2, spans


def test_a_failing_service_is_put_back_and_what_had_not_started_is_skipped(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep, checks = services(tmp_path, merge_key, {"a": 2.0, "b": 0.2, "c": 0.2, "d": 0.2})
    node = agents("n1", dep.url, max_parallel=2)
    assert node.reconcile_once().exit_code == 0
    before = processes_of(node.cfg.state_dir)
    checks.write_text("")

    # Every service changes; b's new version exits at once, while a still holds.
    dep.edit("inventory.yaml", "version: 1, bad: none", "version: 2, bad: b")
    head = dep.commit("all change, b breaks")
    result = node.reconcile_once()

    assert result.exit_code == 1 and result.report is not None and str(result.report.state) == "failed"
    by = {r.service: r for r in result.report.services}
    assert str(by["b"].state) == "failed" and "previous version restored" in by["b"].detail, by["b"]
    # a, started beside it, finished; c and d, not started when b failed, were left alone.
    assert {n: str(by[n].state) for n in "acd"} == {"a": "ok", "c": "skipped", "d": "skipped"}
    assert (dep.note("n1", head) or {}).get("state") == "failed"
    live = {n: (node.cfg.state_dir / "services" / n / "live" / "app.conf").read_text() for n in "abcd"}
    assert "version = 2" in live["a"] and all("ok = yes\nversion = 1" in live[n] for n in "bcd"), live
    after = processes_of(node.cfg.state_dir)
    assert sorted(after) == list("abcd") and all(len(p) == 1 for p in after.values())
    assert after["c"] == before["c"] and after["d"] == before["d"]


def test_max_parallel_1_still_holds_one_service_after_another_in_plan_order(
    tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]
) -> None:
    dep, checks = services(tmp_path, merge_key, {"a": 0.6, "b": 0.1, "c": 0.1})
    node = agents("n1", dep.url, max_parallel=1)

    assert node.reconcile_once().exit_code == 0

    spans = holds(checks)
    assert most_at_once(spans) == 1
    assert spans["a"][1] < spans["b"][0] and spans["b"][1] < spans["c"][0], spans
