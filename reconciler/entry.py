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
import sys

from reconciler.core.errors import NoCABundle


def main() -> None:
    try:
        if no_ca_paths():
            import pygit2  # noqa: F401  # fails here, in its own words (``ca_bundle_error``)
        from reconciler.cli import main as cli_main
    except Exception as exc:  # pygit2.GitError cannot be named: pygit2 is what failed to import
        problem = ca_bundle_error(exc)
        if problem is None:
            raise
        _fail(problem, sys.argv[1:])
    cli_main()


def no_ca_paths() -> bool:
    """Neither a CA file nor a CA directory where OpenSSL looks: then pygit2's import fails, as
    it hands libgit2 what ``ssl`` finds. Commands import pygit2 only where they read commits (an
    idle agent never does, issue 17): without this, a node lacking ca-certificates would run
    until its first change and fail there; with it, every command stops at once, in one line,
    as when the command line imported pygit2 up front. What ``ssl.get_default_verify_paths``
    says, read from ``_ssl``: the ``ssl`` module (and its socket) is about 5 % of a no-op
    ``agent --once``'s imports."""
    import _ssl

    cafile_env, cafile, capath_env, capath = _ssl.get_default_verify_paths()
    return (not os.path.isfile(os.environ.get(cafile_env, cafile))
            and not os.path.isdir(os.environ.get(capath_env, capath)))


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
