"""Commands that steer this node between passes: ``unpin`` a service, ``retry`` a failed
commit, ``suspend`` and ``resume`` its passes. Each changes the state directory only; the next
pass acts on it.
"""

from __future__ import annotations

from typing import Any

import click

from reconciler.cli.common import (
    Failed,
    agent_config,
    agent_options,
    emit_json,
    escape,
    existing_agent,
    out,
    output_option,
    state_owner,
)
from reconciler.core.errors import BadInput
from reconciler.node import operations


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
      2  bad input: SERVICE is not pinned on this node (NOT_PINNED), bad settings, no state dir
         there (the agent has not run there)
    """
    the_agent = existing_agent(agent_opts)
    if not operations.unpin(the_agent.ctx, service):
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
      2  bad input: bad settings, no state dir there (the agent has not run there)
    """
    failed = operations.retry(existing_agent(agent_opts).ctx)
    if output == "json":
        emit_json({"retry": failed})
        return
    out.print(f"will try {failed[:12]} again on the next run" if failed else "nothing to retry")


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
      0  suspended (or its reason updated); a node that never ran yet (its state dir made
         empty for it) starts out suspended
      2  bad input: bad settings, no state dir there (only the agent makes one)
    """
    the_agent = existing_agent(agent_opts, empty_ok=True)
    already = operations.suspend(the_agent.ctx, reason, operations.invoker())
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
      2  bad input: bad settings, no state dir there (the agent has not run there)
    """
    the_agent = existing_agent(agent_opts)
    lifted = operations.resume(the_agent.ctx)
    if output == "json":
        emit_json({"node": the_agent.cfg.node, "resumed": lifted})
        return
    if lifted is None:
        out.print(f"{the_agent.cfg.node}: not suspended")
        return
    still = the_agent.ledger.suspension()
    out.print(f"{the_agent.cfg.node}: resumed; the next pass applies the branch head"
              + (f" (the repo still suspends the fleet: {escape(still.get('reason', ''))})" if still else ""))


@click.command("note-key")
@agent_options
@output_option
def note_key(agent_opts: dict[str, Any], output: str) -> None:
    """Print this node's line for the repo's trust/nodes: the public half of the key it signs its
    notes with (--note-key, or one it makes in the state dir the first time). Other nodes count
    this node's notes only once a verified commit lists the line.

    With -o json: {"node": NODE, "key": FILE, "line": LINE}.

    \b
    Example:
      reconciler note-key --config /etc/reconciler/agent.yaml >> trust/nodes   # in the repo, then commit

    \b
    Exit codes:
      0  printed
      2  bad input: bad settings, a key that is not an unencrypted OpenSSH private key, or one
         that others can read
    """
    from reconciler.node.report import key_loader
    from reconciler.trust.notesig import public_line

    cfg = agent_config(agent_opts, remote="file:///nowhere")  # it contacts no remote
    if cfg.note_key is None:  # the state dir's key: another node's there would be listed as this one's
        state_owner(cfg.state_dir, cfg.node)
    key = key_loader(cfg.note_key, cfg.state_dir)()
    line = public_line(cfg.node, key)
    if output == "json":
        emit_json({"node": cfg.node, "key": str(key.path), "line": line})
        return
    click.echo(line)
