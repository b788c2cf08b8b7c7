"""The command line: thin. The only place that prints errors and picks exit codes.

Exit codes: 0 ok, 1 failed (a service, the remote, a full disk), 2 bad input or refused
(repo, config, arguments, an untrusted commit). Under ``-o json`` a failure is still one JSON
object on stdout, ``{"error": {"reason", "message", "exit_code"}}`` (with the partial result
around it when there is one), and the one-line error still goes to stderr.

Commands by group: ``repo`` (validate, render, diff), ``node`` (plan, apply, agent, verify,
status, history, rollback, unpin, retry, suspend, resume, prepull), ``fleet`` (status --fleet); ``common`` holds what
they share; ``group`` the group and the errors' handling. This package imports none of them:
``entry`` runs a plain `agent` command line without click (``cli.run``), and ``cli``, ``main``
and the rest are imported from ``group`` when first asked for here.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``from reconciler.cli import cli, main``: the group, imported when first asked for."""
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module("reconciler.cli.group"), name)
