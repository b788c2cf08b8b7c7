"""Notes that counted before, kept across runs in the user's cache: what ``status --fleet
--repo`` spends most on (an ed25519 check per note, some 110 us on a 2-core machine) is done
once per note, not on every run. Only the signature check: every note, kept or not, is still
read by the one bounded decoder (``fleet.notejson``, some 20 us), so no reader ever parses a
note it did not pass, whatever a cache file says or whichever reader wrote it.

Keyed by what decides the verdict: the trust root (``trust/nodes`` as parsed, the notes policy,
this version of the decoder and verifier: ``digest``, the file's name) and, per line, the node,
the object the note is on and the note's blob id. A blob id names the bytes: a note changed by a
byte, copied into another node's ref or onto another commit is another line, never found here,
and is decoded and verified as any note is. Only verdicts that hold for good are kept: none
where a key has a validity window or a certificate vouches (``NoteTrust.timeless``), none under
a ``trust/nodes`` that could not be read.

It lives where the user's state does (``$XDG_CACHE_HOME/reconciler/notes``, by default
``~/.cache``), mode 0600 in a 0700 directory; a file someone else could have written is not
read (as ssh ignores a ``known_hosts`` others can write), nor one under a directory someone else
could swap: each part of the path is opened without following a link, and written through no
link either. A file is read within bounds (``MAX_BYTES``) and never waited on. It is only ever a
shortcut: unreadable, missing or full, every note is checked.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from reconciler import __version__
from reconciler.trust.notesig import NoteTrust

log = logging.getLogger("reconciler.fleet")

# Bumped with any change to what makes a note count (the decoder's bounds, the signature rules):
# verdicts of an older reader are then another file, never read.
FORMAT = 1
MAX_KEPT = 200_000  # lines of one file (~100 bytes each); past it, only this run's notes are kept
MAX_BYTES = 32 * 1024 * 1024  # of one file: a bigger one is not read (nor written)
FILES_KEPT = 4  # trust roots kept (each change of trust/nodes starts a file)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/reconciler/notes`` (a relative one is ignored, as the XDG spec says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "reconciler" / "notes"


def digest(trust: NoteTrust) -> str | None:
    """Names ``trust`` across processes (``NoteTrust.ident`` is a hash() of this process only);
    None for a trust whose verdicts may change with time or whose root could not be read."""
    import hashlib  # here: it loads OpenSSL, which an idle agent does without

    if trust.problem or not trust.timeless:
        return None
    h = hashlib.sha256(f"reconciler-known-notes {FORMAT} {__version__}\n{trust.policy}\n".encode())
    for s in trust.signers:
        h.update(repr((s.principals, s.key_type, s.key_blob, s.namespaces, s.cert_authority)).encode() + b"\n")
    return h.hexdigest()


class KnownNotes:
    """The notes that counted under one trust root: ``holds`` before verifying a note, ``add``
    once one counted, ``save`` at the end of the read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lines = _read(name)
        self._seen: set[str] = set()
        self._new: list[str] = []

    @staticmethod
    def of(trust: NoteTrust) -> KnownNotes | None:
        name = digest(trust)
        return None if name is None else KnownNotes(name)

    def holds(self, node: str, obj: str, blob: str) -> bool:
        line = _line(node, obj, blob)
        if line is not None and line in self._lines:
            self._seen.add(line)
            return True
        return False

    def add(self, node: str, obj: str, blob: str) -> None:
        line = _line(node, obj, blob)
        if line is not None:
            self._seen.add(line)
            self._new.append(line)

    def save(self) -> None:
        """Write the file again when notes were added (whole or not at all for a reader)."""
        if not self._new:
            return
        kept = self._lines | set(self._new)
        data = "".join(f"{line}\n" for line in sorted(kept)).encode()
        if len(kept) > MAX_KEPT or len(data) > MAX_BYTES:  # only this run's, then
            kept = self._seen
            data = "".join(f"{line}\n" for line in sorted(kept)).encode()
            if len(data) > MAX_BYTES:  # (names of hundreds of characters) what the next run would not read
                return
        where = _notes_dir(create=True)
        if where is None:
            return
        try:
            _write(where, self.name, data)
            _prune(where)
        except OSError as exc:  # a shortcut only (a full disk too): the next run checks these notes again
            log.debug("cannot keep the notes verified in %s: %s", cache_dir(), exc)
        finally:
            os.close(where)
        self._lines, self._new = kept, []


