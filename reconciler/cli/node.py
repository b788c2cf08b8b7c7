"""Commands on this node: they take the agent's settings (--config, flags) and act on, or read,
its state directory. ``status --fleet`` is handed to ``fleet``, ``verify --repo`` to ``repo``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from reconciler.agent import RunResult
from reconciler.cli.common import (
    Failed,
    agent_config,
    agent_options,
    emit_json,
    err,
    escape,
    new_table,
    node_agent,
    out,
    output_option,
    style,
)
from reconciler.core.errors import BadInput, ReconcilerError
from reconciler.drivers.observe import observe


@click.command()
@agent_options
@click.option("--rev", help="Plan this commit of the node's mirror instead of the branch head.")
@click.option("--no-fetch", is_flag=True, help="Use the mirror as it is; do not contact the remote.")
@output_option
def plan(agent_opts: dict[str, Any], rev: str | None, no_fetch: bool, output: str) -> None:
    """Show what this node would do for the branch head, and why. Changes nothing.

    \b
    Example:
      reconciler plan --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  the plan is printed (whatever it changes)
      1  the remote did not answer, another run holds the lock
      2  bad input or refused: bad settings, a problem in the repo, an unsigned commit
    """
    agent = node_agent(agent_opts)
    the_plan, _ = agent.plan(fetch=not no_fetch and rev is None, rev=rev)
    if output == "json":
        emit_json(the_plan.to_dict())
        return
    table = new_table("service", "action", "reason",
                  title=f"{agent.cfg.node} @ {the_plan.commit[:12]} (plan {the_plan.hash})")
    for a in the_plan.actions:
        table.add_row(a.service, style(str(a.kind)), escape(a.reason))
    out.print(table)
    n = len(the_plan.changes)
    out.print(f"{n} change{'s' if n != 1 else ''}" if n else "nothing to do")


def _run_error(result: RunResult) -> ReconcilerError | None:
    """Why a pass exits non-zero: its error, or the verdict of a run that failed or halted."""
    if result.error is not None:
        return result.error
    if result.exit_code == 0 or result.report is None:
        return None
    rep = result.report
    state = str(rep.state)
    return ReconcilerError(f"{result.node} {state} at {result.commit[:12]}" + (f": {rep.error}" if rep.error else ""),
                           reason=rep.reason or state.upper())


def _finish_run(result: RunResult, output: str) -> None:
    """Print a pass and exit with its code; under -o json a failure is one object, the result
    with its ``error``."""
    if output == "json":
        error = _run_error(result)
        if error is not None:
            raise Failed(error, result.to_dict())
        emit_json(result.to_dict())
        sys.exit(result.exit_code)
    short = result.commit[:12]
    for c, s, a in result.interrupted:
        err.print(f"[yellow]note[/]: a previous run was interrupted during {a} {s} at {c[:12]}")
    if result.report is None and result.waiting:
        out.print(f"{result.node} @ {short}: not yet: {escape(result.waiting)}")
    elif result.report is None:
        out.print(f"{result.node} @ {short}: unchanged, nothing to do")
    else:
        rep = result.report
        if rep.services:
            table = new_table("service", "action", "result", "reason", "detail",
                          title=f"{result.node} @ {short}: {rep.state}")
            for r in rep.services:
                table.add_row(r.service, style(str(r.action)), style(str(r.state)), escape(r.reason),
                              escape(r.detail))
            out.print(table)
        else:
            out.print(f"{result.node} @ {short}: {style(str(rep.state))}")
    if not result.pushed:
        err.print("[yellow]warning[/]: the note could not be pushed; it will be pushed on the next run")
    if result.error is not None:
        raise result.error
    sys.exit(result.exit_code)


@click.command()
@agent_options
@click.argument("commit", required=False)
@click.option("--rev", help="Same as COMMIT.")
@click.option("--service", "services", multiple=True, help="Only this service (repeatable).")
@click.option("--no-fetch", is_flag=True, help="Apply what the mirror has; do not contact the remote.")
@output_option
def apply(agent_opts: dict[str, Any], commit: str | None, rev: str | None, services: tuple[str, ...],
          no_fetch: bool, output: str) -> None:
    """Converge this node on the branch head (or COMMIT) now, and note the result. This is
    also how services under `apply: manual`, which the agent only stages, are instantiated.

    \b
    Example:
      reconciler apply --config /etc/reconciler/agent.yaml
      reconciler apply --config /etc/reconciler/agent.yaml --service identity

    \b
    Exit codes:
      0  applied, or nothing to do, or waiting (an earlier wave, a barrier, a maintenance window)
      1  failed: a service failed its change (and was put back), the node is halted by a
         failure elsewhere, the remote did not answer, DISK_FULL, another run holds the lock
      2  bad input or refused, nothing applied: a --service this node does not run, a
         problem in the repo at that commit, an unsigned or rewound commit, bad settings
    """
    agent = node_agent(agent_opts)
    rev = commit or rev
    result = agent.reconcile_once(fetch=not no_fetch and rev is None, rev=rev, instantiate=True,
                                  only=set(services) or None)
    _finish_run(result, output)


@click.command("agent")
@agent_options
@click.option("--once", is_flag=True, help="Run one pass (poll, apply, report) and exit.")
@click.option("--interval", type=float, help="Seconds between polls.")
@click.option("--jitter", type=float, help="Random extra seconds per poll.")
@click.option("--metrics-textfile", type=click.Path(path_type=Path),
              help="Write Prometheus metrics there after each pass (node_exporter's textfile format).")
@output_option
def agent_command(agent_opts: dict[str, Any], once: bool, interval: float | None, jitter: float | None,
                  metrics_textfile: Path | None, output: str) -> None:
    """Run the agent: poll the repo, apply, report; supervise services in between.

    \b
    Example:
      reconciler agent --config /etc/reconciler/agent.yaml
      reconciler agent --once --node ctl1 --remote file:///srv/cloud.git --state-dir /tmp/ctl1 \\
          --allowed-signers /etc/reconciler/allowed_signers
      reconciler agent --once --config /etc/reconciler/agent.yaml \\
          --metrics-textfile /var/lib/node_exporter/textfile/reconciler.prom

    \b
    Exit codes (the daemon exits 0 when stopped; these are for --once, and for a start refused):
      0  applied, or nothing to do, or waiting (an earlier wave, a barrier, a maintenance window)
      1  failed: a service failed its change (and was put back), the node is halted by a
         failure elsewhere, the remote did not answer, DISK_FULL, another run (or daemon)
         holds the lock
      2  bad input or refused, nothing applied: a problem in the repo at that commit, an
         unsigned or rewound commit, bad settings
    """
    from reconciler.daemon.loop import Outputs, run_daemon

    settings = {"interval": interval, "jitter": jitter, "metrics_textfile": metrics_textfile}
    the_agent = node_agent(agent_opts, **settings)
    if once:
        outputs = Outputs(the_agent)  # a bad notify or metrics setting stops before the pass
        try:
            result = the_agent.reconcile_once()
        except ReconcilerError as exc:
            outputs(None, exc)  # the metrics say the poll failed; the error is the command's
            raise
        outputs(result, strict=True)
        _finish_run(result, output)

    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
    run_daemon(the_agent, reload=lambda: agent_config(agent_opts, **settings))


@click.command()
@agent_options
@click.argument("spec", required=False)
@click.option("--repo", "repo_dir", type=click.Path(path_type=Path),
              help="Verify in this git repo instead of the node's mirror (no node settings needed).")
@click.option("--no-fetch", is_flag=True, help="Use the mirror as it is; do not contact the remote.")
@output_option
def verify(agent_opts: dict[str, Any], spec: str | None, repo_dir: Path | None, no_fetch: bool, output: str) -> None:
    """Check commits against this node's trust root: REV (default the branch head) or A..B.

    Prints each commit's verdict and signer; exit 2 if any is refused. With -o json, a list
    of verdicts (each with ok and reason), refused ones included.

    \b
    Example:
      reconciler verify --config /etc/reconciler/agent.yaml HEAD~5..HEAD
      reconciler verify --repo . --allowed-signers ./allowed_signers origin/main

    \b
    Exit codes:
      0  every commit is signed by a trusted key
      1  the remote did not answer, another run holds the lock
      2  refused: a commit is unsigned, signed by an unknown or revoked key, or rewinds
         history; or bad input: no trust root, not a git repo, an unknown commit
    """
    from reconciler.cli.repo import verify_in_repo
    from reconciler.trust.verify import verify_range

    if repo_dir is not None:
        verdicts = verify_in_repo(agent_config(agent_opts, node="local", remote="unused"), repo_dir, spec or "HEAD")
    else:
        the_agent = node_agent(agent_opts)
        with the_agent.state.lock(wait=30):
            head, _ = the_agent.head(fetch=not no_fetch, rev=None)
        verdicts = verify_range(the_agent.source.repo, spec or head, the_agent.gate)
    if output == "json":
        emit_json([v.to_dict() for v in verdicts])
    else:
        table = new_table("commit", "verdict", "reason", "format", "signer", "key")
        for v in verdicts:
            table.add_row(v.commit[:12], style("ok") if v.ok else style("refused"), escape(v.message or v.reason),
                          v.format, v.principal, v.fingerprint)
        out.print(table)
    if not all(v.ok for v in verdicts):
        sys.exit(2)


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
      2  bad input: no node in the state dir, bad settings, an unknown --rev, not a clone,
         an --html FILE that cannot be written
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
    cfg = agent_config(agent_opts, remote="unused")
    from reconciler.agent import drivers_for
    from reconciler.ledger.ledger import Ledger
    from reconciler.ledger.statedir import State

    State(cfg.state_dir, create=False)
    ledger = Ledger.open(cfg.state_dir, create=False)
    observed = observe(cfg.node, drivers_for(cfg, None))
    last = ledger.last_run()
    head = ledger.mark().commit
    record = ledger.record(head) if head else None
    converged = ledger.converged()
    applied = converged[0] if converged else None
    pins = [p.to_dict() for p in ledger.pins()]
    suspended = ledger.suspension()
    if output == "json":
        emit_json({"node": cfg.node, "head": head, "verdict": str(record.verdict) if record else None,
                   "applied_commit": applied, "pins": pins, "last_run": last, "suspended": suspended,
                   **observed.to_dict()})
        return
    out.print(f"node {cfg.node}: head {head[:12] if head else 'none yet'}"
              + (f" {style(str(record.verdict))}" if record else "")
              + (f"; last run {last['commit'][:12]} {style(last['state'])}" if last else ""))
    if suspended:
        out.print(f"suspended by {escape(suspended.get('by', '?'))} since {suspended.get('since', '?')}: "
                  f"{escape(suspended.get('reason') or 'no reason given')}; nothing is applied")
    table = new_table("service", "driver", "running", "pid", "commit", "hash", "pinned")
    pinned = {p["service"]: p["commit"] for p in pins}
    for s in observed.services:
        table.add_row(s.name, s.driver, style("ok") if s.running else style("failed"), str(s.pid or "-"),
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

    from reconciler.ledger.ledger import Ledger
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
        table.add_row(when, r.service, r.commit[:12], r.action, style(r.result), escape(r.detail or r.reason))
    out.print(table)


@click.command()
@agent_options
@click.argument("service")
@click.option("--to", "to", help="Commit to put the service back to [its previous good one].")
@output_option
def rollback(agent_opts: dict[str, Any], service: str, to: str | None, output: str) -> None:
    """Put one service on this node back to an earlier version, now, without the git server,
    and pin it there until the branch moves on or `reconciler unpin SERVICE`.

    The fleet's rollback is `git revert` (a reviewed commit); this is the node's.

    \b
    Example:
      reconciler rollback identity --config /etc/reconciler/agent.yaml
      reconciler rollback identity --to 3f2a9c1 --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  the service runs the earlier version and is pinned there
      1  failed: the earlier version failed its health check, DISK_FULL, another run holds
         the lock
      2  bad input or refused: an unknown service or commit, nothing earlier to go back
         to, an earlier commit that is not signed by a trusted key
    """
    _finish_run(node_agent(agent_opts).rollback(service, to), output)


@click.command()
@agent_options
@click.argument("service")
@output_option
def unpin(agent_opts: dict[str, Any], service: str, output: str) -> None:
    """Release a pin made by `rollback`: the next run brings SERVICE to the branch head.

    With -o json: {"service": SERVICE, "released": true}.

    \b
    Example:
      reconciler unpin identity --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  the pin is released
      1  another run holds the lock
      2  bad input: SERVICE is not pinned on this node (NOT_PINNED), bad settings
    """
    the_agent = node_agent(agent_opts)
    if not the_agent.unpin(service):
        error = BadInput(f"service {service} is not pinned on node {the_agent.cfg.node}", reason="NOT_PINNED")
        if output == "json":
            raise Failed(error, {"service": service, "released": False})
        raise error
    if output == "json":
        emit_json({"service": service, "released": True})
        return
    out.print(f"{service}: pin released; the next run applies the branch head")


@click.command()
@agent_options
@output_option
def retry(agent_opts: dict[str, Any], output: str) -> None:
    """Try the branch head again on this node after it failed here (it is not retried on its own).

    With -o json: {"retry": COMMIT} (null when there is nothing to retry).

    \b
    Example:
      reconciler retry --config /etc/reconciler/agent.yaml && reconciler apply --config ...

    \b
    Exit codes:
      0  the head will be tried again on the next run, or there is nothing to retry
      1  another run holds the lock
      2  bad input: bad settings
    """
    failed = node_agent(agent_opts).retry()
    if output == "json":
        emit_json({"retry": failed})
        return
    out.print(f"will try {failed[:12]} again on the next run" if failed else "nothing to retry")


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
    cfg = agent_config(agent_opts, remote="unused")
    from reconciler.agent import drivers_for
    from reconciler.ledger.statedir import State

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


@click.command()
@agent_options
@click.option("--reason", default="", help="Why: shown in the node's note, status and metrics.")
@output_option
def suspend(agent_opts: dict[str, Any], reason: str, output: str) -> None:
    """Hold this node still: passes still fetch, verify and observe, report drift and what they
    would do, and apply nothing until `reconciler resume`. Again: the reason changes.

    With -o json: {"node": NODE, "suspended": {"reason", "by", "since"}, "already": BOOL}.

    \b
    Example:
      reconciler suspend --reason "disk swap, ticket 4411" --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  suspended (or its reason updated); a node that never ran yet starts out suspended
      2  bad input: bad settings
    """
    from reconciler.node.operations import invoker
    from reconciler.node.operations import suspend as suspend_node

    the_agent = node_agent(agent_opts)
    already = suspend_node(the_agent, reason, invoker())
    record = the_agent.ledger.suspension() or {}
    if output == "json":
        emit_json({"node": the_agent.cfg.node, "suspended": record, "already": already})
        return
    out.print(f"{the_agent.cfg.node}: suspended by {record.get('by', '?')} since {record.get('since', '?')}"
              + (f": {escape(reason)}" if reason else "") + ("" if not already else " (reason updated)")
              + "; nothing is applied until `reconciler resume`")


@click.command()
@agent_options
@output_option
def resume(agent_opts: dict[str, Any], output: str) -> None:
    """Lift `reconciler suspend`: the next pass converges. A fleet-wide `suspend: true` in the
    repo stays until a commit removes it.

    With -o json: {"node": NODE, "resumed": {"reason", "by", "since"} or null}.

    \b
    Example:
      reconciler resume --config /etc/reconciler/agent.yaml && reconciler agent --once --config ...

    \b
    Exit codes:
      0  resumed, or it was not suspended
      2  bad input: bad settings
    """
    from reconciler.node.operations import resume as resume_node

    the_agent = node_agent(agent_opts)
    lifted = resume_node(the_agent)
    if output == "json":
        emit_json({"node": the_agent.cfg.node, "resumed": lifted})
        return
    if lifted is None:
        out.print(f"{the_agent.cfg.node}: not suspended")
        return
    still = the_agent.ledger.suspension()
    out.print(f"{the_agent.cfg.node}: resumed; the next pass applies the branch head"
              + (f" (the repo still suspends the fleet: {escape(still.get('reason', ''))})" if still else ""))


@click.command()
@agent_options
@click.argument("commit", required=False)
@click.option("--no-fetch", is_flag=True, help="Use the mirror as it is; do not contact the remote.")
@output_option
def prepull(agent_opts: dict[str, Any], commit: str | None, no_fetch: bool, output: str) -> None:
    """Pull the images this node's docker services need at the branch head (or COMMIT), ahead
    of its wave, so the change itself does not wait on the registry. The commit is verified
    first, as for `plan`; nothing else changes (no container, verdict or note). Images the
    engine has already are left alone. With -o json: {"node", "commit", "images": [{"image",
    "services", "result": "pulled" | "present" | "failed", "detail"}]}.

    \b
    Example:
      reconciler prepull --config /etc/reconciler/agent.yaml
      reconciler prepull --config /etc/reconciler/agent.yaml 9c1f2e7

    \b
    Exit codes:
      0  every image is on the engine (pulled now, or there already)
      1  an image could not be pulled (the registry's reason is printed), the engine or the
         remote did not answer, another run holds the lock
      2  bad input or refused: an unsigned or rewound commit, a problem in the repo at that
         commit, an unknown COMMIT, bad settings
    """
    the_agent = node_agent(agent_opts)
    at, images = the_agent.prepull(fetch=not no_fetch and commit is None, rev=commit)
    failed = [p for p in images if p.result == "failed"]
    error = None
    if failed:
        error = ReconcilerError(f"{len(failed)} of {len(images)} image{'s' if len(images) != 1 else ''} not pulled: "
                                + "; ".join(p.detail for p in failed), reason="IMAGE_PULL_FAILED")
    if output == "json":
        doc = {"node": the_agent.cfg.node, "commit": at, "images": [p.to_dict() for p in images]}
        if error is not None:
            raise Failed(error, doc)
        emit_json(doc)
        return
    if not images:
        out.print(f"{the_agent.cfg.node} @ {at[:12]}: no docker service here, nothing to pull")
        return
    table = new_table("image", "services", "result", title=f"{the_agent.cfg.node} @ {at[:12]}: images")
    for p in images:
        table.add_row(escape(p.image), ", ".join(p.services), style(p.result))
    out.print(table)  # why one failed: the error line below, whole
    if error is not None:
        raise error
