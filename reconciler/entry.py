"""The ``reconciler`` command's entry point (console script and ``python -m reconciler``).

It imports the command line inside a guard: pygit2 loads the system's CA certificates when it
is first imported, and on a node without them (a minimal Debian without ``ca-certificates``)
that import raises before the command line's own error handling exists. The command line
imports pygit2 only where it reads commits, so where no CA paths exist pygit2 is imported
here, to fail at the start of every command. Here that becomes the one-line error every other
bad input gets; anything else propagates unchanged.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from reconciler.core.errors import NoCABundle


def main() -> None:
    plain = plain_agent(sys.argv[1:])
    # The daemon, run plain or through click (`reconciler -v agent`, which must not load OpenSSL
    # either): a word "agent" without "--once" (a value spelt so costs only the child's 17 ms).
    args = sys.argv[1:]
    daemon = not plain.once if plain is not None else "agent" in args and "--once" not in args
    try:
        if no_ca_paths(daemon=daemon):
            import pygit2  # noqa: F401  # fails here, in its own words (``ca_bundle_error``)
        if plain is None:
            from reconciler.cli import main as cli_main
        else:
            if plain.once:
                # A no-op proven by what the last one left (``node.quiet``): no pass, and none
                # of its imports; any doubt, and the full pass below runs.
                from reconciler.node.quiet import answer

                try:
                    code = answer(plain.agent_opts, plain.settings, plain.output)
                except KeyboardInterrupt:
                    _aborted_before_the_pass(plain.output)
                if code is not None:
                    sys.exit(code)
            from reconciler.cli.run import run_agent
    except Exception as exc:  # pygit2.GitError cannot be named: pygit2 is what failed to import
        problem = ca_bundle_error(exc)
        if problem is None:
            raise
        _fail(problem, sys.argv[1:])
    if plain is None:
        cli_main()
        return
    from reconciler.daemon.logformat import configure

    configure(0, plain.log_format)  # what the group's own options do: none were given
    if plain.once:
        from reconciler.node.quietmark import watch_logs

        watch_logs()  # a pass that warns of anything leaves no marker: the next one says it too
    try:
        run_agent(plain.agent_opts, plain.once, plain.settings, plain.output)
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        from reconciler.cli.group import handled  # a failure is said as every command says it

        failure = exc
        handled(lambda: _reraise(failure), plain.output == "json")


def _reraise(exc: BaseException) -> None:
    raise exc


def _aborted_before_the_pass(output: str) -> NoReturn:
    """Ctrl-C while the no-op check ran (its poll of the remote, say): it changes nothing, so
    what a pass stopped before changing anything says, and its exit code (130)."""
    from reconciler.cli.group import handled
    from reconciler.cli.run import Interrupted

    failure = Interrupted("aborted: no service was being changed; the next run starts over")
    handled(lambda: _reraise(failure), output == "json")
    raise AssertionError("handled exits")  # pragma: no cover


class PlainAgent(NamedTuple):
    """A plain `reconciler agent` command line, as click would have read it. (A named tuple,
    frozen as a dataclass is: ``dataclasses`` and the ``inspect`` it imports were a sixth of a
    no-op `agent --once` answered by ``node.quiet``, issue 40.)"""

    agent_opts: dict[str, Any]
    once: bool
    settings: dict[str, Any]
    output: str
    log_format: str


# `agent`'s options as `reconciler agent --help` lists them (cli.common.agent_options, cli.node):
# option -> its key. A command line made of these alone, each with a plain value (the systemd
# unit's, a timer's), runs without click and the other commands (issue 40: 0.03 s and 3.5 MB);
# any other word (help, a group option, a mistake) goes through click, which says what is wrong.
_VALUES = {"--config": "config_file", "--node": "node", "--remote": "remote", "--branch": "branch",
           "--state-dir": "state_dir", "--allowed-signers": "trust_allowed_signers", "--gpg-home": "trust_gpg_home",
           "--revoked": "trust_revoked", "--trust-policy": "trust_policy", "--age-identity": "secrets_age_identity",
           "--note-key": "note_key", "--interval": "interval", "--jitter": "jitter",
           "--metrics-textfile": "metrics_textfile", "--output": "output", "-o": "output"}
_PATHS = frozenset({"config_file", "state_dir", "trust_allowed_signers", "trust_gpg_home", "trust_revoked",
                    "secrets_age_identity", "note_key", "metrics_textfile"})
_CHOICES = {"trust_policy": ("every-commit", "first-parent", "head"), "output": ("human", "json")}
_SETTINGS = ("interval", "jitter", "metrics_textfile")
_NUMBER = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")


def plain_agent(args: list[str]) -> PlainAgent | None:
    """``args`` as a plain `agent` command line, or None: click reads it (see ``_VALUES``)."""
    log_format = os.environ.get("RECONCILER_LOG_FORMAT") or "auto"
    if (not args or args[0] != "agent" or log_format not in ("auto", "text", "journal", "json")
            or any(k.startswith("_RECONCILER_COMPLETE") for k in os.environ)):
        return None
    given: dict[str, str] = {}
    once = False
    words = iter(args[1:])
    for word in words:
        if word == "--once":
            once = True
            continue
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        key = _VALUES.get(name)
        value = value if eq else next(words, "")
        if key is None or not value or value.startswith("-") or (key in _CHOICES and value not in _CHOICES[key]) or (
                key in ("interval", "jitter") and not _NUMBER.fullmatch(value)):
            return None
        given[key] = value
    given.setdefault("config_file", os.environ.get("RECONCILER_CONFIG") or "")
    values: dict[str, Any] = {k: (Path(v) if k in _PATHS else float(v) if k in ("interval", "jitter") else v)
                              for k, v in given.items() if v}
    return PlainAgent({k: values.get(k) for k in _VALUES.values() if k not in (*_SETTINGS, "output")}, once,
                      {k: values.get(k) for k in _SETTINGS}, values.get("output", "human"), log_format)


def no_ca_paths(daemon: bool = False) -> bool:
    """Neither a CA file nor a CA directory where OpenSSL looks: then pygit2's import fails, as
    it hands libgit2 what ``ssl`` finds. Commands import pygit2 only where they read commits (an
    idle agent never does, issue 17): without this, a node lacking ca-certificates would run
    until its first change and fail there; with it, every command stops at once, in one line,
    as when the command line imported pygit2 up front. What ``ssl.get_default_verify_paths``
    says, read from ``_ssl``: the ``ssl`` module (and its socket) is about 5 % of a no-op
    ``agent --once``'s imports.

    ``daemon``: asked by the daemon (`reconciler agent` without ``--once``), which runs for
    months: ``_ssl`` loads OpenSSL's libssl and libcrypto, about 4 MB of its RSS that an idle
    daemon has no other use for (issue 40), so the paths are read by a child interpreter (about
    17 ms of CPU, once a start). A daemon that re-executed itself to give back memory
    (``daemon.shed``) is checked again: its hand-over variable can be set by anyone writing the
    unit's environment, and the certificates may have gone since."""
    paths = _verify_paths_in_child() if daemon else None
    if paths is None:
        import _ssl

        paths = _ssl.get_default_verify_paths()
    cafile_env, cafile, capath_env, capath = paths
    return (not os.path.isfile(os.environ.get(cafile_env, cafile))
            and not os.path.isdir(os.environ.get(capath_env, capath)))


