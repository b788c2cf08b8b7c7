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

from reconciler import __version__
from reconciler.cli.bootstrap import check, init, node_group
from reconciler.cli.bundle import bundle
from reconciler.cli.common import Failed, emit_json, err
from reconciler.cli.day2 import poll, start, stop
from reconciler.cli.imports import import_group
from reconciler.cli.inspect import history, logs, status
from reconciler.cli.merge import merge
from reconciler.cli.node import agent_command, apply, plan, prepull, rollback, verify
from reconciler.cli.operate import note_key, resume, retry, suspend, unpin
from reconciler.cli.repo import diff, render, validate
from reconciler.cli.review import review_post
from reconciler.core.errors import ReconcilerError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reconciler")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("--log-format", type=click.Choice(["auto", "text", "journal", "json"]), default="auto",
              envvar="RECONCILER_LOG_FORMAT", show_default=True,
              help="The agent's own log on stderr: text (with timestamps), journal (no timestamps, syslog "
                   "priority prefixes: journald adds the time), json (one object a line, for log shippers). "
                   "auto: journal when stderr is the journal (under systemd), else text.")
def cli(verbose: int, log_format: str) -> None:
    """Pull-based GitOps agent: every node converges on the reviewed deployment repo.

    \b
    Example:
      reconciler validate --repo examples/repo
      reconciler agent --once --node ctl1 --remote file:///srv/cloud.git --state-dir /tmp/ctl1 \\
          --allowed-signers /etc/reconciler/trust/allowed_signers

    \b
    Exit codes (each command's --help says what they mean for it):
      0  ok
      1  failed: a service, the remote, a full disk, a stopped rollout
      2  bad input or refused: repo, settings, arguments, an untrusted commit
    """
    level = logging.WARNING - 10 * verbose
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])


class _JournalFormatter(logging.Formatter):
    """``<priority>message``: journald reads the syslog priority from the prefix and stamps
    the time itself (sd-daemon(3))."""

    PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record).replace("\n", " | ")  # one journal entry per record
        return f"<{self.PRIORITY.get(record.levelno, 6)}>{text}"


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import UTC, datetime

        out = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, sort_keys=True)


def _formatter(choice: str) -> logging.Formatter:
    if choice == "auto":
        choice = "journal" if _stderr_is_journal() else "text"
    if choice == "journal":
        return _JournalFormatter("%(levelname)s %(message)s")
    if choice == "json":
        return _JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(message)s")


def _stderr_is_journal() -> bool:
    """systemd sets $JOURNAL_STREAM to the device:inode of the journal's socket; stderr is the
    journal when they match (not merely when a child inherited the variable)."""
    import os

    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


for command in (validate, render, diff, plan, apply, agent_command, verify, status, history, logs, rollback, unpin,
                retry, suspend, resume, prepull, review_post, merge, bundle, note_key, init, check, node_group):
    cli.add_command(command)
for command in (stop, start, poll):  # day 2 (docs/day2.md)
    cli.add_command(command)
cli.add_command(import_group)  # import kolla-ansible (reconciler.importers)


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
    for line in message.splitlines() or [""]:  # several mistakes (of a settings file): one line each
        click.echo(f"error: {line} [{reason}]", err=True)
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
