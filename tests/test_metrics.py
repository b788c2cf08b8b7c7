"""Prometheus metrics: real agent passes, /metrics scraped over real HTTP, a textfile written by
`agent --once`, both read back with prometheus-client's own parser and compared with the notes.

History used here::

    C1 initial deployment --- C2 identity: four API workers --- C3 identity: a config the program rejects
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, Deployment, SigningKey, free_port, git, wait_for
from prometheus_client.parser import text_string_to_metric_families

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError
from reconciler.daemon.afterpass import Outputs
from reconciler.daemon.metrics import EXPORTED
from reconciler.settings import MetricsConfig, load_config

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample: (name, sorted labels) -> value, through the official parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return parse(resp.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def labelled(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def metric_names(texts: list[str]) -> set[str]:
    """Metric names (``reconciler_...``) in PromQL expressions."""
    return {m for t in texts for m in re.findall(r"\breconciler_[a-z0-9_]+\b", t)}


def commit_time(deployment: Deployment, commit: str) -> int:
    return int(git("show", "-s", "--format=%ct", commit, cwd=deployment.work))


def test_metrics_over_http_agree_with_the_notes_and_survive_a_restart(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    port = free_port()
    ctl1 = agents("ctl1", deployment.url, metrics=MetricsConfig(listen=f"127.0.0.1:{port}"))
    outputs = Outputs(ctl1)
    assert outputs.serve() == port
    try:
        c1 = git("rev-parse", "HEAD", cwd=deployment.work)
        outputs(ctl1.reconcile_once())
        deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                        "port = {{ port_base + ports.identity }}\nworkers = 4")
        c2 = deployment.commit("identity: four API workers")
        outputs(ctl1.reconcile_once())
        deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                        "port = five-thousand")
        c3 = deployment.commit("identity: a config the program rejects")
        failed = ctl1.reconcile_once()
        outputs(failed)

        m = scrape(port)
    finally:
        outputs.close()

    notes = {c: deployment.note("ctl1", c) or {} for c in (c1, c2, c3)}
    assert [notes[c].get("state") for c in (c1, c2, c3)] == ["applied", "applied", "failed"]
    # The applied commit is the last one the notes say applied; the head is the failed one.
    assert labelled(m, "reconciler_applied_commit_info") == {(("commit", c2),): 1.0}
    assert labelled(m, "reconciler_head_commit_info") == {(("commit", c3),): 1.0}
    assert value(m, "reconciler_behind_head_seconds") == commit_time(deployment, c3) - commit_time(deployment, c2)
    # Runs by state: two applied, one failed, nothing else.
    runs = {dict(k)["state"]: v for k, v in labelled(m, "reconciler_runs_total").items() if v}
    assert runs == {"applied": 2.0, "failed": 1.0}
    assert value(m, "reconciler_last_poll_result", result="failed") == 1.0
    assert sum(labelled(m, "reconciler_last_poll_result").values()) == 1.0
    # Actions: what the three notes list, counted by kind and result.
    from collections import Counter

    noted = Counter((svc["action"], svc["result"]) for c in (c1, c2, c3)
                    for svc in notes[c]["services"].values() if svc["action"] != "none")  # type: ignore[attr-defined]
    actions = {(dict(k)["action"], dict(k)["result"]): v for k, v in labelled(m, "reconciler_actions_total").items()
               if dict(k)["action"] != "none"}
    assert actions == {k: float(n) for k, n in noted.items()}
    assert actions[("restart", "failed")] == 1.0  # C3's identity, put back
    assert value(m, "reconciler_rollbacks_total", by="failed_change") == 1.0
    assert value(m, "reconciler_services_running") == 4.0 and value(m, "reconciler_services_drifted") == 0.0
    assert value(m, "reconciler_suspended") == 0.0
    assert value(m, "reconciler_polls_total", result="applied") == 2.0
    assert value(m, "reconciler_last_note_push_timestamp_seconds") <= value(
        m, "reconciler_last_poll_timestamp_seconds")
    assert failed.report is not None and failed.report.state == "failed"
    # Every name the code says it exports is on the page (refusals once there is one, the
    # suspension's info while suspended), and nothing else.
    assert {name for name, _ in m} == set(EXPORTED) - {"reconciler_refusals_total", "reconciler_suspended_info"}

    # A restarted agent (a new process: nothing kept in memory) reports the same totals.
    ctl1.close()
    again = agents("ctl1", deployment.url, metrics=MetricsConfig(listen="127.0.0.1:0"))
    restarted = Outputs(again)
    port2 = restarted.serve()
    assert port2 is not None
    try:
        m2 = scrape(port2)
    finally:
        restarted.close()
    moving = {"reconciler_services", "reconciler_services_running", "reconciler_services_drifted"}
    assert {k: v for k, v in m2.items() if k[0] not in moving} == {k: v for k, v in m.items() if k[0] not in moving}


def test_a_refused_commit_is_counted_by_reason(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    ctl1 = agents("ctl1", deployment.url, metrics=MetricsConfig(textfile=tmp_path / "prom" / "reconciler.prom"))
    (tmp_path / "prom").mkdir()
    outputs = Outputs(ctl1)
    outputs(ctl1.reconcile_once())
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1800")
    unsigned = deployment.commit("an unsigned change", key=None)
    outputs(ctl1.reconcile_once())
    outputs(ctl1.reconcile_once())  # judged once: the second poll skips it, and says refused all the same

    m = parse((tmp_path / "prom" / "reconciler.prom").read_text())
    reason = str((deployment.note("ctl1", unsigned) or {}).get("reason"))
    assert reason and labelled(m, "reconciler_refusals_total") == {(("reason", reason),): 1.0}
    assert value(m, "reconciler_last_poll_result", result="refused") == 1.0
    assert value(m, "reconciler_polls_total", result="refused") == 2.0
    assert value(m, "reconciler_behind_head_seconds") >= 0
    assert labelled(m, "reconciler_head_commit_info") == {(("commit", unsigned),): 1.0}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_agent_once_writes_the_textfile_atomically(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    state_dir = tmp_path / "nodes" / "cmp1"
    agents("cmp1", deployment.url, state_dir=state_dir)  # stops what the CLI started, at teardown

    done = _cli("agent", "--once", "--node", "cmp1", "--remote", deployment.url, "--state-dir", str(state_dir),
                "--allowed-signers", str(merge_key.allowed_signers), "--metrics-textfile", str(textdir / "r.prom"))

    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in textdir.iterdir()) == ["r.prom"]  # no temp file left beside it
    m = parse((textdir / "r.prom").read_text())
    note = deployment.note("cmp1") or {}
    assert note.get("state") == "applied"
    assert labelled(m, "reconciler_applied_commit_info") == {(("commit", str(note["commit"])),): 1.0}
    assert value(m, "reconciler_runs_total", state="applied") == 1.0
    assert value(m, "reconciler_behind_head_seconds") == 0.0
    started = {dict(k)["action"]: v for k, v in labelled(m, "reconciler_actions_total").items()}
    assert started == {"start": float(len(note["services"]))}  # type: ignore[arg-type]


def test_the_daemon_serves_metrics_on_its_configured_port(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    port = free_port()
    state_dir = tmp_path / "nodes" / "cmp2"
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "cmp2", "remote": deployment.url, "state_dir": str(state_dir), "interval": 1, "jitter": 0,
        "trust": {"allowed_signers": str(merge_key.allowed_signers)},
        "metrics": {"listen": f"127.0.0.1:{port}"},
    }))
    agents("cmp2", deployment.url, state_dir=state_dir)  # cleanup
    daemon = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    head = git("rev-parse", "HEAD", cwd=deployment.work)

    def applied() -> bool:
        try:
            return labelled(scrape(port), "reconciler_applied_commit_info") == {(("commit", head),): 1.0}
        except OSError:
            return False

    try:
        wait_for(applied, 30, "the daemon's /metrics to show the applied head")
        m = scrape(port)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr
    assert value(m, "reconciler_poll_interval_seconds") == 1.0
    assert value(m, "reconciler_runs_total", state="applied") == 1.0
    assert (deployment.note("cmp2") or {}).get("commit") == head


@pytest.mark.parametrize("metrics, error", [
    ({"listen": "0.0.0.0:9469"}, "metrics.listen '0.0.0.0:9469' is not a loopback address"),
    ({"listen": "10.0.0.5:9469"}, "is not a loopback address"),
    ({"listen": "9469"}, "metrics.listen '9469' must be host:port"),
    ({"listne": "127.0.0.1:9469"}, "unknown setting metrics.listne"),
])
def test_a_bad_metrics_setting_is_one_line_and_exit_2(
    tmp_path: Path, metrics: dict[str, str], error: str
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remote": "file:///nowhere.git", "state_dir": str(tmp_path / "s"),
                                      "metrics": metrics}))
    with pytest.raises(ConfigError, match=error):
        load_config(config, {})
    done = _cli("agent", "--once", "--config", str(config))
    assert done.returncode == 2
    assert error in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_non_loopback_address_is_served_only_when_allowed(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remote": "file:///nowhere.git",
                                      "metrics": {"listen": "0.0.0.0:9469", "allow_non_loopback": True}}))
    assert load_config(config, {}).metrics.listen == "0.0.0.0:9469"


def test_contrib_alerts_and_dashboard_use_only_exported_metrics() -> None:
    alerts = yaml.safe_load((ROOT / "contrib" / "prometheus" / "alerts.yml").read_text())
    exprs = [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    dashboard = json.loads((ROOT / "contrib" / "grafana" / "reconciler.json").read_text())
    targets = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 4 and len(targets) >= 4

    used = metric_names(exprs) | metric_names(targets)

    assert used and used <= set(EXPORTED), f"not exported: {sorted(used - set(EXPORTED))}"
    # each alert the issue asks for is there
    names = {rule["alert"] for group in alerts["groups"] for rule in group["rules"]}
    assert {"ReconcilerNotPolling", "ReconcilerFailedOrHalted", "ReconcilerRefusedCommit",
            "ReconcilerBehindHead"} <= names
