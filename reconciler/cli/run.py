"""The `agent` command's run and how a pass is printed, without click: ``entry`` runs a plain
`agent` command line through here (issue 40: a no-op `agent --once` from a timer, and the idle
daemon, import neither click nor the other commands); ``cli.node`` declares the command and
the other passes' commands (``apply``, ``rollback``) print through here too.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reconciler.cli.common import (
    Failed,
    agent_config,
    emit_json,
    err,
    escape,
    flight_text,
    in_flight,
    new_table,
    node_agent,
    out,
    style,
)
from reconciler.core.errors import ReconcilerError

if TYPE_CHECKING:
    from reconciler.agent import Agent
    from reconciler.node.run import RunResult


def run_agent(agent_opts: dict[str, Any], once: bool, settings: dict[str, Any], output: str) -> None:
    """`reconciler agent`: one pass (``once``), printed, or the daemon."""
    from reconciler.daemon.afterpass import Outputs

    the_agent = node_agent(agent_opts, converge=True, **settings)
    if once:
        outputs = Outputs(the_agent)  # a bad notify or metrics setting stops before the pass
        try:
            result = _pass(the_agent, the_agent.reconcile_once)
        except Interrupted:
            raise  # no poll to count: it did not end
        except ReconcilerError as exc:
            outputs(None, exc)  # the metrics say the poll failed; the error is the command's
            raise
        outputs(result, strict=True)
        _finish_run(result, output)

    from reconciler.daemon.loop import run_daemon  # here: `--once` runs no daemon (its http.server)

    if logging.getLogger().level > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
    run_daemon(the_agent, reload=lambda: agent_config(agent_opts, **settings))


class Interrupted(ReconcilerError):
    """Ctrl-C (SIGINT) stopped a pass; the journal keeps what was under way for the next run."""

    reason = "ABORTED"
    exit_code = 130


def _pass(agent: Agent, run: Callable[[], RunResult]) -> RunResult:
    """``run``, a pass; stopped by Ctrl-C, it says what it interrupted (``Interrupted``)."""
    try:
        return run()
    except KeyboardInterrupt:
        try:
            under_way = in_flight(agent.ledger)
        except Exception:  # the ledger unreadable now: the next run still finds its journal
            raise Interrupted("aborted: the next run finishes what this one began") from None
        if not under_way:
            raise Interrupted("aborted: no service was being changed; the next run starts over") from None
        # A step (an upgrade's stop done, a migration running on in its own session) is taken up
        # by the next run: a command still running is waited for, one that died is run again
        # when it may be (a once step that is not idempotent waits for `retry`).
        steps = any(f["action"] == "step" for f in under_way)
        said = ", ".join(flight_text(f) + (" (begun, not ended)" if f["action"] == "step"
                                           else " (not yet seen healthy)") for f in under_way)
        raise Interrupted(f"aborted during {said}: the next run {'takes it up' if steps else 'finishes it'}") from None


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


def _finish_run(result: RunResult, output: str, headline: str = "") -> None:
    """Print a pass and exit with its code; under -o json a failure is one object, the result
    with its ``error``. ``headline``: what an operator's command did, said in place of the head's
    verdict (which such a command does not change)."""
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
    elif result.report is None:  # plain text: rich is most of a no-op `agent --once`'s imports
        print(f"{result.node} @ {short}: unchanged, nothing to do", flush=True)
    else:
        rep = result.report
        if rep.services:
            table = new_table("service", "action", "result", "reason", "detail",
                          title=headline or f"{result.node} @ {short}: {rep.state}")
            for r in rep.services:
                table.add_row(r.service, style(str(r.action)), style(str(r.state)), escape(r.reason),
                              escape(r.detail))
            out.print(table)
        else:
            out.print(headline or f"{result.node} @ {short}: {style(str(rep.state))}")
    if not result.pushed:
        err.print("[yellow]warning[/]: the note could not be pushed; it will be pushed on the next run")
    if result.error is not None:
        raise result.error
    sys.exit(result.exit_code)
