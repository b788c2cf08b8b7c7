"""Results -> a JSON git note on the commit, in ``refs/notes/reconciler/<node>``, pushed.

One writer per notes ref (this node), so a push never races another node. The note is written
locally first and pushed after; a push that fails is retried on the next run, and a ref the
remote has ahead of ours (state dir lost) is merged, keeping our note for a commit both have.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.core import faults
from reconciler.core.errors import ConfigError, RemoteError
from reconciler.fleet import notes
from reconciler.source.refs import NOTES_PREFIX

if TYPE_CHECKING:
    import pygit2

    from reconciler.core.model import Report
    from reconciler.ledger import Ledger
    from reconciler.source.mirror import Source
    from reconciler.trust.notesig import NoteKey

log = logging.getLogger("reconciler.report")


def notes_ref(node: str) -> str:
    return NOTES_PREFIX + node


def key_loader(path: Path | None, state_dir: Path) -> Callable[[], NoteKey]:
    """The node's note key, read when the first note is signed (a poll that finds nothing new
    signs nothing); a ``note_key`` setting that names no file is said at start, before any change."""
    from functools import cache

    if path is not None:
        # said at start, before a pass changes anything: a key found wrong only when the first
        # note is signed would stop a pass after its changes were applied, before they were noted
        if not path.is_file():
            raise ConfigError("note_key: no such file (an SSH private key: ssh-keygen -t ed25519 -N '' -f FILE)",
                              file=str(path))
        from reconciler.trust.notesig import check_private_mode

        check_private_mode(path)

    @cache
    def load() -> NoteKey:
        from reconciler.trust.notesig import NoteKey, default_key_path

        if path is not None:
            return NoteKey.load(path)
        made = default_key_path(state_dir)
        if not made.exists():
            log.warning("no note_key setting: signing this node's notes with a key made in the state dir (%s); "
                        "list it in the repo's trust/nodes (reconciler note-key), and keep one outside the state dir: "
                        "lost with it, this node's history cannot be proven", made)
        return NoteKey.load_or_create(made)

    return load


class Reporter:
    def __init__(self, source: Source, ledger: Ledger, node: str, key: Callable[[], NoteKey] | None = None) -> None:
        self.source = source
        self.key = key  # signs every note and claim (``trust.notesig``); None: unsigned (tests of old agents)
        self.ledger = ledger
        self.node = node
        self.ref = notes_ref(node)
        self.tracking = f"refs/reconciler/remote-notes/{node}"
        self._claim: tuple[str, notes.Claim | None] | None = None  # the claim read at a tip of our ref

    def _local(self) -> str | None:
        return self.source.ref_target(self.ref)

    def _signature(self) -> pygit2.Signature:
        import pygit2  # not at the top: a poll that finds nothing new writes no note (see ``source``)

        return pygit2.Signature(f"reconciler {self.node}", f"{self.node}@reconciler.invalid", int(time.time()), 0)

    def write(self, report: Report) -> None:
        sig = self._signature()
        faults.point("note", report.commit)
        self.source.repo.create_note(self._sealed(report.commit, notes.to_dict(report)), sig, sig, report.commit,
                                     self.ref, True)

    def _sealed(self, obj: str, body: Mapping[str, Any]) -> str:
        """The note's text: its body signed by this node for ``obj`` (same record, same bytes)."""
        if self.key is not None:
            body = self.key().seal(self.node, obj, body)
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    def write_claim(self, claim: notes.Claim) -> None:
        """This node's disruption-slot register (``budget``): a note in its own ref, on the
        claim object; pushed like its reports."""
        sig = self._signature()
        faults.point("claim", f"{claim.state} {claim.ticket}")
        self.source.repo.create_note(self._sealed(notes.CLAIM_OBJECT, claim.to_dict()), sig, sig,
                                     notes.CLAIM_OBJECT, self.ref, True)

    def claim(self) -> notes.Claim | None:
        """This node's claim. Every pass asks (``slots.release``), so it is read once per tip
        of our notes ref: notes are content-addressed, the same tip holds the same claim."""
        tip = self._local()
        if tip is None:
            return None
        if self._claim is None or self._claim[0] != tip:
            text = self.source.note(self.ref, notes.CLAIM_OBJECT)
            data = notes.decode(text) if text is not None else None
            if data is not None and self.key is not None and not self.key().signed(self.node, notes.CLAIM_OBJECT, data):
                # our ref came back from the remote after the state dir was lost: a claim we did
                # not sign is not ours (a server's, a mirror's), and holds no slot
                data = None
            self._claim = (tip, notes.Claim.parse(self.node, data) if data is not None else None)
        return self._claim[1]

    def read(self, commit: str, ref: str | None = None) -> dict[str, Any] | None:
        try:
            note = self.source.repo.lookup_note(commit, ref or self.ref)
        except KeyError:
            return None
        return notes.decode(note.message)

    def pending(self) -> bool:
        local = self._local()
        return local is not None and local != self.ledger.notes_pushed().tip

    def _fetch_remote_ref(self) -> bool:
        """Bring the remote's copy of our notes ref; False if the remote has none. A fetch of the
        one ref (protocol v2 sends its name as a ref prefix), not an ls-remote of every ref."""
        try:
            self.source.run("fetch", "--no-tags", self.write_url, f"+{self.ref}:{self.tracking}",
                            what="notes fetch from", url=self.write_url)
        except RemoteError as exc:
            if "couldn't find remote ref" in str(exc):
                return False
            raise
        return True

    def recover(self) -> None:
        """After the state dir is lost, start from the notes this node already pushed."""
        if self._local() is not None:
            return
        try:
            if self._fetch_remote_ref():
                self.source.run("update-ref", self.ref, self.tracking, what="notes restore in")
                self.ledger.set_notes_pushed(self._local())
        except RemoteError as exc:
            log.warning("could not recover notes from the remote yet: %s", exc)

    def push(self) -> bool:
        """Push our notes ref if it moved; False (and retried next run) when the remote fails."""
        if not self.pending():
            return True
        if self.source.write_url is None:  # an air-gapped site: kept until a write remote is set
            return False
        try:
            try:
                self._push()
            except RemoteError:
                # Rejected if the remote's ref has notes we lack (pushed before our state dir
                # was lost); merge them in, ours winning for a commit both have, and retry.
                if not self._fetch_remote_ref() or self._contains(self.tracking):
                    raise
                self.source.run(
                    "notes", f"--ref={self.ref}", "merge", "-s", "ours", "-q", self.tracking,
                    what="notes merge for",
                )
                self._push()
        except RemoteError as exc:
            log.warning("note not pushed, will retry on the next run: %s", exc)
            return False
        self.ledger.set_notes_pushed(self._local(), when=time.time())
        return True

    def _contains(self, ref: str) -> bool:
        """Does our notes ref already include ``ref``'s history?"""
        repo = self.source.repo
        local, other = self._local(), repo.references[ref].target
        return local is not None and (str(other) == local or repo.descendant_of(local, other))

    def _push(self) -> None:
        faults.point("push", self.ref)
        self.source.run("push", "--porcelain", self.write_url, f"{self.ref}:{self.ref}", what="note push to",
                        url=self.write_url)

    @property
    def write_url(self) -> str:
        url = self.source.write_url
        if url is None:
            raise RemoteError("no write remote in the agent config: notes are kept here until one is set",
                              reason="NO_WRITE_REMOTE")
        return url
