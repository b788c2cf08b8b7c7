"""The project's exception tree.

The class decides what happens next; the reason code lands in the note. ``temporary`` splits
them as Flux's reconcilers do: permanent errors wait for the input to change (a new commit, a
fixed config), temporary ones are retried with backoff.

- ``BadInput``: the deployment repo, the agent config or a command line is wrong. Permanent
  for this commit: nothing is applied, exit code 2, wait for a new commit.
- ``RemoteError``: the git remote did not answer or refused a push. Temporary: retry on the
  next poll, exit code 1. ``CorruptMirror``: the node's own copy is damaged; re-clone it.
- ``ApplyError``: a driver could not bring a service to its desired state. Exit code 1.
- ``Busy``: another run holds the node's lock.
"""

from __future__ import annotations

from typing import Self


class ReconcilerError(Exception):
    """Base of every error the command line turns into a one-line message."""

    reason = "ERROR"
    exit_code = 1
    temporary = False  # True: the same input may work later (network, lock, disk space): retry, back off

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def message(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[object, ...]:
        # Crosses a process boundary whole (``review``'s workers): the message as it reads, and
        # the attributes (file, line, reason) that the keyword-only constructors would not get back.
        return _restore, (type(self), self.args, dict(self.__dict__))


def _restore(cls: type[ReconcilerError], args: tuple[object, ...], state: dict[str, object]) -> ReconcilerError:
    exc = Exception.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class BadInput(ReconcilerError):
    """User input that cannot be used as it is; says what and where."""

    reason = "BAD_INPUT"
    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        super().__init__(f"{where}{message}", reason=reason)

    def in_commit(self, commit: str) -> Self:
        """This error, placed in a commit as git names a file in one (``REV:FILE:LINE``): a
        command that reads two commits must say which of them is broken."""
        short = commit[:12] if len(commit) == 40 else commit
        self.args = (f"{short}:{self}" if self.file else f"{short}: {self}", *self.args[1:])
        self.file = f"{short}:{self.file}" if self.file else short
        return self


class InvalidRepo(BadInput):
    reason = "INVALID_REPO"


class RepoLimit(InvalidRepo):
    """A repo file larger than ``Limits.file_bytes``: not read at all."""

    reason = "REPO_LIMIT"


class YamlLimit(RepoLimit):
    """A YAML document with more values than ``Limits.yaml_nodes`` once its aliases expand."""

    reason = "YAML_LIMIT"


class RepoSymlink(InvalidRepo):
    """A symlink where the loader reads: it would put bytes from outside the reviewed tree
    (``/etc/passwd``, another checkout) into a node's files or a review comment."""

    reason = "REPO_SYMLINK"


class RenderError(BadInput):
    reason = "RENDER_FAILED"


class RenderLimit(RenderError):
    """A template ran past a bound of ``Limits``: output size, time, value size, include depth."""

    reason = "RENDER_LIMIT"


class UnknownNode(BadInput):
    reason = "UNKNOWN_NODE"


class ConfigError(BadInput):
    reason = "BAD_CONFIG"


class RemoteError(ReconcilerError):
    reason = "REMOTE_UNREACHABLE"
    exit_code = 1
    temporary = True


class CorruptMirror(RemoteError):
    """The node's mirror holds an object that cannot be read (damaged or missing). The mirror
    is a cache: ``Source.repair()`` re-clones it, and the run goes once more."""

    reason = "MIRROR_CORRUPT"


class ApplyError(ReconcilerError):
    """``output``: what the service printed; kept in the node's local history, never in a note
    (a program may print its secrets)."""

    reason = "APPLY_FAILED"
    exit_code = 1

    def __init__(self, message: str, *, reason: str | None = None, output: str = "") -> None:
        super().__init__(message, reason=reason)
        self.output = output


class Busy(ReconcilerError):
    reason = "LOCKED"
    exit_code = 1
    temporary = True


class StateMissing(BadInput):
    """A read-only command pointed at a state dir that holds no node."""

    reason = "NO_STATE"


class DiskFull(ReconcilerError):
    """The state dir's filesystem is full: nothing more is changed until there is room."""

    reason = "DISK_FULL"
    exit_code = 1
    temporary = True

    @classmethod
    def at(cls, path: object, message: str = "") -> DiskFull:
        import shutil

        try:
            left = shutil.disk_usage(str(path)).free
            # Under a MiB, in KiB and bytes: "0.0 MiB free" would not tell 16 KiB from nothing.
            free = f"{left / 2**20:.1f} MiB free" if left >= 2**20 else f"{left // 1024} KiB free ({left} bytes)"
        except OSError:
            free = "free space unknown"
        return cls(f"{message or 'no space left'} ({path}: {free})")


class NoCABundle(BadInput):
    """The node has no usable CA certificates: pygit2 loads them when it is imported and fails
    without them (a minimal Debian without ``ca-certificates``), before any command can run."""

    reason = "NO_CA_BUNDLE"
