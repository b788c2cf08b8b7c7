"""Commands that read this node: ``status`` (``status --fleet`` is handed to ``fleet``),
``history`` of its runs (``--fleet``: of every node's notes) and ``logs`` of a service. They
take the agent's settings and change nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from reconciler.cli.common import (
    agent_config,
    agent_options,
    emit_json,
    escape,
    flight_text,
    in_flight,
    local_config,
    new_table,
    out,
    output_option,
    style,
)
from reconciler.core.errors import BadInput
from reconciler.drivers.observe import observe


@click.command()
@agent_options
@click.option("--fleet", is_flag=True, help="The whole rollout from every node's notes (fetches them).")
@click.option("--rev", help="With --fleet: the commit to show [the branch head].")
@click.option("--html", "html_file", type=click.Path(path_type=Path), help="With --fleet: also write a page.")
@click.option("--html-refresh", type=click.IntRange(min=1), metavar="SECONDS",
              help="With --html: the page reloads itself every SECONDS (served from a CI artifact) [off].")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path),
              help="With --fleet: a clone of the deployment repo; its notes fetched from --remote [origin]. "
                   "The default with no node settings: the current directory.")
@click.option("--watch", is_flag=True, help="With --fleet: read again until every node applied, failed, halted "
                                             "or refused the commit; exit 0 when all applied, 1 otherwise.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="With --watch: seconds between reads.")
@output_option
def status(agent_opts: dict[str, Any], fleet: bool, rev: str | None, html_file: Path | None,
           html_refresh: int | None, repo_dir: Path | None, watch: bool, interval: float, output: str) -> None:
    """What runs on this node now, from which commit, and the last run's verdict; with --fleet,
    every node's state for a commit, per wave.

    \b
    Example:
      reconciler status --config /etc/reconciler/agent.yaml -o json
      reconciler status --fleet --config /etc/reconciler/agent.yaml --html rollout.html
      reconciler status --fleet --repo . --watch --interval 30   # from any clone, a CI job
      reconciler status --fleet --repo . --html rollout.html --html-refresh 60

    \b
    Exit codes:
      0  printed; with --fleet: no node failed, halted, refused or errored on the commit
         (with --watch: every node applied it)
      1  with --fleet: a node failed, halted, refused or errored on the commit (the rollout
         is stopped); or the remote did not answer
      2  bad input: no node in the state dir, no state dir there (with --fleet: the agent
         has not run there), bad settings, an unknown --rev, not a clone, an --html FILE
         that cannot be written
    """
    if html_refresh is not None and html_file is None:
        raise BadInput("--html-refresh goes with --html")
    if fleet:
        from reconciler.cli.fleet import show_fleet

        show_fleet(agent_opts, rev, html_file, output, repo_dir=repo_dir, watch=watch, interval=interval,
                   html_refresh=html_refresh)
        return
    if repo_dir is not None or watch:
        raise BadInput("--repo and --watch go with --fleet")
    cfg = local_config(agent_opts, remote="unused")  # the node: its state dir's, when not given
    from reconciler.ledger import Ledger
    from reconciler.ledger.statedir import State
    from reconciler.node.context import drivers_for

    state = State(cfg.state_dir, create=False)
    ledger = Ledger.open(cfg.state_dir, create=False)
    observed = observe(cfg.node, drivers_for(cfg, None))
    # An action or upgrade step a pass began and has not seen through: what runs may be the new
    # version, not yet checked healthy, or stopped by the upgrade. Under way while a pass holds
    # the lock; else the next run takes it up. "in progress" only when the kernel says so.
    busy = state.held()
    said = {True: "in progress", False: "interrupted", None: "interrupted or in progress"}[busy]
    flights = [{**f, "state": said} for f in in_flight(ledger)]
    last = ledger.last_run()
    head = ledger.mark().commit
    record = ledger.record(head) if head else None
    converged = ledger.converged()
    applied = converged[0] if converged else None
    pins = [p.to_dict() for p in ledger.pins()]
    suspended = ledger.suspension()
    held, retired = ledger.held_stopped(), ledger.retired()  # `reconciler stop`; a decommission
    found = ledger.damaged()
    damaged = found[0] if found else None
    if output == "json":
        emit_json({"node": cfg.node, "head": head, "verdict": str(record.verdict) if record else None,
                   "applied_commit": applied, "pins": pins, "last_run": last, "suspended": suspended,
                   "held_stopped": held, "retired": retired,
                   "ledger_damaged": {"time": damaged.time, "why": damaged.why, "moved_to": damaged.moved_to}
                   if damaged else None, "in_flight": flights, **observed.to_dict()})
        return
    out.print(f"node {cfg.node}: head {head[:12] if head else 'none yet'}"
              + (f" {style(str(record.verdict))}" if record else "")
              + (f"; last run {last['commit'][:12]} {style(last['state'])}" if last else ""))
    if suspended:
        out.print(f"suspended by {escape(suspended.get('by', '?'))} since {suspended.get('since', '?')}: "
                  f"{escape(suspended.get('reason') or 'no reason given')}; nothing is applied")
    if retired:
        out.print(f"decommissioned at {str(retired.get('commit', ''))[:12]} (listed under `decommission`): "
                  "nothing runs; remove the state dir to finish (docs/day2.md)")
    for name, by in sorted(held.items()):
        out.print(f"{escape(name)}: stopped by {escape(by.get('by', '?'))} since {by.get('since', '?')}; "
                  "kept stopped until `reconciler start`")
    if damaged:  # said for as long as this ledger lives: its history begins there
        out.print(escape(damaged.event))
    for f in flights:  # what runs there may be the new version, not yet seen healthy
        out.print(f"{escape(flight_text(f))}: {said}"
                  + ("" if busy else "; the next run " + ("takes it up" if f["action"] == "step" else "finishes it")))
    table = new_table("service", "driver", "running", "pid", "commit", "hash", "pinned")
    pinned = {p["service"]: p["commit"] for p in pins}
    flight = {f["service"]: f"[yellow]{escape('step ' + f['step'] if 'step' in f else f['action'])} {said}[/]"
              for f in flights}
    for s in observed.services:
        running = style("ok") if s.running else style("failed")
        running = flight.get(s.name, running)
        if s.drifted:  # changed by hand since applied: said here, not only under -o json
            running += f", drifted: {escape(s.drifted.removeprefix('files: '))}"
        table.add_row(s.name, s.driver, running, str(s.pid or "-"),
                      (s.commit or "")[:12], (s.hash or "")[:12], pinned.get(s.name, "")[:12])
    out.print(table)


@click.command()
@agent_options
@click.argument("service", required=False)
@click.option("--limit", default=30, show_default=True)
@click.option("--fleet", is_flag=True, help="The branch's commits, each with what every node noted on it.")
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path),
              help="With --fleet: a clone of the deployment repo (as status --fleet --repo).")
@output_option
def history(agent_opts: dict[str, Any], service: str | None, limit: int, fleet: bool, repo_dir: Path | None,
            output: str) -> None:
    """What this node applied, per service, newest first; with --fleet, the branch's commits
    and how many nodes applied, failed or halted each.

    \b
    Example:
      reconciler history identity --state-dir /var/lib/reconciler
      reconciler history --fleet --repo . --limit 10

    \b
    Exit codes:
      0  printed (an empty history too, without SERVICE)
      1  with --fleet: the remote did not answer
      2  bad input: no node in the state dir, bad settings, not a clone, a SERVICE with no
         history on this node
    """
    if fleet:
        from reconciler.cli.fleet import show_fleet_history

        show_fleet_history(agent_opts, repo_dir, limit, output)
        return
    cfg = agent_config(agent_opts, node="local", remote="unused")
    from datetime import UTC, datetime

    from reconciler.ledger import Ledger
    from reconciler.ledger.statedir import State

    State(cfg.state_dir, create=False)
    ledger = Ledger.open(cfg.state_dir, create=False)
    rows = ledger.history(service, limit)
    known = ledger.services_in_history() if service and not rows else []
    if service and not rows and service not in known:  # a typo read as "nothing happened to it" misleads
        raise BadInput(f"service {service!r}: not in this node's history (it has: {', '.join(known) or 'none'})")
    if output == "json":
        emit_json([r.to_dict() for r in rows])
        return
    table = new_table("time", "service", "commit", "action", "result", "reason")
    for r in rows:
        when = datetime.fromtimestamp(r.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, r.service, r.commit[:12], r.action, style(r.result),
                      escape(_why(r.reason, r.detail, r.action)))
    out.print(table)


def _why(reason: str, detail: str, action: str) -> str:
    """The plan's reason, then what the detail adds to it: a failure, the steps of an escalation,
    a revive's count. A lone "restart: ok" adds nothing the action and result columns do not say."""
    if not detail or detail == f"{action}: ok":
        return reason or detail
    return f"{reason}; {detail}" if reason else detail


