"""Prometheus metrics of one node: what it knows after each pass, read from its ledger.

Every total comes from the ledger (runs, history, events, meta), never from a counter kept in
this process, so a restarted daemon reports the same totals and ``agent --once`` writes the same
textfile a daemon would serve. The pass's ``RunResult`` (or its error) is recorded in the ledger
first (``record_poll``), then the families are built again (``Metrics.refresh``); a scrape only
reads the last families built, so it never touches the ledger, the mirror or a runtime.

The registry is this module's own ``CollectorRegistry`` (not prometheus-client's global one,
which would add process and platform collectors and make two agents in one test collide).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from reconciler.core.errors import ConfigError, ReconcilerError
from reconciler.core.model import ActionKind, Verdict
from reconciler.ledger import Poll
from reconciler.node.run import RunResult
from reconciler.settings import split_listen
from reconciler.source.gitrun import commit_time

if TYPE_CHECKING:
    from reconciler.agent import Agent

log = logging.getLogger("reconciler.metrics")

# What a poll came to: a verdict a pass settled on, or one of the outcomes that settle nothing.
# Each once: "error" is a verdict too, and a label value twice is a page OpenMetrics refuses.
RESULTS = tuple(dict.fromkeys([*(str(v) for v in Verdict), "unchanged", "error"]))
# A failed change of these is put back to the version that ran before it (apply's restore); a
# failed start has nothing to go back to and a revive is the supervisor's, not a change.
ROLLED_BACK_ON_FAILURE = tuple(str(k) for k in (ActionKind.RELOAD, ActionKind.RESTART, ActionKind.RECREATE,
                                                ActionKind.DRAIN_RESTART, ActionKind.CONNECT))

# Every name a scrape can show (samples, not families): contrib/ rules and dashboards are checked
# against it by the tests, so they cannot name a metric that does not exist.
EXPORTED = (
    "reconciler_last_poll_timestamp_seconds",
    "reconciler_last_poll_result",
    "reconciler_polls_total",
    "reconciler_poll_interval_seconds",
    "reconciler_applied_commit_info",
    "reconciler_head_commit_info",
    "reconciler_applied_commit_timestamp_seconds",
    "reconciler_behind_head_seconds",
    "reconciler_runs_total",
    "reconciler_actions_total",
    "reconciler_rollbacks_total",
    "reconciler_refusals_total",
    "reconciler_last_note_push_timestamp_seconds",
    "reconciler_suspended",
    "reconciler_suspended_info",
    "reconciler_services",
    "reconciler_services_running",
    "reconciler_services_drifted",
)


def poll_result(result: RunResult | None, error: ReconcilerError | None = None) -> str:
    """One word for what a pass came to (a label value of ``reconciler_last_poll_result``)."""
    if result is None:
        return "error"
    if result.report is not None:
        return str(result.report.state)
    if result.waiting:
        return "waiting"
    if result.skipped.startswith("refused"):
        return "refused"
    if result.skipped:
        return "failed"  # failed here before: waits for a retry or a new commit
    if result.error is not None or error is not None:
        return "error"
    return "unchanged"


def record_poll(agent: Agent, result: RunResult | None, error: ReconcilerError | None = None) -> None:
    """The pass (or its error) into the ledger, where the metrics read it back from."""
    word = poll_result(result, error)
    last = agent.ledger.last_poll()
    head = result.commit if result is not None else (last.head if last is not None else "")
    head_time = last.head_time if last is not None and head == last.head else None
    if head and head_time is None:
        # Read by git, not through the mirror's pygit2: a node's first quiet pass with metrics on
        # would load it (11 MB) for this one number.
        head_time = _commit_time(agent, head)
    agent.ledger.record_poll(Poll(time.time(), word, head, head_time))


@dataclass(frozen=True)
class Services:
    total: int
    running: int
    drifted: int


def families(agent: Agent, services: Services | None) -> list[Metric]:
    """The node's metrics now, from the ledger (and ``services`` as observed after the pass)."""
    ledger = agent.ledger
    out: list[Metric] = []
    last = ledger.last_poll()
    if last is not None:
        out.append(GaugeMetricFamily("reconciler_last_poll_timestamp_seconds",
                                     "When the last poll of the branch ended (seconds since the epoch).",
                                     value=last.time))
        g = GaugeMetricFamily("reconciler_last_poll_result", "What the last poll came to: 1 for its result.",
                              labels=["result"])
        for word in RESULTS:
            g.add_metric([word], 1.0 if last.result == word else 0.0)
        out.append(g)
    c = CounterMetricFamily("reconciler_polls", "Polls of the branch by what they came to.", labels=["result"])
    for word, n in sorted(ledger.poll_counts().items()):
        c.add_metric([word], float(n))
    out.append(c)
    out.append(GaugeMetricFamily("reconciler_poll_interval_seconds", "Seconds between polls (agent.yaml interval).",
                                 value=agent.cfg.interval))

    applied = ledger.last_applied()
    applied_time = _commit_time(agent, applied) if applied else None
    if applied:
        out.append(_info("reconciler_applied_commit", "The commit this node last applied.", applied))
        if applied_time is not None:
            out.append(GaugeMetricFamily("reconciler_applied_commit_timestamp_seconds",
                                         "Committer time of the applied commit.", value=float(applied_time)))
    head, head_time = (last.head, last.head_time) if last is not None else ("", None)
    if head:
        out.append(_info("reconciler_head_commit", "The branch head the last poll saw.", head))
    if head and applied:
        # The branch's head time minus the applied commit's: how far behind the fleet's wish this
        # node is. 0 when it runs the head (or the head is older, after a revert by reset).
        behind = 0.0 if head == applied or head_time is None or applied_time is None \
            else max(0.0, float(head_time) - float(applied_time))
        out.append(GaugeMetricFamily("reconciler_behind_head_seconds",
                                     "Head commit's time minus the applied commit's time (0: up to date).",
                                     value=behind))

    runs = CounterMetricFamily("reconciler_runs", "Runs settled, by the verdict they came to.", labels=["state"])
    refusals = CounterMetricFamily("reconciler_refusals", "Commits refused, by reason code.", labels=["reason"])
    by_state: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for (state, reason), n in ledger.run_counts().items():
        by_state[state] = by_state.get(state, 0) + n
        if state == str(Verdict.REFUSED):
            by_reason[reason or "UNKNOWN"] = by_reason.get(reason or "UNKNOWN", 0) + n
    for state in sorted(set(by_state) | {str(v) for v in Verdict}):
        runs.add_metric([state], float(by_state.get(state, 0)))
    for reason, n in sorted(by_reason.items()):
        refusals.add_metric([reason], float(n))
    out += [runs, refusals]

    actions = CounterMetricFamily("reconciler_actions", "Actions on services, by kind and result.",
                                  labels=["action", "result"])
    failed_changes = 0
    for (action, result), n in ledger.action_counts().items():
        actions.add_metric([action, result], float(n))
        if result == "failed" and action in ROLLED_BACK_ON_FAILURE:
            failed_changes += n
    out.append(actions)
    rollbacks = CounterMetricFamily("reconciler_rollbacks", "Services put back to an earlier version, by who.",
                                    labels=["by"])
    rollbacks.add_metric(["failed_change"], float(failed_changes))
    rollbacks.add_metric(["on_failure_node"], float(ledger.event_count("on_failure node: ")))
    rollbacks.add_metric(["operator"], float(ledger.event_count("rollback of ")))
    out.append(rollbacks)

    pushed = ledger.notes_pushed().time
    if pushed is not None:
        out.append(GaugeMetricFamily("reconciler_last_note_push_timestamp_seconds",
                                     "When this node's notes were last pushed.", value=pushed))
    # The ledger's record that passes read too: the metric says what the agent does.
    suspended = ledger.suspension()
    out.append(GaugeMetricFamily("reconciler_suspended", "1 while the agent is suspended.",
                                 value=1.0 if suspended else 0.0))
    if suspended:
        info = GaugeMetricFamily("reconciler_suspended_info", "The suspension in force: why, by whom.",
                                 labels=["reason", "by"])
        info.add_metric([suspended.get("reason", ""), suspended.get("by", "")], 1.0)
        out.append(info)
    if services is not None:
        out.append(GaugeMetricFamily("reconciler_services", "Services of this node (observed).",
                                     value=services.total))
        out.append(GaugeMetricFamily("reconciler_services_running", "Services running.", value=services.running))
        out.append(GaugeMetricFamily("reconciler_services_drifted", "Services changed by hand (drift).",
                                     value=services.drifted))
    return out


