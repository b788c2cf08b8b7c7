"""Commands that run the node's passes: they take the agent's settings (--config, flags) and
act on its state directory: ``plan``, ``apply``, ``agent``, ``rollback``, ``prepull``, and
``verify`` of the mirror's commits. ``verify --repo`` is handed to ``repo``; the commands that
read the node are ``inspect``, those that steer it between passes ``operate``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from reconciler.cli.common import (
    Failed,
    agent_config,
    agent_options,
    emit_json,
    escape,
    new_table,
    node_agent,
    out,
    output_option,
    style,
)
from reconciler.cli.run import _finish_run, _pass, run_agent
from reconciler.core.errors import ReconcilerError


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
      2  bad input or refused: bad settings, a problem in the repo, an unsigned commit, no
         state dir there (the agent has not run there), another node's state dir
    """
    from reconciler.node import operations  # the change path's: `agent` does not import it

    agent = node_agent(agent_opts)
    the_plan, _ = operations.plan(agent.ctx, fetch=not no_fetch and rev is None, rev=rev)
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
    130  interrupted (Ctrl-C): says which action on which service was under way; the next
         run finishes it
    """
    agent = node_agent(agent_opts, converge=True)
    rev = commit or rev
    result = _pass(agent, lambda: agent.reconcile_once(fetch=not no_fetch and rev is None, rev=rev,
                                                       instantiate=True, only=set(services) or None))
    _finish_run(result, output)


@click.command("agent")
@agent_options
@click.option("--once", is_flag=True, help="Run one pass (poll, apply, report) and exit.")
@click.option("--interval", type=float, help="Seconds between polls.")
@click.option("--jitter", type=float,
              help="Spread of the polls: each node polls at its own fixed offset in [0, jitter), then every interval.")
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
          --allowed-signers /etc/reconciler/trust/allowed_signers
      reconciler agent --once --config /etc/reconciler/agent.yaml \\
          --metrics-textfile /var/lib/node_exporter/textfile/reconciler.prom

    \b
    Exit codes (the daemon exits 0 when stopped; these are for --once, and for a start refused):
      0  applied, or nothing to do, or waiting (an earlier wave, a barrier, a maintenance window)
      1  failed: a service failed its change (and was put back), the node is halted by a
         failure elsewhere, the remote did not answer, DISK_FULL, another run (or daemon)
         holds the lock
      2  bad input or refused, nothing applied: a problem in the repo at that commit, an
         unsigned or rewound commit, bad settings (a file they name missing: said before
         anything is fetched, and never noted)
    130  interrupted (Ctrl-C) during --once: says which action on which service was under
         way; the next run finishes it
    """
    settings: dict[str, Any] = {"interval": interval, "jitter": jitter, "metrics_textfile": metrics_textfile}
    run_agent(agent_opts, once, settings, output)


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
         history; or bad input: no trust root, not a git repo, an unknown commit, no
         state dir there (without --repo: the agent has not run there)
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
         to, an earlier commit that is not signed by a trusted key, no state dir there
    """
    from reconciler.node import operations  # the change path's: `agent` does not import it

    ctx = node_agent(agent_opts).ctx
    result = operations.rollback(ctx, service, to)
    pin = next((p for p in ctx.ledger.pins() if p.service == service), None) if result.error is None else None
    _finish_run(result, output, f"{result.node}: {service} rolled back to {pin.commit[:12]}, pinned" if pin else "")


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
         commit, an unknown COMMIT, bad settings, no state dir there
    """
    from reconciler.node import operations  # the change path's: `agent` does not import it

    the_agent = node_agent(agent_opts)
    at, images = operations.prepull(the_agent.ctx, fetch=not no_fetch and commit is None, rev=commit)
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
