"""Issue 40, a diff with every service changed: the one-file paths a fleet diff takes for most
services (a service of one config file, changed on every node) say what the general paths say."""

from __future__ import annotations

import pytest

from reconciler.core.compare import domains
from reconciler.core.model import Desired, DesiredService, FileSpec, Health, Runtime
from reconciler.plan.planner import plan
from reconciler.review.applied import applied_against, as_applied, planned

INI = b"[DEFAULT]\nhost = n1\nregion = one\n\n[api]\nport = 1000\n"
CHANGES = {
    "a key": (INI, INI.replace(b"region = one", b"region = two")),
    "two keys and a comment": (INI, INI.replace(b"one", b"two").replace(b"1000", b"1001") + b"# note\n"),
    "comments only": (INI, INI + b"; note\n"),
    "another shape": (INI, INI.replace(b"[api]\n", b"[api]\nworkers = 4\n")),
    "not INI": (INI, INI + b"not an option\n"),
    "not UTF-8": (INI, INI + b"x = \xff\n"),
    "bare keys": (b"a = 1\nb = 2\n", b"a = 1\nb = 3\n"),
    "the same": (INI, INI),
}
UNCHANGED = FileSpec("other.yaml", 0o644, b"a: 1\n")  # beside it, domains pairs files by path


@pytest.mark.parametrize("mode", [0o644, 0o600])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_file_compared_alone_changes_the_domains_it_changes_beside_others(change: str, mode: int) -> None:
    old, new = CHANGES[change]
    for path in ("svc.conf", "svc.yaml", "svc.txt"):
        a, b = FileSpec(path, 0o644, old), FileSpec(path, mode, new)
        assert domains([a], [b]) == domains([a, UNCHANGED], [UNCHANGED, b]), (change, path)


def service(content: bytes, mode: int = 0o644, key: bytes = b"", command: str = "svc") -> DesiredService:
    return DesiredService("svc", Runtime("process", (command,)), (FileSpec("svc.conf", mode, content, key=key),),
                          Health())


@pytest.mark.parametrize("b", [service(INI), service(INI.replace(b"one", b"two")), service(INI, mode=0o600),
                               service(INI, key=b"k" * 32), service(INI, command="other")],
                         ids=["same", "content", "mode", "keyed", "runtime"])
def test_a_service_of_one_file_applied_unhashed_plans_as_its_hashes_do(b: DesiredService) -> None:
    da, db = Desired("n1", "a" * 40, (service(INI),)), Desired("n1", "b" * 40, (b,))
    quick, hashed = applied_against(da, db).services[0], as_applied(da).services[0]
    # Each part reads equal to B's exactly where A's own hash does.
    mine, real, theirs = dict(quick.fingerprint), dict(hashed.fingerprint), b.fingerprint()
    assert {k: mine[k] == theirs.get(k) for k in mine} == {k: real[k] == theirs.get(k) for k in real}
    assert (quick.hash == b.hash) is (hashed.hash == b.hash)
    assert plan(db, applied_against(da, db)).to_dict() == plan(db, as_applied(da)).to_dict()


def test_a_change_made_alike_on_every_node_keeps_one_action_for_all() -> None:
    """A review keeps each node's plan: 30,000 alike actions are one object, not 30,000."""
    kept = []
    for node in ("n1", "n2", "n3"):
        own = INI.replace(b"n1", node.encode())
        da = Desired(node, "a" * 40, (service(own),))
        db = Desired(node, "b" * 40, (service(own.replace(b"one", b"two")),))
        whole, _, _ = planned(da, db)
        assert whole.to_dict() == plan(db, as_applied(da)).to_dict()
        kept.append(whole.actions[0])
    assert kept[0].desired is None and kept[0].reason == "only [DEFAULT] region changed in svc.conf (no rule: restart)"
    assert kept[1] is kept[0] and kept[2] is kept[0]