def _verify_paths_in_child() -> tuple[str, str, str, str] | None:
    """``_ssl.get_default_verify_paths()`` as a child interpreter says it (isolated, without
    ``site``: the paths are compiled into OpenSSL); None if it cannot (then asked in process)."""
    import subprocess

    code = "import _ssl; print('\\0'.join(_ssl.get_default_verify_paths()))"
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):  # the last: a wrapper's bytes, not paths
        return None
    said = done.stdout.rstrip("\n").split("\0")
    if done.returncode != 0 or len(said) != 4:
        return None
    return said[0], said[1], said[2], said[3]


def ca_bundle_error(exc: BaseException) -> NoCABundle | None:
    """``exc`` as the missing CA bundle it stands for, or None when it is something else."""
    import ssl

    if type(exc).__name__ != "GitError" or "certificates" not in str(exc):
        return None
    paths = ssl.get_default_verify_paths()
    cafile = os.environ.get(paths.openssl_cafile_env) or paths.openssl_cafile
    capath = os.environ.get(paths.openssl_capath_env) or paths.openssl_capath
    return NoCABundle(f"no usable CA certificates in {cafile} or {capath}/ (pygit2: {exc}): install the "
                      "ca-certificates package (apt-get install ca-certificates), or set SSL_CERT_FILE to a CA bundle")


def _fail(error: NoCABundle, args: list[str]) -> None:
    # The command line's own _fail cannot be imported (it is what failed): the same output by hand,
    # the JSON object too when the words ask for it.
    if any(a in ("-ojson", "--output=json") for a in args) or any(
            a in ("-o", "--output") and b == "json" for a, b in zip(args, args[1:], strict=False)):
        print(json.dumps({"error": {"exit_code": error.exit_code, "message": str(error), "reason": error.reason}},
                         indent=2, sort_keys=True))
    print(f"error: {error} [{error.reason}]", file=sys.stderr)
    sys.exit(error.exit_code)
