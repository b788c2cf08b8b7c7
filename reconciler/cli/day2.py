"""Day-2 commands on a node: ``stop`` its services and keep them stopped, ``start`` them again,
``poll`` now (docs/day2.md). ``diff --local`` is with ``diff`` (``cli.repo``)."""

from __future__ import annotations

from typing import Any

import click

from reconciler.cli.common import (
    Failed,
    agent_options,
    emit_json,
    escape,
    existing_agent,
    local_config,
    out,
    output_option,
)
from reconciler.core.errors import ApplyError
from reconciler.core.model import ResultState
from reconciler.node import operations


@click.command()
@agent_options
@click.argument("services", nargs=-1)
@output_option
def stop(agent_opts: dict[str, Any], services: tuple[str, ...], output: str) -> None:
    """Stop this node's services (all, or the SERVICES named, with what runs and depends on them,
    as `systemctl stop` does), dependents first, and keep them stopped: the agent's passes leave
    them so until `reconciler start`. The node's note says so.

    With -o json: {"node": NODE, "held": [SERVICE...], "dependents": [SERVICE...],
    "stopped": [{"service", "state", "detail"}]}.

    \b
    Example:
      reconciler stop --config /etc/reconciler/agent.yaml            # every service
      reconciler stop lb --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  stopped (or not running), and held stopped
      1  a stop failed (the hold stays: the next pass tries again); another run holds the lock
      2  bad input: SERVICE does not run here (UNKNOWN_SERVICE), bad settings, no state dir
    """
    from reconciler.node.stopping import stop as stop_services

    the_agent = existing_agent(agent_opts)
    stopped = stop_services(the_agent.ctx, list(services), operations.invoker())
    held, results = stopped.held, stopped.results
    done = [{"service": r.service, "state": str(r.state), "detail": r.detail} for r in results]
    failed = [r for r in results if r.state is ResultState.FAILED]
    partial = {"node": the_agent.cfg.node, "held": held, "dependents": stopped.dependents, "stopped": done}
    if failed:
        error = ApplyError(f"stop of {failed[0].service} failed: {failed[0].detail}")
        if output == "json":
            raise Failed(error, partial)
        raise error
    if output == "json":
        emit_json(partial)
        return
    for r in results:
        out.print(f"{escape(r.service)}: stopped")
    if stopped.dependents:
        out.print(f"{escape(', '.join(stopped.dependents))}: held stopped too (they depend on what was named)")
    out.print(f"{the_agent.cfg.node}: " + (f"{escape(', '.join(held))} held stopped until `reconciler start`"
                                            if held else "nothing runs"))


@click.command()
@agent_options
@click.argument("services", nargs=-1)
@output_option
def start(agent_opts: dict[str, Any], services: tuple[str, ...], output: str) -> None:
    """Lift `reconciler stop` (for all, or the SERVICES named): the next pass starts them.

    With -o json: {"node": NODE, "started": [SERVICE...]} (those the hold was lifted from).

    \b
    Example:
      reconciler start --config /etc/reconciler/agent.yaml && reconciler poll --config ...

    \b
    Exit codes:
      0  lifted, or nothing was held stopped
      2  bad input: bad settings, no state dir there
    """
    from reconciler.node.stopping import start as start_services

    the_agent = existing_agent(agent_opts)
    lifted = start_services(the_agent.ctx, list(services), operations.invoker())
    if output == "json":
        emit_json({"node": the_agent.cfg.node, "started": lifted})
        return
    out.print(f"{the_agent.cfg.node}: " + (f"{escape(', '.join(lifted))} started by the next pass" if lifted
                                            else "nothing was held stopped"))


@click.command()
@agent_options
@output_option
def poll(agent_opts: dict[str, Any], output: str) -> None:
    """Make this node's running daemon (`reconciler agent`) poll now, not at its next interval.

    With -o json: {"node": NODE, "pid": PID}.

    \b
    Example:
      reconciler poll --config /etc/reconciler/agent.yaml

    \b
    Exit codes:
      0  the daemon was told (it polls within a second, or after the pass under way)
      2  no daemon runs on this state dir (NO_DAEMON), bad settings
    """
    from reconciler.daemon.wake import poll_now

    cfg = local_config(agent_opts)
    pid = poll_now(cfg.state_dir)
    if output == "json":
        emit_json({"node": cfg.node, "pid": pid})
        return
    out.print(f"{cfg.node}: the daemon (pid {pid}) polls now")
