"""The process driver against real processes: hand edits of live files, the environment and
user a service runs with, and a run killed between starting a process and recording it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from conftest import Deployment, wait_for
from test_agent import get_json, pids

from reconciler.agent import Agent
from reconciler.model import ActionKind


def live_file(agent: Agent, service: str, path: str) -> Path:
    return agent.cfg.state_dir / "services" / service / "live" / path


def by_service(actions: object) -> dict[str, tuple[str, str]]:
    return {a.service: (str(a.kind), a.reason) for a in actions}  # type: ignore[attr-defined]


def test_a_hand_edit_of_a_live_file_is_put_back_with_the_least_its_rules_allow(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    identity = f"http://127.0.0.1:{deployment.port_bases['ctl1'] + 5}/v3"
    conf = live_file(ctl1, "identity", "identity.conf")
    rendered = conf.read_text()

    # Someone shortens the tokens on the node itself and has the program re-read its config.
    conf.write_text(rendered.replace("ttl = 3600", "ttl = 60"))
    os.kill(before["identity"], signal.SIGHUP)  # type: ignore[arg-type]
    wait_for(lambda: get_json(identity)["token_ttl"] == 60, what="the hand edit served")

    the_plan, _ = ctl1.plan()
    assert by_service(the_plan.actions)["identity"] == (
        "reload", "files: identity.conf changed by hand; reload puts the repo's version back "
                  "(only [token] ttl changed in identity.conf)")
    assert {a.service for a in the_plan.changes} == {"identity"}

    result = ctl1.reconcile_once()

    assert result.exit_code == 0
    assert by_service(result.plan.actions if result.plan else ())["identity"][0] == "reload"
    assert conf.read_text() == rendered
    assert get_json(identity)["token_ttl"] == 3600
    assert pids(ctl1) == before, "a reload: every process kept"
    assert ctl1.reconcile_once().report is None, "converged: the next run has nothing to do"

    # The file goes and another appears: no rule explains a whole file, so a restart.
    conf.unlink()
    live_file(ctl1, "identity", "notes.txt").write_text("tuning ideas\n")
    the_plan, _ = ctl1.plan()
    kind, reason = by_service(the_plan.actions)["identity"]
    assert kind == "restart" and reason.startswith("files: identity.conf missing, notes.txt added by hand; ")

    result = ctl1.reconcile_once()

    assert result.exit_code == 0
    assert conf.read_text() == rendered and not live_file(ctl1, "identity", "notes.txt").exists()
    assert pids(ctl1)["identity"] != before["identity"]
    assert get_json(identity)["token_ttl"] == 3600


def test_under_drift_report_a_hand_edit_is_named_and_left_alone(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    deployment.write("services/identity/service.yaml", deployment.read("services/identity/service.yaml")
                     + "drift: report\n")
    deployment.commit("identity: hand edits are only reported")
    ctl1 = agents("ctl1", deployment.url)
    ctl1.reconcile_once()
    before = pids(ctl1)
    conf = live_file(ctl1, "identity", "identity.conf")
    edited = conf.read_text().replace("ttl = 3600", "ttl = 60")
    conf.write_text(edited)

    the_plan, _ = ctl1.plan()
    assert by_service(the_plan.actions)["identity"] == (
        "none", "drift not corrected (policy report): files: identity.conf changed by hand")
    result = ctl1.reconcile_once()

    assert result.exit_code == 0 and result.report is not None
    assert {r.service: r.action for r in result.report.services}["identity"] is ActionKind.NONE
    assert conf.read_text() == edited
    assert pids(ctl1) == before