_HEX = "0123456789abcdef"


def _line(node: str, obj: str, blob: str) -> str | None:
    """The line naming this note; None for what a line cannot say unambiguously: a node name
    with a space, a line break or a surrogate in it (git's ref names hold none; a name from
    elsewhere might, and would write a line of its choosing), an object that is no git id."""
    if not node or " " in node or not node.isprintable():
        return None
    if len(obj) not in (40, 64) or len(blob) not in (40, 64) or obj.strip(_HEX) or blob.strip(_HEX):
        return None
    return f"{node} {obj} {blob}"


_SAID: set[str] = set()


def _refused(what: str, why: str) -> None:
    if what not in _SAID:  # once a process, not at the read and again at the write
        _SAID.add(what)
        log.warning("%s: not used as the cache of notes verified (%s)", what, why)


def _notes_dir(create: bool) -> int | None:
    """The notes directory, opened (an fd), each part below the cache base opened without
    following a link and checked as ssh checks the path to a ``known_hosts``: the user's own,
    writable by nobody else; the base itself the user's or root's, and writable by others only
    where it is sticky (``/tmp``: nobody renames what is not theirs). None when there is none
    (``create`` False) or it is not safe to use (said once)."""
    try:
        base = cache_dir().parent.parent
    except RuntimeError:  # no home directory to keep it in: every note is checked
        return None
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        if create:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(base, flags)  # the base may be a link (~/.cache on another disk): the user's choice
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            _refused(str(base), "it is someone else's, or others can write to it")
            os.close(fd)
            return None
        for part in ("reconciler", "notes"):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            below = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                _refused(str(cache_dir()), "it is someone else's, or others can write to it")
                os.close(fd)
                return None
        return fd
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _refused(str(cache_dir()), "a link or not a directory")
        return None


def _read(name: str) -> set[str]:
    """The lines of the file ``name``: a regular file of the user's that only they can write,
    not followed if a link, never waited on (a FIFO), read only if at most ``MAX_BYTES``."""
    where = _notes_dir(create=False)
    if where is None:
        return set()
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=where)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refused(str(cache_dir() / name), "a link")
        return set()
    finally:
        os.close(where)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            _refused(str(cache_dir() / name), "not a file of the user's that only they can write")
            return set()
        if st.st_size > MAX_BYTES:
            _refused(str(cache_dir() / name), f"{st.st_size} bytes, more than {MAX_BYTES}")
            return set()
        try:
            text = f.read(MAX_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return set()
    if len(text) > MAX_BYTES:  # grown since fstat: not read as a whole
        return set()
    return set(text.split("\n")) - {""}


_TEMP = ".tmp-"


def _write(where: int, name: str, data: bytes) -> None:
    """``data`` as the file ``name`` in the directory ``where``: written to a new file of our
    own (O_EXCL, not following a link), renamed over the old one (which a link there is too,
    never its target): a reader sees the old file or the new, two runs at once the one or the
    other."""
    tmp = f"{_TEMP}{name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=where)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, name, src_dir_fd=where, dst_dir_fd=where)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=where)
        raise


def _prune(where: int) -> None:
    """Keep the files of the last ``FILES_KEPT`` trust roots (and any run's temp file of the
    last hour); only names of ours, in the directory checked above."""
    import time

    mtimes: dict[str, float] = {}
    for name in os.listdir(where):
        with contextlib.suppress(FileNotFoundError):
            mtimes[name] = os.stat(name, dir_fd=where, follow_symlinks=False).st_mtime
    ours = sorted((n for n in mtimes if len(n) == 64 and not n.strip(_HEX)), key=mtimes.__getitem__, reverse=True)
    stale = [n for n in mtimes if n.startswith(_TEMP) and mtimes[n] < time.time() - 3600]
    for name in ours[FILES_KEPT:] + stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=where)