@click.command()
@agent_options
@click.argument("service")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the service writes, until interrupted.")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=50, show_default=True,
              help="How many of the last lines to print first.")
@output_option
def logs(agent_opts: dict[str, Any], service: str, follow: bool, lines: int, output: str) -> None:
    """A service's own output, from its driver: the process driver's log file (rotated files
    followed), the container's log, or journalctl for the systemd unit. With -o json (not with
    -f): {"service", "driver", "output"}.

    \b
    Example:
      reconciler logs identity --config /etc/reconciler/agent.yaml -n 100
      reconciler logs db -f --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  printed (with -f: until interrupted)
      1  the runtime did not answer (a docker engine down)
      2  bad input: SERVICE does not run on this node (UNKNOWN_SERVICE), bad settings
    """
    cfg = local_config(agent_opts, remote="unused")
    from reconciler.ledger.statedir import State
    from reconciler.node.context import drivers_for

    State(cfg.state_dir, create=False)  # a read: no state dir is made for it
    found = [(d, o) for d in drivers_for(cfg, None).values() for o in d.observe() if o.name == service]
    if not found:
        known = sorted({o.name for d in drivers_for(cfg, None).values() for o in d.observe()})
        raise BadInput(f"service {service} does not run on node {cfg.node} (it runs: {', '.join(known) or 'nothing'})",
                       reason="UNKNOWN_SERVICE")
    driver = found[0][0]
    if output == "json":
        if follow:
            raise BadInput("-f prints as the service writes: not with -o json")
        text = b"".join(driver.logs(service, lines, False)).decode(errors="replace")
        emit_json({"service": service, "driver": driver.name, "output": text})
        return
    stream = sys.stdout.buffer
    try:
        for chunk in driver.logs(service, lines, follow):
            stream.write(chunk)
            stream.flush()
    except KeyboardInterrupt:  # -f ends with ^C: not an error
        pass
