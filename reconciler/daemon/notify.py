"""Notifications for what needs a person: a commit refused, a service failed (and was put back),
the node halted, a rollout finished here (applied), drift reported.

Events are read off the pass's ``RunResult`` after the pass, so delivery never runs under the
node's lock and never changes what the pass did. Each event is sent once per commit: what was
sent is remembered in ``<state>/notified.json`` (written atomically), so a poll that finds the
same failed commit again, or a restarted daemon, sends nothing more. A delivery that fails is
given up after its tries and logged once; it is remembered all the same, so a target that is down
costs each event one retry budget, not every poll.

The webhook's body is signed: ``X-Reconciler-Signature: sha256=<hex HMAC-SHA256 of the body>``
with the secret read from the environment variable the config names. The secret itself is in no
file, log or note this module writes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from reconciler.core.atomic import atomic_write
from reconciler.core.digest import hmac_sha256_hex
from reconciler.core.errors import ConfigError
from reconciler.core.model import ResultState, Verdict
from reconciler.node.run import RunResult
from reconciler.settings import NotifyConfig

log = logging.getLogger("reconciler.notify")

SENT_FILE = "notified.json"
KEEP = 1000  # remembered keys: far more than the commits a node sees between two restarts of interest
SIGNATURE_HEADER = "X-Reconciler-Signature"
DRIFT_PREFIX = "drift not corrected"  # plan's reason for a hand-made change under `drift: report`


@dataclass(frozen=True)
class Event:
    """One thing a person should hear about; ``key`` is what makes it the same event again."""

    event: str  # refused | failed | halted | applied | drift
    node: str
    commit: str
    reason: str
    detail: str
    time: str

    @property
    def key(self) -> str:
        # drift names its services: a second service changed by hand on the same commit is news
        return f"{self.event}:{self.commit}" + (f":{self.detail}" if self.event == "drift" else "")

    def body(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def events_of(result: RunResult) -> list[Event]:
    """What in this pass needs a person; nothing for a pass that found nothing new."""
    rep = result.report
    if rep is None or result.operation:
        return []  # an operator's own rollback: they are there already
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: list[Event] = []

    def add(event: str, reason: str, detail: str) -> None:
        out.append(Event(event, result.node, rep.commit, reason, detail, now))

    if rep.state is Verdict.REFUSED:
        add("refused", rep.reason, rep.error)
    elif rep.state is Verdict.FAILED:
        failed = [r for r in rep.services if r.state is ResultState.FAILED]
        detail = "; ".join(f"{r.service}: {r.detail} (put back)" for r in failed) or rep.error
        add("failed", rep.reason or "APPLY_FAILED", detail)
    elif rep.state is Verdict.HALTED:
        add("halted", rep.reason or "HALTED", rep.error)
    elif rep.state is Verdict.APPLIED:
        changed = sorted(f"{r.service} {r.action}" for r in rep.services if str(r.action) != "none")
        add("applied", "", ", ".join(changed) or "nothing to change")
    drifted = sorted(r.service for r in rep.services if r.reason.startswith(DRIFT_PREFIX))
    if drifted:
        add("drift", "DRIFT", ", ".join(drifted))
    return out


class Notifier:
    """Sends events to the configured targets, each event once. ``sleep`` is the delay between
    tries (a test may shorten the config's delays instead; both are real waits)."""

    def __init__(self, cfg: NotifyConfig, state_dir: Path, sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.path = state_dir / SENT_FILE
        self.sleep = sleep
        if cfg.webhook is not None and cfg.webhook.secret_env and cfg.webhook.secret_env not in os.environ:
            raise ConfigError(f"notify.webhook.secret_env: environment variable {cfg.webhook.secret_env} is not set")
        self._apprise: Any = None
        if cfg.apprise:
            import apprise

            ap = apprise.Apprise()
            for url in cfg.apprise:
                if not ap.add(url):
                    raise ConfigError(f"notify.apprise: {_safe(url)} is not a URL apprise knows")
            self._apprise = ap

    def after_pass(self, result: RunResult) -> list[Event]:
        """Deliver this pass's new events; returns those it tried (tests read it)."""
        if not self.cfg.enabled:
            return []
        sent = self._sent()
        new = [e for e in events_of(result) if e.key not in sent]
        for event in new:
            self.deliver(event)
            sent.append(event.key)
            # remembered after each one: a pass killed mid-way does not send the earlier ones again
            self._remember(sent)
        return new

    def deliver(self, event: Event) -> None:
        if self.cfg.webhook is not None:
            self._webhook(event)
        if self._apprise is not None:
            self._notify_apprise(event)

    def _webhook(self, event: Event) -> None:
        hook = self.cfg.webhook
        assert hook is not None
        body = event.body()
        headers = {"Content-Type": "application/json", "User-Agent": "reconciler"}
        if hook.secret_env:
            secret = os.environ.get(hook.secret_env, "")
            digest = hmac_sha256_hex(secret.encode(), body)  # not hmac's: it loads OpenSSL into an idle daemon
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        import urllib.error  # here, where a webhook is configured: http, email and ssl are heavy to import
        import urllib.request

        why = ""
        for attempt in range(hook.tries):
            if attempt:
                self.sleep(hook.retry_delay * 2 ** (attempt - 1))
            try:
                req = urllib.request.Request(hook.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=hook.timeout) as resp:  # noqa: S310 (http(s) checked in config)
                    if 200 <= resp.status < 300:
                        return
                    why = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
        log.warning("%s: %s notification for %s not delivered to %s after %d tries: %s", event.node, event.event,
                    event.commit[:12], _safe(hook.url), hook.tries, why)

    def _notify_apprise(self, event: Event) -> None:
        title = f"reconciler: {event.node} {event.event} at {event.commit[:12]}"
        text = " ".join(p for p in (f"[{event.reason}]" if event.reason else "", event.detail) if p)
        from apprise import NotifyType  # loaded already: an apprise target was configured

        kind = NotifyType(_APPRISE_TYPE.get(event.event, "info"))
        try:
            ok = bool(self._apprise.notify(title=title, body=text or event.event, notify_type=kind))
        except Exception as exc:  # a plugin's own error must not stop the pass
            ok, text = False, f"{type(exc).__name__}: {exc}"
        if not ok:
            log.warning("%s: %s notification for %s not delivered to an apprise target", event.node, event.event,
                        event.commit[:12])

    def _sent(self) -> list[str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []  # none yet, or unreadable: at worst an event is sent twice, never lost
        return [str(k) for k in data.get("sent", [])] if isinstance(data, dict) else []

    def _remember(self, keys: Iterable[str]) -> None:
        kept = list(keys)[-KEEP:]
        atomic_write(self.path, json.dumps({"sent": kept}, indent=1).encode() + b"\n", mode=0o600)


# apprise's NotifyType by value (its enum is a StrEnum of these): what a target shows as red,
# amber or green. A refused commit or a hand edit needs a look; nothing broke.
_APPRISE_TYPE = {"failed": "failure", "halted": "failure", "refused": "warning", "drift": "warning",
                 "applied": "success"}


def _safe(url: str) -> str:
    """A URL without its user and password (tokens often ride there) and without its query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
