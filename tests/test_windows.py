"""Maintenance windows: a restart waits for the window that gates it while a reload goes
through at once, the rollout waits for the node that waits, and the window opening (on a clock
the test controls) finishes it. Real agents, real processes.

History::

    C0 initial --- C1 windows: restarts of the controllers 22:00-00:00 Paris; ctl1 first
               --- C2 identity: token ttl (reload) and db: a name line (restart)
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from clock import Clock
from conftest import Deployment
from test_cli import cli
from test_suspend import running

from reconciler.agent import Agent
from reconciler.core.model import ActionKind
from reconciler.node import operations
from reconciler.repo.windows import Window, WindowError, closed, parse_duration

PARIS = ZoneInfo("Europe/Paris")

WINDOWS = """
windows:
  - name: controller-restarts
    actions: [restart, recreate, drain+restart]
    group: controllers
    schedule: "0 22 * * *"
    duration: 2h
    timezone: Europe/Paris
rollout:
  waves:
    - {name: first, nodes: [ctl1]}
"""


def test_a_restart_waits_for_its_window_while_a_reload_goes_through_and_the_rollout_waits_too(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    clock = Clock(datetime(2026, 11, 23, 21, 59, tzinfo=PARIS))  # a minute before the window opens
    ctl1, ctl2 = (agents(n, deployment.url, clock=clock) for n in ("ctl1", "ctl2"))
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + WINDOWS)
    deployment.commit("windows: controller restarts at night; ctl1 first")
    for agent in (ctl1, ctl2):
        assert agent.reconcile_once().exit_code == 0  # every service starts: a start is not gated
    before, before2 = running(ctl1), running(ctl2)

    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 7200")  # identity: reload
    deployment.edit("services/db/templates/db.conf.j2", "name = db-{{ node }}", "name = db-{{ node }}-a")
    head = deployment.commit("identity: longer tokens; db: new member name")

    plan, _ = operations.plan(ctl1.ctx)
    by_service = {a.service: a for a in plan.actions}
    assert by_service["identity"].kind is ActionKind.RELOAD
    assert by_service["db"].kind is ActionKind.NONE
    assert by_service["db"].waiting == "restart: waiting (window): controller-restarts opens 2026-11-23T22:00+01:00"
    assert by_service["db"].to_dict()["waiting"] == by_service["db"].waiting

    result = ctl1.reconcile_once()
    assert result.exit_code == 0 and result.waiting.startswith("db: restart: waiting (window)")
    after = running(ctl1)
    assert after["db"] == before["db"]  # same process, same config: not touched
    assert after["identity"][0] == before["identity"][0] and after["identity"][1] != before["identity"][1]
    live = ctl1.cfg.state_dir / "services"
    assert "7200" in (live / "identity" / "live" / "identity.conf").read_text()
    assert "db-ctl1-a" not in (live / "db" / "live" / "db.conf").read_text()
    note = deployment.note("ctl1", head) or {}
    assert note["state"] == "waiting" and note["reason"] == "WINDOW"
    assert "controller-restarts opens 2026-11-23T22:00+01:00" in str(note["error"])
    assert "identity: reload ok" in note["events"]  # type: ignore[operator]

    # a second poll, still outside: the same note, no new run
    assert ctl1.reconcile_once().waiting and running(ctl1)["db"] == before["db"]
    assert deployment.note("ctl1", head) == note

    # ctl2 is in the rest of the rollout: it waits for ctl1, which waits for its window
    waiting = ctl2.reconcile_once()
    assert "ctl1" in waiting.waiting, waiting.waiting
    assert running(ctl2) == before2  # not even the reload
    assert (deployment.note("ctl2", head) or {}).get("state") != "applied"

    clock.now += timedelta(minutes=1, seconds=30)  # 22:00:30: open
    assert ctl1.reconcile_once().exit_code == 0
    assert running(ctl1)["db"][0] != before["db"][0]
    assert "db-ctl1-a" in (live / "db" / "live" / "db.conf").read_text()
    assert (deployment.note("ctl1", head) or {})["state"] == "applied"
    assert ctl2.reconcile_once().exit_code == 0
    assert (deployment.note("ctl2", head) or {})["state"] == "applied"


def test_a_window_that_cannot_be_read_is_a_located_error(deployment: Deployment) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + WINDOWS.replace("0 22 * * *", "0 25 * * *"))
    proc = cli("validate", "--repo", str(deployment.work))
    assert proc.returncode == 2
    line = next(i for i, t in enumerate(deployment.read("reconciler.yaml").splitlines(), 1) if "controller-restarts" in t)
    assert f"reconciler.yaml:{line}: window 'controller-restarts': schedule '0 25 * * *'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr

    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml").replace("0 25 * * *", "0 22 * * *")
                     .replace("Europe/Paris", "Europe/Pariss"))
    proc = cli("validate", "--repo", str(deployment.work))
    assert proc.returncode == 2 and "unknown time zone 'Europe/Pariss'" in proc.stderr, proc.stderr


NIGHT = Window("night", frozenset({ActionKind.RESTART}), "0 22 * * 1-5", timedelta(hours=6), "Europe/Paris")
SUNDAY = Window("sunday", frozenset({ActionKind.REBOOT}), "0 2 * * 0", timedelta(hours=4), "UTC",
                frozenset({"cmp1"}))


@pytest.mark.parametrize(("when", "kind", "node", "held"), [
    (datetime(2026, 11, 23, 21, 59, tzinfo=PARIS), ActionKind.RESTART, "ctl1", "night opens 2026-11-23T22:00+01:00"),
    (datetime(2026, 11, 23, 22, 0, tzinfo=PARIS), ActionKind.RESTART, "ctl1", None),  # opens on the minute
    (datetime(2026, 11, 24, 3, 59, tzinfo=PARIS), ActionKind.RESTART, "ctl1", None),  # across midnight
    (datetime(2026, 11, 24, 4, 0, tzinfo=PARIS), ActionKind.RESTART, "ctl1", "night opens 2026-11-24T22:00+01:00"),
    # Friday night's window runs into Saturday; none opens on the weekend
    (datetime(2026, 11, 28, 3, 0, tzinfo=PARIS), ActionKind.RESTART, "ctl1", None),
    (datetime(2026, 11, 28, 12, 0, tzinfo=PARIS), ActionKind.RESTART, "ctl1", "night opens 2026-11-30T22:00+01:00"),
    (datetime(2026, 11, 23, 12, 0, tzinfo=PARIS), ActionKind.RELOAD, "ctl1", None),  # no window names reloads
    (datetime(2026, 11, 23, 12, 0, tzinfo=PARIS), ActionKind.REBOOT, "ctl1", None),  # sunday is cmp1's only
    (datetime(2026, 11, 23, 12, 0, tzinfo=PARIS), ActionKind.REBOOT, "cmp1", "sunday opens 2026-11-29T02:00+00:00"),
    # the night Paris moves its clocks back: 22:00 local is 21:00 UTC after the change
    (datetime(2026, 10, 26, 20, 30, tzinfo=ZoneInfo("UTC")), ActionKind.RESTART, "ctl1",
     "night opens 2026-10-26T22:00+01:00"),
    (datetime(2026, 10, 26, 21, 0, tzinfo=ZoneInfo("UTC")), ActionKind.RESTART, "ctl1", None),
])
def test_when_a_window_is_open(when: datetime, kind: ActionKind, node: str, held: str | None) -> None:
    verdict = closed(kind, node, (NIGHT, SUNDAY), when)
    assert (str(verdict).removeprefix("waiting (window): ") if verdict else None) == held


def test_durations() -> None:
    assert parse_duration("1h30m") == timedelta(minutes=90) and parse_duration("2d") == timedelta(days=2)
    for bad in ("", "6", "30s", "0m", "8d"):
        with pytest.raises(WindowError):
            parse_duration(bad)


def test_an_upgrades_reboot_post_step_waits_for_the_reboot_window(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """cmp1 reboots after compute-agent's upgrade, and reboots only on Sunday nights: on a Monday
    its upgrade goes through and the reboot waits, noted with the window's next opening."""
    from test_upgrade import COMPUTE_STEPS, steps_of_nodes, versioned

    from reconciler.settings import HostConfig

    clock = Clock(datetime(2026, 11, 23, 12, 0, tzinfo=PARIS))  # a Monday
    reboots, boot = tmp_path / "reboots.log", tmp_path / "cmp1.boot_id"
    boot.write_text("boot-0\n")
    host = HostConfig(root=tmp_path, boot_id_file=boot,
                      reboot_command=f'echo "$(cat {boot})" >> {reboots} && echo boot-1 > {boot}')
    fleet = {"cmp1": agents("cmp1", deployment.url, host=host, clock=clock),
             "cmp2": agents("cmp2", deployment.url, clock=clock)}
    versioned(deployment)
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + """
post_upgrade:
  - {name: new-kernel, after: [compute-agent], node: cmp1, action: reboot}
windows:
  - {name: sunday-reboots, actions: [reboot], schedule: "0 2 * * 0", duration: 4h, timezone: Europe/Paris}
""")
    deployment.commit("compute-agent version 1; reboots on Sunday nights")
    for agent in fleet.values():
        assert agent.reconcile_once().exit_code == 0
    text = deployment.read("services/compute-agent/service.yaml").replace('version: "1"\n', "")
    deployment.write("services/compute-agent/service.yaml",
                     COMPUTE_STEPS.replace("upgrade_after: [identity]\n", "").lstrip() + text)
    head = deployment.commit("compute-agent version 2")

    for _ in range(3):
        for node in ("cmp2", "cmp1"):
            result = fleet[node].reconcile_once()
    assert result.waiting == ("post_upgrade new-kernel: reboot waiting (window): sunday-reboots opens "
                              "2026-11-29T02:00+01:00"), result.waiting
    assert not reboots.exists()  # upgraded, not rebooted
    assert (deployment.note("cmp1", head) or {}).get("state") == "applied"

    clock.now = datetime(2026, 11, 29, 2, 30, tzinfo=PARIS)  # Sunday night: open
    fleet["cmp1"].reconcile_once()  # reboots (the command stands in for it)
    fleet["cmp1"].reconcile_once()  # back under another boot id: done
    assert reboots.read_text() == "boot-0\n"
    assert steps_of_nodes(deployment, head, ("cmp1",))["cmp1"][("", "new-kernel")]["status"] == "done"
