"""What follows every pass of the daemon: its verdict logged when it changes, notifications
sent and metrics refreshed (``Outputs``), and whether the daemon should re-execute itself to
give back memory (``Shedding``, see ``shed``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from reconciler.agent import Agent
from reconciler.core.errors import ReconcilerError
from reconciler.node.run import RunResult
from reconciler.settings import AgentConfig

if TYPE_CHECKING:
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.notify import Notifier

log = logging.getLogger("reconciler.agent")


class VerdictLog:
    """Logs what a pass came to, once, and again only when it changes. Failures, refusals and
    halts are logged by the pass itself (once per commit and reason, with the reason code and
    the service's last output); this adds the quiet outcomes: applied, staged, waiting."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.last: tuple[str, str, str] | None = None

    def __call__(self, result: RunResult) -> None:
        if result.error is not None or result.skipped or (result.report is not None and result.report.reason):
            self.last = None
            return
        if result.report is not None:
            key = (result.commit, str(result.report.state), "")
            text = str(result.report.state)
        elif result.waiting:
            key = (result.commit, "waiting", result.waiting)
            text = f"waiting: {result.waiting}"
        else:
            key = (result.commit, "unchanged", "")
            text = "unchanged"
        if key == self.last:
            return
        self.last = key
        log.info("%s @ %s: %s", result.node, result.commit[:12], text)


class Outputs:
    """What follows every pass: notifications sent, metrics refreshed (and the textfile written).
    Built before the first pass, so a bad setting (a secret's variable unset, an address in use)
    stops the start with a one-line error. After a pass, neither may fail it: a problem is
    logged once (``strict``: raised, for ``agent --once``, whose exit code should say so)."""

    def __init__(self, agent: Agent) -> None:
        cfg = agent.cfg
        self.agent = agent
        # notify and shed are imported when used: `agent --once` without notifications needs neither
        self.notifier: Notifier | None = None
        if cfg.notify.enabled:
            from reconciler.daemon.notify import Notifier

            self.notifier = Notifier(cfg.notify, cfg.state_dir)
        self.metrics: Metrics | None = None
        if cfg.metrics.listen or cfg.metrics.textfile:
            # Imported only when asked for: prometheus-client is 12 MB of an idle agent's RSS.
            from reconciler.daemon.metrics import Metrics

            self.metrics = Metrics(agent)

    def serve(self, adopt: int | None = None) -> int | None:
        """``/metrics`` on the configured address; the port it listens on. ``adopt``: the
        socket the interpreter this one replaced listened on."""
        if self.metrics is None or self.agent.cfg.metrics.listen is None:
            if adopt is not None:
                os.close(adopt)
            return None
        return self.metrics.serve(self.agent.cfg.metrics.listen, adopt)

    def listening(self) -> int | None:
        return None if self.metrics is None else self.metrics.listening()

    def __call__(self, result: RunResult | None, error: ReconcilerError | None = None, strict: bool = False) -> None:
        if self.notifier is not None and result is not None:
            try:
                self.notifier.after_pass(result)
            except Exception as exc:  # a notification must never cost the node its pass
                if strict and isinstance(exc, ReconcilerError):
                    raise
                self.agent.say_once(("notify", str(exc)), logging.WARNING, "%s: notifications: %s", self.agent.cfg.node,
                                    exc)
        if self.metrics is not None:
            try:
                self.metrics.after_pass(result, error)
            except ReconcilerError as exc:
                if strict:
                    raise
                self.agent.say_once(("metrics", str(exc)), logging.WARNING, "%s: metrics: %s", self.agent.cfg.node,
                                    exc)

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


class Shedding:
    """Whether the daemon should re-execute itself now (``shed``): after a quiet pass (nothing to
    do, nothing failed, nothing waiting) that follows work, when the work left it heavier by
    ``GROWTH_MB``. A fresh interpreter has done no work, so it never sheds on its first quiet
    polls, whatever they load: no loop of re-executions."""

    def __init__(self, agent: Agent, reload: Callable[[], AgentConfig] | None) -> None:
        from reconciler.daemon import shed

        self.agent = agent
        self.reload = reload
        self.start_mb = shed.rss_mb()
        self.worked = False
        self.off = not shed.possible()
        self.code = shed.code_files()  # what this interpreter started from

    def after(self, result: RunResult | None) -> bool:
        from reconciler.daemon import shed

        quiet = result is not None and result.error is None and result.report is None and not (
            result.waiting or result.operation or result.suspended)
        if not quiet:
            self.worked = True
            return False
        now = shed.rss_mb()
        return (not self.off and self.worked and now is not None and self.start_mb is not None
                and now - self.start_mb >= shed.GROWTH_MB)

    def same_config(self) -> bool:
        """A fresh interpreter reads the config file again: when it no longer says what this
        one runs with (or no longer parses), keep running; the operator's restart applies it."""
        if self.reload is None:
            return True
        try:
            same = self.reload() == self.agent.cfg
        except ReconcilerError as exc:
            same, why = False, f"it no longer loads: {exc}"
        else:
            why = "it changed"
        if not same:
            self.agent.say_once(("shed", "config"), logging.WARNING, "%s: not re-executing to give back memory: "
                                "the config file differs from what this agent started with (%s); restart it "
                                "to apply the file", self.agent.cfg.node, why)
        return same

    def same_code(self) -> bool:
        """A fresh interpreter imports the code installed now: when it is not what this one
        started from (an upgrade that did not restart the unit), keep running; the operator's
        restart runs the new code, not a re-execution the operator did not ask for."""
        from reconciler.daemon import shed

        if shed.code_files() == self.code:
            return True
        self.agent.say_once(("shed", "code"), logging.WARNING, "%s: not re-executing to give back memory: the "
                            "agent's code in %s changed since it started (an upgrade without a restart); restart "
                            "it to run the new code", self.agent.cfg.node, shed.CODE)
        return False
