"""The command line's group and its error handling (``main``): the one place that prints errors
and picks exit codes (see the package's docstring). ``reconciler.entry`` runs a plain `agent`
command line without this module, so without click, and comes here for what it does not
print itself (``handled``).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from reconciler import __version__
from reconciler.cli.common import Failed, emit_json, err
from reconciler.core.errors import ReconcilerError
from reconciler.daemon.logformat import configure

# Each command's module, imported when the command runs (or help lists them all): `agent
# --once` from a timer imports the agent's module, not the review bot's, the importer's or the
# repo commands' (issue 40). Day 2: docs/day2.md; import: reconciler.importers.
COMMANDS = {
    "validate": ("repo", "validate"), "render": ("repo", "render"), "diff": ("repo", "diff"),
    "plan": ("node", "plan"), "apply": ("node", "apply"), "agent": ("node", "agent_command"),
    "verify": ("node", "verify"), "rollback": ("node", "rollback"), "prepull": ("node", "prepull"),
    "status": ("inspect", "status"), "history": ("inspect", "history"), "logs": ("inspect", "logs"),
    "unpin": ("operate", "unpin"), "retry": ("operate", "retry"), "suspend": ("operate", "suspend"),
    "resume": ("operate", "resume"), "note-key": ("operate", "note_key"), "review-post": ("review", "review_post"),
    "merge": ("merge", "merge"), "bundle": ("bundle", "bundle"), "init": ("bootstrap", "init"),
    "check": ("bootstrap", "check"), "node": ("bootstrap", "node_group"), "stop": ("day2", "stop"),
    "start": ("day2", "start"), "poll": ("day2", "poll"), "import": ("imports", "import_group"),
}


class _Commands(click.Group):
    """The group whose commands are imported by name, when asked for (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        import importlib

        module, name = COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(f"reconciler.cli.{module}"), name)
        return command


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
    configure(verbose, log_format)


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
    handled(lambda: cli.main(args, standalone_mode=False), wants_json(args))


def handled(run: Callable[[], object], as_json: bool) -> None:
    """``run`` (the command), its failures said as every command says them: one line, or one
    JSON object, and the exit code. Ctrl-C and a closed stdout as click says them for its
    commands (``entry`` runs `agent` without click)."""
    try:
        try:
            run()
        except (EOFError, KeyboardInterrupt) as exc:
            click.echo(file=sys.stderr)
            raise click.exceptions.Abort() from exc
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            from click.utils import PacifyFlushWrapper

            sys.stdout = PacifyFlushWrapper(sys.stdout)  # type: ignore[assignment,operator]
            sys.stderr = PacifyFlushWrapper(sys.stderr)  # type: ignore[assignment,operator]
            sys.exit(1)
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
