"""The command line: thin. The only place that prints errors and picks exit codes.

Exit codes: 0 ok, 1 failed (a service, the remote, a full disk), 2 bad input or refused
(repo, config, arguments, an untrusted commit). Under ``-o json`` a failure is still one JSON
object on stdout, ``{"error": {"reason", "message", "exit_code"}}`` (with the partial result
around it when there is one), and the one-line error still goes to stderr.

Commands by group: ``repo`` (validate, render, diff), ``node`` (plan, apply, agent, verify,
status, history, rollback, unpin, retry, suspend, resume, prepull), ``fleet`` (status --fleet); ``common`` holds what
they share.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from .. import __version__
from ..errors import ReconcilerError
from .common import Failed, emit_json, err
from .node import (
    agent_command,
    apply,
    history,
    logs,
    plan,
    prepull,
    resume,
    retry,
    rollback,
    status,
    suspend,
    unpin,
    verify,
)
from .repo import diff, render, validate
from .review import review_post


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reconciler")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Pull-based GitOps agent: every node converges on the reviewed deployment repo.

    \b
    Example:
      reconciler validate --repo examples/repo
      reconciler agent --once --node ctl1 --remote file:///srv/cloud.git --state-dir /tmp/ctl1 \\
          --allowed-signers /etc/reconciler/allowed_signers

    \b
    Exit codes (each command's --help says what they mean for it):
      0  ok
      1  failed: a service, the remote, a full disk, a stopped rollout
      2  bad input or refused: repo, settings, arguments, an untrusted commit
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")


for command in (validate, render, diff, plan, apply, agent_command, verify, status, history, logs, rollback, unpin,
                retry, suspend, resume, prepull, review_post):
    cli.add_command(command)


def wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for ``-o json``, read from its words: a usage error stops
    click before it has parsed the option, and the error must still come as JSON."""
    choice = None
    words = iter(args)
    for word in words:
        if word == "--":
            break
        if word in ("-o", "--output"):
            choice = next(words, None)
        elif word.startswith("--output="):
            choice = word.removeprefix("--output=")
        elif word.startswith("-o") and not word.startswith("--"):
            choice = word.removeprefix("-o")
    return choice == "json"


def _fail(reason: str, message: str, exit_code: int, as_json: bool, partial: dict[str, Any] | None = None) -> NoReturn:
    if as_json:
        emit_json({**(partial or {}), "error": {"reason": reason, "message": message, "exit_code": exit_code}})
    click.echo(f"error: {message} [{reason}]", err=True)
    sys.exit(exit_code)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    try:
        cli.main(args, standalone_mode=False)
    except click.exceptions.Abort:
        if as_json:
            _fail("ABORTED", "aborted", 130, as_json)
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        if as_json:
            reason = "USAGE" if isinstance(exc, click.UsageError) else "ERROR"
            _fail(reason, exc.format_message(), exc.exit_code, as_json)
        exc.show()
        sys.exit(exc.exit_code)
    except Failed as exc:
        _fail(exc.error.reason, str(exc.error), exc.error.exit_code, as_json, exc.partial)
    except ReconcilerError as exc:
        _fail(exc.reason, str(exc), exc.exit_code, as_json)
