"""Notifications: a real webhook receiver on 127.0.0.1 that fails, then accepts; real agent passes.

History used here::

    C1 initial deployment --- C2 identity: a config the program rejects   (or: an unsigned change)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

import pytest
import yaml
from conftest import Deployment, SigningKey, git

from reconciler.agent import Agent
from reconciler.core.errors import ConfigError
from reconciler.daemon.afterpass import Outputs
from reconciler.node.operations import retry
from reconciler.settings import NotifyConfig, WebhookConfig

SECRET_ENV = "RECONCILER_TEST_WEBHOOK_SECRET"
SECRET = "s3cret-7f1d2c-never-written-anywhere"


@dataclass
class Receiver:
    """Answers 500 to the first ``fail`` requests, then 200; keeps every request."""

    fail: int
    url: str = ""
    requests: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)

    @property
    def accepted(self) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b, status in self.requests if status == 200]


class StartReceiver(Protocol):
    """The ``receiver`` fixture: starts a ``Receiver`` that refuses the first ``fail`` requests."""

    def __call__(self, fail: int) -> Receiver: ...


@pytest.fixture
def receiver() -> Iterator[StartReceiver]:
    servers: list[ThreadingHTTPServer] = []

    def start(fail: int) -> Receiver:
        rec = Receiver(fail)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = 500 if len(rec.requests) < rec.fail else 200
                rec.requests.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        rec.url = f"http://127.0.0.1:{server.server_port}/hook"
        return rec

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def webhook(url: str, tries: int = 3) -> NotifyConfig:
    return NotifyConfig(webhook=WebhookConfig(url, SECRET_ENV, tries=tries, retry_delay=0.2, timeout=5.0))


def signed_by_secret(headers: dict[str, str], body: bytes) -> bool:
    want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("x-reconciler-signature", ""), want)


def break_identity(deployment: Deployment) -> str:
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    return deployment.commit("identity: a config the program rejects")


def test_a_failed_commit_is_sent_once_signed_after_two_refused_deliveries(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    hook = receiver(fail=2)
    ctl1 = agents("ctl1", deployment.url, notify=webhook(hook.url))
    outputs = Outputs(ctl1)
    c1 = git("rev-parse", "HEAD", cwd=deployment.work)
    outputs(ctl1.reconcile_once())  # applied: the receiver fails twice, the third try is accepted
    assert [json.loads(b)["event"] for _, b in hook.accepted] == ["applied"]
    assert [status for _, _, status in hook.requests] == [500, 500, 200]

    bad = break_identity(deployment)
    started = time.monotonic()
    outputs(ctl1.reconcile_once())
    assert time.monotonic() - started < 60  # the pass itself; delivery adds at most the retry budget

    assert len(hook.accepted) == 2
    headers, body = hook.accepted[1]
    assert signed_by_secret(headers, body)
    assert all(signed_by_secret(h, b) for h, b, _ in hook.requests)  # the refused tries were signed too
    sent = json.loads(body)
    assert set(sent) == {"event", "node", "commit", "reason", "detail", "time"}
    assert (sent["event"], sent["node"], sent["commit"], sent["reason"]) == ("failed", "ctl1", bad, "APPLY_FAILED")
    assert "identity" in sent["detail"] and "put back" in sent["detail"]
    assert json.loads(hook.accepted[0][1])["commit"] == c1

    # The same failed commit again: a retry that fails the same way, then a restarted agent that
    # sees the same result. Nothing more is sent.
    assert retry(ctl1.ctx) == bad
    again = ctl1.reconcile_once()
    assert again.report is not None and again.report.state == "failed" and again.commit == bad
    outputs(again)
    Outputs(agents("ctl1", deployment.url, notify=webhook(hook.url)))(again)
    assert len(hook.requests) == 4

    # The secret is in no file of the state dir, no log line and no note.
    for path in (tmp_path / "nodes" / "ctl1").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text
    notes = git("--git-dir", str(deployment.bare), "log", "-p", "refs/notes/reconciler/ctl1")
    assert notes and SECRET not in notes


def test_an_unreachable_webhook_costs_one_retry_budget_and_one_log_line(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hook = receiver(fail=100)
    ctl1 = agents("ctl1", deployment.url, notify=webhook(hook.url))
    outputs = Outputs(ctl1)

    result = ctl1.reconcile_once()
    started = time.monotonic()
    outputs(result)
    took = time.monotonic() - started
    outputs(result)  # the same pass seen again: given up on, not tried again

    assert len(hook.requests) == 3 and not hook.accepted
    assert 0.6 <= took < 5  # 0.2 s then 0.4 s between the three tries
    lines = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert lines == [f"ctl1: applied notification for {result.commit[:12]} not delivered to {hook.url} "
                     "after 3 tries: HTTP 500"]


def test_an_unsigned_commit_is_reported_as_refused(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hook = receiver(fail=0)
    ctl1 = agents("ctl1", deployment.url, notify=webhook(hook.url))
    outputs = Outputs(ctl1)
    outputs(ctl1.reconcile_once())
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1800")
    unsigned = deployment.commit("an unsigned change", key=None)

    outputs(ctl1.reconcile_once())
    outputs(ctl1.reconcile_once())

    events = [json.loads(b) for _, b in hook.accepted]
    assert [e["event"] for e in events] == ["applied", "refused"]
    note = deployment.note("ctl1", unsigned) or {}
    assert events[1]["commit"] == unsigned and events[1]["reason"] == note.get("reason")


def test_apprise_delivers_through_its_json_target(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
) -> None:
    hook = receiver(fail=0)
    target = hook.url.replace("http://", "json://")
    ctl1 = agents("ctl1", deployment.url, notify=NotifyConfig(apprise=(target,)))

    result = ctl1.reconcile_once()
    Outputs(ctl1)(result)

    assert len(hook.accepted) == 1
    message = json.loads(hook.accepted[0][1])
    assert message["title"] == f"reconciler: ctl1 applied at {result.commit[:12]}"
    assert "identity start" in message["message"]


def test_a_secret_variable_that_is_not_set_stops_the_start(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    merge_key: SigningKey,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    ctl1 = agents("ctl1", deployment.url, notify=webhook("http://127.0.0.1:9/hook"))
    with pytest.raises(ConfigError, match=f"environment variable {SECRET_ENV} is not set"):
        Outputs(ctl1)
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "ctl1", "remote": deployment.url, "state_dir": str(tmp_path / "s"),
        "trust": {"allowed_signers": str(merge_key.allowed_signers)},
        "notify": {"webhook": {"url": "http://127.0.0.1:9/hook", "secret_env": SECRET_ENV}},
    }))
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run([sys.executable, "-m", "reconciler", "agent", "--once", "--config", str(config)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"environment variable {SECRET_ENV} is not set" in done.stderr
    assert deployment.note("ctl1") is None  # stopped before the pass: nothing applied, nothing noted


@pytest.mark.parametrize("notify, error", [
    ({"webhook": {"url": "ftp://x/"}}, "notify.webhook.url must be an http:// or https:// URL"),
    ({"webhook": {"url": "http://x/", "secret": "hunter2"}}, "unknown setting notify.webhook.secret"),
    ({"webhook": {"url": "http://x/", "secret_env": "not a name"}}, "must be the name of an environment variable"),
    ({"webhook": {"url": "http://x/", "tries": 0}}, "tries must be 1..10"),
    ({"apprise": "not-a-url"}, "notify.apprise must be a list of apprise URLs"),
])
def test_bad_notify_settings_are_one_line_errors(tmp_path: Path, notify: dict[str, object], error: str) -> None:
    from reconciler.settings import load_config

    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "ctl1", "remote": "file:///nowhere.git", "notify": notify}))
    with pytest.raises(ConfigError, match=error) as caught:
        load_config(config, {})
    assert "\n" not in str(caught.value) and "hunter2" not in str(caught.value)


def test_a_hand_edit_under_drift_report_is_sent_once_and_counted(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from conftest import free_port
    from test_metrics import labelled, scrape, value

    from reconciler.settings import MetricsConfig

    monkeypatch.setenv(SECRET_ENV, SECRET)
    deployment.write("services/identity/service.yaml", deployment.read("services/identity/service.yaml")
                     + "drift: report\n")
    head = deployment.commit("identity: hand edits are only reported")
    hook = receiver(fail=0)
    port = free_port()
    ctl1 = agents("ctl1", deployment.url, notify=webhook(hook.url),
                  metrics=MetricsConfig(listen=f"127.0.0.1:{port}"))
    outputs = Outputs(ctl1)
    outputs.serve()
    try:
        outputs(ctl1.reconcile_once())
        conf = ctl1.cfg.state_dir / "services" / "identity" / "live" / "identity.conf"
        conf.write_text(conf.read_text().replace("ttl = 3600", "ttl = 60"))

        outputs(ctl1.reconcile_once())
        outputs(ctl1.reconcile_once())  # still drifted: not sent again
        m = scrape(port)
    finally:
        outputs.close()

    events = [json.loads(b) for _, b in hook.accepted]
    assert [(e["event"], e["commit"]) for e in events] == [("applied", head), ("drift", head)]
    assert events[1]["detail"] == "identity" and events[1]["reason"] == "DRIFT"
    assert value(m, "reconciler_services_drifted") == 1.0
    assert labelled(m, "reconciler_applied_commit_info") == {(("commit", head),): 1.0}


def test_a_node_halted_by_a_failure_elsewhere_says_so(
    deployment: Deployment, agents: Callable[..., Agent], receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + (
        "rollout:\n  waves:\n    - {name: canary, nodes: [ctl1]}\n    - {name: computes, nodes: [\"cmp*\"]}\n"))
    deployment.commit("roll out in waves")
    hook = receiver(fail=0)
    ctl1 = agents("ctl1", deployment.url)
    cmp1 = agents("cmp1", deployment.url, notify=webhook(hook.url))
    outputs = Outputs(cmp1)
    ctl1.reconcile_once()
    outputs(cmp1.reconcile_once())
    bad = break_identity(deployment)
    assert ctl1.reconcile_once().exit_code == 1  # the canary fails it

    outputs(cmp1.reconcile_once())
    outputs(cmp1.reconcile_once())

    events = [json.loads(b) for _, b in hook.accepted]
    assert [e["event"] for e in events] == ["applied", "halted"]
    assert (events[1]["node"], events[1]["commit"], events[1]["reason"]) == ("cmp1", bad, "HALTED")
    assert events[1]["detail"].startswith(f"halted: ctl1 failed {bad[:12]}")