def observe_services(agent: Agent) -> Services | None:
    """What runs now; None when a runtime cannot be observed (the gauges are left out, not 0)."""
    from reconciler.drivers.observe import observe

    try:
        seen = observe(agent.cfg.node, agent.drivers(None)).services
    except ReconcilerError:
        return None
    return Services(len(seen), sum(1 for o in seen if o.running), sum(1 for o in seen if o.drifted))


class Metrics:
    """The node's registry: refreshed after each pass, served over HTTP and/or written to a file."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.registry = CollectorRegistry(auto_describe=False)
        self._families: list[Metric] = []
        self._lock = threading.Lock()
        self._server: Any = None
        self.registry.register(self)  # type: ignore[arg-type]  # a collector is anything with collect()
        self.refresh()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            return iter(list(self._families))

    def refresh(self) -> None:
        built = families(self.agent, observe_services(self.agent))
        with self._lock:
            self._families = built

    def after_pass(self, result: RunResult | None, error: ReconcilerError | None = None) -> None:
        record_poll(self.agent, result, error)
        self.refresh()
        if self.agent.cfg.metrics.textfile is not None:
            self.write_textfile(self.agent.cfg.metrics.textfile)

    def write_textfile(self, path: Path) -> None:
        """node_exporter's textfile format; prometheus-client writes a temp file and renames it."""
        try:
            write_to_textfile(str(path), self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot write the metrics textfile: {exc.strerror}", file=str(path)) from exc

    def serve(self, listen: str, adopt: int | None = None) -> int:
        """``/metrics`` on ``listen`` (host:port) in a thread of its own; returns the port (the
        one chosen, for port 0). ``adopt``: a socket already listening there, handed over by
        the interpreter this one replaced (``shed``): scrapes wait in its backlog meanwhile."""
        host, port = split_listen(listen, "metrics.listen")
        try:
            self._server = _server(host, port, self.registry, adopt)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {listen}: {exc.strerror}", file="metrics.listen") from exc
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()
        return int(self._server.server_port)

    def listening(self) -> int | None:
        """The listening socket's descriptor, to hand over across a re-execution."""
        return None if self._server is None else int(self._server.fileno())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base's name)
        """A scrape is not worth a log line."""


def _server(host: str, port: int, registry: CollectorRegistry, adopt: int | None) -> ThreadingWSGIServer:
    """prometheus-client's threading server and app, on a socket bound here or adopted: its
    ``start_http_server`` can only bind a new one."""
    if adopt is None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        bound: type[ThreadingWSGIServer] = type("Server", (ThreadingWSGIServer,), {"address_family": family})
        server = bound((host, port), _Quiet)
    else:
        listening = socket.socket(fileno=adopt)
        listening.set_inheritable(False)  # the services this daemon starts must not hold it
        server = ThreadingWSGIServer((host, port), _Quiet, bind_and_activate=False)
        server.socket.close()
        server.socket = listening
        address = listening.getsockname()
        server.server_address = address
        # What binding would have set (http.server and wsgiref), here from the socket itself.
        server.server_name = socket.getfqdn(str(address[0]))
        server.server_port = int(address[1])
        server.setup_environ()
    server.set_app(make_wsgi_app(registry))
    return server


def _info(name: str, doc: str, commit: str) -> InfoMetricFamily:
    family = InfoMetricFamily(name, doc, labels=[])
    family.add_metric([], {"commit": commit})
    return family


_TIMES: dict[tuple[Path, str], int] = {}  # a commit's time never changes: one git per applied commit


def _commit_time(agent: Agent, commit: str) -> int | None:
    key = (agent.source.path, commit)
    if key not in _TIMES:
        found = commit_time(agent.source.path, commit)
        if found is None:
            return None  # asked again next time: a git that failed once may not fail twice
        if len(_TIMES) > 64:
            _TIMES.clear()
        _TIMES[key] = found
    return _TIMES[key]
